"""Decoding on a GPU, the CUDA counterparts of tests/test_model.py's cache parity and of
tests/decode: the KV cache under bf16 autocast against the full forward pass, beam search on
the GPU against the same search on the CPU (today's, and the fixed-shape one that CUDA runs by
default against today's), and decode.precision: auto is bf16 on CUDA, fp32 is
TF32, and auto's BLEU is near fp32's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor
from toy_runs import learned_toy_run, split_bleu

from transformer_mt.config import DecodeConfig, ModelConfig, Precision
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_mt.decode.constraints import Terms
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.search import NO_TOKEN, beam_search, fixed_shape_beam_search
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import DecoderCache, EncoderOutput, Transformer

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def random_model(cfg: ModelConfig, vocab: int, seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, vocab_size=vocab, pad_id=PAD_ID).eval()


def random_sources(lengths: list[int], vocab: int, seed: int) -> Tensor:
    """Right-padded sources ending with EOS: (B, longest + 1)."""
    rng = np.random.default_rng(seed)
    return pad_sequences([rng.integers(4, vocab, n) for n in lengths], PAD_ID, suffix=EOS_ID)


def decode_step_by_step(model: Transformer, tgt: Tensor, encoded: EncoderOutput) -> Tensor:
    cache = DecoderCache()
    steps = [model.decode(tgt[:, t : t + 1], encoded, cache) for t in range(tgt.shape[1])]
    return torch.cat(steps, dim=1)  # (B, T, V)


def relative_error(x: Tensor, reference: Tensor) -> float:
    return ((x.float() - reference).norm() / reference.norm()).item()


def test_kv_cache_decoding_equals_the_full_forward_pass_in_bf16():
    vocab = 8000
    model = random_model(ModelConfig(), vocab, seed=0).to(CUDA)  # the paper's base shape
    src = random_sources([37, 12, 25, 50, 8, 44, 30, 19], vocab, seed=1).to(CUDA)
    tgt = random_sources([40] * 8, vocab, seed=2)[:, :-1].to(CUDA)  # (8, 40), no padding
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        encoded = model.encode(src)
        reference = model.decode(tgt, encoded)  # float32, the whole target at once
        cached32 = decode_step_by_step(model, tgt, encoded)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            encoded16 = model.encode(src)
            full16 = model.decode(tgt, encoded16)
            cached16 = decode_step_by_step(model, tgt, encoded16)
    gap32 = relative_error(cached32, reference)
    full_error, cached_error = (
        relative_error(full16, reference),
        relative_error(cached16, reference),
    )
    same_argmax = (cached16.argmax(-1) == full16.argmax(-1)).float().mean().item()
    print(
        f"KV cache: float32 {gap32:.1e} from the full pass; bf16 full pass {full_error:.1e}, "
        f"bf16 cache {cached_error:.1e} from float32; same argmax at {same_argmax:.1%} of positions"
    )
    # float32: the two paths sum in other orders (other kernels for one position and for 40),
    # a few units of float32's 6e-8 roundoff per operation after 12 layers: far under 1e-4.
    assert gap32 < 1e-4
    # bf16 keeps 8 significant bits (roundoff 2^-8, 4e-3) at every matmul's inputs and outputs,
    # which puts the full pass itself 1e-3 to 1e-2 from float32. The cache may add no error of its
    # own: step by step lands as near float32 as the full pass does, within a factor 2 for the
    # other places where it rounds.
    assert full_error < 5e-2
    assert cached_error <= 2 * full_error


def test_beam_search_on_the_gpu_finds_what_it_finds_on_the_cpu():
    cfg = ModelConfig(
        name="t",
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    model = random_model(cfg, vocab=60, seed=3)
    with torch.no_grad():
        model.embed.weight.mul_(4.0)  # peaky distributions: clear choices, as a trained model's
    src = random_sources([3, 12, 7, 9, 5, 11, 4, 8, 10, 6, 12, 3, 9, 7, 5, 11], 60, seed=4)
    search = {
        "beam_size": 4,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "unk_id": UNK_ID,
        "alpha": 0.6,
        "max_len_a": 1.0,
        "max_len_b": 10,
    }
    on_cpu = beam_search(model, src, **search)
    on_gpu = beam_search(model.to(CUDA), src.to(CUDA), **search)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        in_bf16 = beam_search(model, src.to(CUDA), **search)
    same = sum(c[0].tokens == g[0].tokens for c, g in zip(on_cpu, on_gpu, strict=True))
    same16 = sum(c[0].tokens == g[0].tokens for c, g in zip(on_cpu, in_bf16, strict=True))
    print(f"beam 4: GPU float32 = CPU on {same} of 16 sentences, GPU bf16 = CPU on {same16}")
    # The best score is the same up to float32 rounding of ~20 summed log-probabilities (1e-6
    # each); where two hypotheses tie that closely, either may come first.
    for cpu, gpu in zip(on_cpu, on_gpu, strict=True):
        assert gpu[0].score == pytest.approx(cpu[0].score, abs=1e-3)
        assert len(gpu) == len(cpu)
    assert all(hyps and len(hyps[0].tokens) <= 22 for hyps in in_bf16)  # 12 + 10 at most


def test_the_fixed_shape_search_on_the_device_finds_what_it_finds_on_the_cpu(device):
    """What CUDA runs by default (the fixed-shape batch, done decided on the device) against
    today's shrinking search on the CPU, in float32; then under the device's decoding policy
    (bf16 autocast on CUDA). Rehearsed on the CPU (the `device` fixture)."""
    cfg = ModelConfig(
        name="t", d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.0, max_positions=64,
    )  # fmt: skip
    model = random_model(cfg, vocab=60, seed=5)
    with torch.no_grad():
        model.embed.weight.mul_(4.0)  # peaky distributions: clear choices, as a trained model's
    src = random_sources([3, 12, 7, 9, 5, 11, 4, 8, 10, 6, 12, 3, 9, 7, 5, 11], 60, seed=6)
    search = {"beam_size": 4, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID}
    search |= {"alpha": 0.6, "max_len_a": 1.0, "max_len_b": 10}
    on_cpu = beam_search(model, src, **search)
    on_device = fixed_shape_beam_search(model.to(device), src.to(device), **search)
    policy = ExecutionPolicy.for_decoding(DecodeConfig(), device)
    with policy.forward():
        by_policy = fixed_shape_beam_search(model, src.to(device), **search)
    same = sum(c[0].tokens == d[0].tokens for c, d in zip(on_cpu, on_device, strict=True))
    print(f"fixed-shape beam 4 on {device} = shrinking on the CPU on {same} of 16 sentences")
    # As test_beam_search_on_the_gpu_finds_what_it_finds_on_the_cpu: scores equal up to float32
    # rounding of ~20 summed log-probabilities; where two hypotheses tie that closely, either
    # may come first.
    for cpu, found in zip(on_cpu, on_device, strict=True):
        assert found[0].score == pytest.approx(cpu[0].score, abs=1e-3)
        assert len(found) == len(cpu)
    assert all(hyps and len(hyps[0].tokens) <= 22 for hyps in by_policy)  # 12 + 10 at most


def test_terms_and_prefixes_on_the_device_as_on_the_cpu(device):
    """Target terms (decode/constraints.py) and prefixes in the fixed-shape search on the device
    under its decoding policy: every hypothesis holds its terms and begins with its prefix, and
    in float32 the best scores are the CPU's shrinking search's. Rehearsed on the CPU."""
    cfg = ModelConfig(
        name="t", d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.0, max_positions=64,
    )  # fmt: skip
    model = random_model(cfg, vocab=60, seed=7)
    with torch.no_grad():
        model.embed.weight.mul_(4.0)
    src = random_sources([3, 12, 7, 9, 5, 11, 4, 8], 60, seed=8)
    wanted = [[[10, 11]], [], [[12], [13, 14]], [[15]], [], [[16, 17, 18]], [[19]], []]
    prefixes = [[20], [], [21, 22], [], [23], [], [], [24]]
    prefix = pad_sequences([np.asarray(p, dtype=np.int64) for p in prefixes], NO_TOKEN)
    search = {"beam_size": 4, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID}
    search |= {"alpha": 0.6, "max_len_a": 1.0, "max_len_b": 10}
    on_cpu = beam_search(model, src, terms=Terms.of_ids(wanted, CPU), prefix=prefix, **search)
    model = model.to(device)
    terms = Terms.of_ids(wanted, device)
    on_device = fixed_shape_beam_search(
        model, src.to(device), terms=terms, prefix=prefix.to(device), **search
    )
    policy = ExecutionPolicy.for_decoding(DecodeConfig(), device)
    with policy.forward():
        by_policy = fixed_shape_beam_search(
            model, src.to(device), terms=terms, prefix=prefix.to(device), **search
        )
    for cpu, found, decided, sentence_terms, begin in zip(
        on_cpu, on_device, by_policy, wanted, prefixes, strict=True
    ):
        assert len(found) == len(cpu) and (
            not cpu or found[0].score == pytest.approx(cpu[0].score, abs=1e-3)
        )
        for hypothesis in [*found, *decided]:
            assert hypothesis.tokens[: len(begin)] == begin
            for term in sentence_terms:
                tokens = hypothesis.tokens
                assert any(tokens[i : i + len(term)] == term for i in range(len(tokens)))


def record_logits_and_tf32(model) -> set[tuple[torch.dtype, bool]]:
    """(logits dtype, TF32 matmuls on) of every model.decode call from now on."""
    seen, decode = set(), model.decode

    def recording(tgt_in, encoded, cache=None):
        logits = decode(tgt_in, encoded, cache)
        seen.add((logits.dtype, torch.backends.cuda.matmul.allow_tf32))
        return logits

    model.decode = recording
    return seen


def test_decode_precision_auto_is_bf16_on_cuda_and_its_bleu_is_near_fp32s(tmp_path):
    run_dir = learned_toy_run(tmp_path, "trainer.device=cuda", "trainer.compile=false")
    seen, bleu, outputs = {}, {}, {}
    for precision in (Precision.auto, Precision.fp32):
        decode = DecodeConfig(beam_size=4, precision=precision)
        translator = load_translator(run_dir, decode=decode, device="cuda")
        seen[precision] = record_logits_and_tf32(translator.backend.model)
        bleu[precision], outputs[precision] = split_bleu(translator, run_dir)
    same = sum(a == b for a, b in zip(*outputs.values(), strict=True))
    print(f"toy test split on CUDA: BLEU {bleu}; {same} of 100 outputs equal")
    assert {dtype for dtype, _ in seen[Precision.auto]} == {torch.bfloat16}
    assert seen[Precision.fp32] == {(torch.float32, True)}  # in TF32 (device.prepare_process)
    assert bleu[Precision.fp32] > 15
    # bf16 rounds each matmul's inputs to 8 significant bits (0.4%), less than int8's 7-bit
    # activations: int8 keeps its Multi30k BLEU near float32's (benchmarks/decode.txt), so bf16
    # should a fortiori.
    assert abs(bleu[Precision.auto] - bleu[Precision.fp32]) <= 2.0
