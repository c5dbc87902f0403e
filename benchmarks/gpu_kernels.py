"""Which attention kernel each call site takes under the execution policy: make gpu-check's first
figure (benchmarks/gpu_check.py).

    python -m benchmarks.gpu_kernels --device cuda                  # model=base, bf16 on CUDA
    python -m benchmarks.gpu_kernels --device cpu --model tiny      # its code path, on the CPU

Every call of F.scaled_dot_product_attention in one training micro-batch (forward and backward)
and in one beam search is recorded with the kernel SDPA chooses for it
(torch._fused_sdp_choice: the same choice, under the policy's precision and kernel order), by
call site: the encoder's self-attention, the decoder's self-attention, the cross-attention. A
micro-batch of one source length (trainer.source_lengths=equal, the policy's on CUDA) and one of
similar lengths (padded and masked), and a beam search in a batch of one source length
(decode.source_lengths=auto on CUDA) and of similar lengths. Flash takes no mask: a masked call runs
the memory-efficient kernel on CUDA. On the CPU a decoding step's one query row takes no SDPA
(model.attend_few_queries), so it has no decoding line for the decoder's self-attention.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend

from benchmarks.measure import report_header
from transformer_mt.config import (
    DecodeConfig,
    SourceLengths,
    TrainerConfig,
    compose_job,
)
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decode.search import fixed_shape_beam_search
from transformer_mt.device import set_up_process
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import Transformer
from transformer_mt.train.loss import TrainingLoss

SITES = ("encoder self-attention", "decoder self-attention", "cross-attention")
KERNELS = {
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.EFFICIENT_ATTENTION: "efficient",
    SDPBackend.CUDNN_ATTENTION: "cudnn",
    SDPBackend.MATH: "math",
}


def call_sites(model: Transformer) -> dict[nn.Module, str]:
    """Each attention module of the model and the call site it is."""
    sites: dict[nn.Module, str] = {layer.self_attn: SITES[0] for layer in model.encoder}
    for layer in model.decoder:
        sites[layer.self_attn], sites[layer.cross_attn] = SITES[1], SITES[2]
    return sites


@contextlib.contextmanager
def recorded_kernels(model: Transformer) -> Iterator[dict[str, set[str]]]:
    """Within it, every SDPA call of `model` is recorded: call site -> the kernels SDPA chose."""
    chosen: dict[str, set[str]] = defaultdict(set)
    current: list[str] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def choosing(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        choice = SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal))
        chosen[current[-1] if current else "elsewhere"].add(KERNELS.get(choice, choice.name))
        return sdpa(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs
        )

    def leaving(*_) -> None:  # a forward hook's return value would replace the output
        current.pop()

    hooks = []
    for module, site in call_sites(model).items():
        hooks.append(module.register_forward_pre_hook(lambda *_, site=site: current.append(site)))
        hooks.append(module.register_forward_hook(leaving))
    torch.nn.functional.scaled_dot_product_attention = choosing
    try:
        yield chosen
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        for hook in hooks:
            hook.remove()


def lengths_batch(rng: np.random.Generator, rows: int, source: int | None, vocab: int):
    """(src, tgt_in, tgt_out, src_padded): `rows` pairs with sources of length `source` (None:
    of 60-100% of 32) and targets of 60-100% of 36, right-padded."""

    def side(longest: int, exact: bool) -> list[np.ndarray]:
        sizes = [longest] * rows if exact else rng.integers(longest * 6 // 10, longest + 1, rows)
        return [rng.integers(4, vocab, int(n)) for n in sizes]

    src, tgt = side(source or 32, source is not None), side(36, False)
    return (
        pad_sequences(src, PAD_ID, suffix=EOS_ID),
        pad_sequences(tgt, PAD_ID, prefix=BOS_ID),
        pad_sequences(tgt, PAD_ID, suffix=EOS_ID),
        source is None,
    )


def training_kernels(model: Transformer, policy: ExecutionPolicy, equal: bool, rows: int):
    """Call site -> kernels of one micro-batch's forward and backward under `policy`, of one
    source length or of similar lengths (padded, masked)."""
    chunks = policy.eager().loss_chunks(model.embed.num_embeddings)  # the layers as they are
    loss_of = TrainingLoss(model.train(), chunks, epsilon=0.1, pad_id=PAD_ID)
    rng = np.random.default_rng(1)
    src, tgt_in, tgt_out, padded = lengths_batch(rng, rows, 24 if equal else None, 1000)
    device = policy.device
    with recorded_kernels(model) as chosen, policy.forward():
        sums = loss_of(src.to(device), tgt_in.to(device), tgt_out.to(device), padded)
    sums.loss.backward()
    model.zero_grad(set_to_none=True)
    return chosen


def decoding_kernels(model: Transformer, decode: DecodeConfig, device: torch.device, rows: int):
    """Call site -> kernels of a beam search of `rows` sources (fixed shape, as on CUDA) under
    the decoding policy of `decode`: of one source length or of similar lengths."""
    policy = ExecutionPolicy.for_decoding(decode, device)
    equal = policy.equal_source_lengths
    src, *_, padded = lengths_batch(np.random.default_rng(2), rows, 24 if equal else None, 1000)
    with recorded_kernels(model.eval()) as chosen, policy.forward():
        fixed_shape_beam_search(
            model, src.to(device), beam_size=4, bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=0.0,
            max_len_b=8, src_padded=padded,
        )  # fmt: skip
    return chosen


def described(chosen: dict[str, set[str]]) -> str:
    return "; ".join(f"{site} {'/'.join(sorted(chosen[site])) or 'no SDPA call'}" for site in SITES)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="base", help="the preset whose shapes are probed")
    parser.add_argument("--rows", type=int, default=64, help="sentences a batch")
    args = parser.parse_args()
    device = set_up_process(args.device)
    print(*report_header("the attention kernel of each call site", device), sep="\n")
    torch.manual_seed(1)
    cfg = compose_job("train", [f"model={args.model}", "run_dir=unused"]).model
    model = Transformer(cfg, vocab_size=1000, pad_id=PAD_ID).to(device)
    for lengths in (SourceLengths.auto, SourceLengths.equal, SourceLengths.similar):
        policy = ExecutionPolicy.for_training(TrainerConfig(source_lengths=lengths), device)
        equal = policy.equal_source_lengths
        name = f"training, trainer.source_lengths={lengths.value}"
        kind = "one source length a batch" if equal else "similar lengths, padded and masked"
        chosen = training_kernels(model, policy, equal, args.rows)
        print(f"{name} ({kind}; {policy.describe()}):\n  {described(chosen)}", flush=True)
    for lengths in (SourceLengths.auto, SourceLengths.similar):
        decode = dataclasses.replace(DecodeConfig(), source_lengths=lengths)
        chosen = decoding_kernels(model, decode, device, args.rows // 4)
        print(f"beam search, decode.source_lengths={lengths.value}:\n  {described(chosen)}")


if __name__ == "__main__":
    main()
