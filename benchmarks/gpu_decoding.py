"""make gpu-check's beam search part (the first command's last part; benchmarks/gpu_check.py):
beam search on one GPU, ours beside transformers' generate(num_beams=4) of the same weights, in
one process, on the same sentences and the same device.

    python -m benchmarks.gpu_decoding --device cuda        # what make gpu-check runs
    python -m benchmarks.gpu_decoding --device cuda --levers     # the optional levers run
    python -m benchmarks.gpu_decoding --device cpu --rehearsal   # its code path, tiny, on the CPU

Two workloads, each a random-weight model of a preset and 1,000 generated sources:

- Multi30k-like: model=small (the Multi30k recipe's, 8,000 pieces), sources of Multi30k's lengths
  (log-normal around 14 pieces), outputs of 16 pieces (EOS included). The issue's target, 1,000
  sentences in <= 1.5 s, is about the trained recipe model (tmt-eval prints its time).
- WMT-length: model=base, 37,000 pieces, sources of WMT14's lengths (bench_train's generator,
  mean about 29 pieces), outputs of 32 pieces. Target: >= 30,000 target tokens/s.

Random weights rarely choose EOS, so every hypothesis runs to its length limit: a limit of its
own for every sentence (decode.max_len_a=0, max_len_b: 16 or 32) makes the work the same for
both searches (transformers' generate has one limit per batch, ours one per sentence) and about
what a trained model writes for such sources (the paper's source + 50 is a limit such a model
rarely reaches).

Each runs ours as the commands do (Translator, decode.precision=auto: bf16 autocast on CUDA; the
execution policy's batch shape, fixed on CUDA; decode.batch_tokens and check_every at the
device's defaults), then transformers' MarianMTModel with our weights, converted as
`tmt-export format=transformers` converts them (export/transformers.py: marian_config,
marian_state_dict, generation_config; cast to bf16 on CUDA: generate runs under no autocast of
ours), in the same batches, each generate limited to its batch's longest limit. Printed as each
ends: sentences/s, target tokens/s (EOS included), and BLEU of each against the other's output
(token ids as words; 100 = the same outputs). With --levers, ours alone on both workloads with
one setting changed at a time: decode.batch_tokens at a few budgets (the CUDA default is
provisional until this measures it), decode.check_every of the fixed-shape batch (provisional
too), the other batch shape (on CUDA the shrinking batch, the CPU's path; in the CPU rehearsal
the fixed one) and decode.source_lengths=equal (batches of one source length: no attention
mask, flash on CUDA, but more batches). Every figure is a timing of one pass after a warm-up on
the first 64 sentences; a part stopped at its limit keeps what it printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch

from benchmarks.bench_train import GeneratedVocabulary, generated_pairs
from benchmarks.measure import report_header, synchronize
from transformer_mt.config import BatchShape, DecodeConfig, SourceLengths, compose_job
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import EOS_ID, PAD_ID, Tokenizers
from transformer_mt.decode.translator import ModelSearch, Translator
from transformer_mt.device import set_up_process
from transformer_mt.errors import TransformerMTError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.export.transformers import (
    generation_config,
    import_transformers,
    marian_shape,
    marian_state_dict,
)
from transformer_mt.metrics import sacrebleu_scores
from transformer_mt.model import Transformer

Translate = Callable[[list[list[int]]], list[list[int]]]


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # the preset
    vocab: int
    sentences: int
    output: int  # every output's length, EOS included: its limit (decode.max_len_b)
    lengths: str  # "multi30k" or "wmt"


GPU_WORKLOADS = (
    Workload("Multi30k-like", "small", 8000, 1000, 16, "multi30k"),
    Workload("WMT-length", "base", 37000, 1000, 32, "wmt"),
)
REHEARSAL_WORKLOADS = (
    Workload("Multi30k-like", "tiny", 500, 40, 16, "multi30k"),
    Workload("WMT-length", "tiny", 500, 40, 32, "wmt"),
)
BATCH_TOKENS = (4000, 16384, 65536)  # the CPU's default, CUDA's provisional one, 4x that
CHECK_EVERY = (1, 4, 16)


def sources_of(workload: Workload, seed: int = 2) -> list[list[int]]:
    """The workload's generated sources (piece ids 4..vocab-1, no EOS)."""
    if workload.lengths == "wmt":
        generated = generated_pairs(workload.sentences, workload.vocab, seed=seed).src
        return [generated[i].tolist() for i in range(len(generated))]
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(14.0), 0.35, workload.sentences)), 3, 60)
    return [rng.integers(4, workload.vocab, int(n)).tolist() for n in lengths]


def random_model(workload: Workload, device: torch.device) -> Transformer:
    torch.manual_seed(1)
    cfg = compose_job("train", [f"model={workload.model}", "run_dir=unused"]).model
    return Transformer(cfg, vocab_size=workload.vocab, pad_id=PAD_ID).to(device).eval()


def timed(translate: Translate, sources: list[list[int]], device: torch.device):
    """(seconds, outputs) of one pass over `sources`, after a warm-up on the first 64."""
    translate(sources[:64])
    synchronize(device)
    started = time.perf_counter()
    outputs = translate(sources)
    synchronize(device)
    return time.perf_counter() - started, outputs


def row(name: str, seconds: float, outputs: list[list[int]]) -> str:
    tokens = sum(len(o) + 1 for o in outputs)  # + EOS
    return (
        f"  {name:46s} {len(outputs):5d} in {seconds:7.2f} s {len(outputs) / seconds:8.1f} "
        f"sent/s {tokens / seconds:9,.0f} target tok/s (mean {tokens / len(outputs):5.1f})"
    )


def bleu_of(hypotheses: list[list[int]], references: list[list[int]]) -> float:
    """sacreBLEU of token ids written as words."""
    as_text = [" ".join(map(str, ids)) for ids in hypotheses]
    return sacrebleu_scores(as_text, [" ".join(map(str, ids)) for ids in references]).bleu


class TransformersGenerate:
    """Our model as transformers' MarianMTModel (tmt-export format=transformers's conversion)
    on `device`, in bf16 on CUDA, translating piece ids with generate(num_beams=4) in the
    batches a Translator forms."""

    def __init__(self, model: Transformer, translator: Translator, decode: DecodeConfig):
        transformers = import_transformers()
        shape = marian_shape(model.cfg, transformers, vocab_size=model.embed.num_embeddings)
        marian = transformers.MarianMTModel(shape)
        marian.load_state_dict(marian_state_dict(model, marian), strict=True)
        marian.generation_config = generation_config(model.cfg.max_positions, transformers)
        device = next(model.parameters()).device
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.marian = marian.to(device, dtype).eval()
        self.translator, self.decode, self.device = translator, decode, device
        self.dtype = dtype

    def __call__(self, sources: list[list[int]]) -> list[list[int]]:
        outputs: list[list[int]] = [[] for _ in sources]
        for batch in self.translator.batches(sources, self.decode):
            found = self.generate([sources[i] for i in batch])
            for index, tokens in zip(batch, found, strict=True):
                outputs[index] = tokens
        return outputs

    @torch.no_grad()
    def generate(self, sources: list[list[int]]) -> list[list[int]]:
        src = pad_sequences([np.asarray(s) for s in sources], PAD_ID, suffix=EOS_ID)
        src = src.to(self.device)
        decode = self.decode
        limit = int(max(decode.max_len_a * len(s) + decode.max_len_b for s in sources))
        generated = self.marian.generate(
            input_ids=src,
            attention_mask=src != PAD_ID,
            num_beams=decode.beam_size,
            max_new_tokens=limit,
        )  # (B, 1 + at most limit): the start token, the tokens, EOS, padding
        return [until_eos(row[1:].tolist()) for row in generated]


def until_eos(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


def measure(
    workload: Workload, device: torch.device, beside_generate: bool = True
) -> tuple[Translator, list[list[int]], list[list[int]]]:
    """Ours, then (beside_generate) transformers', on `workload`: our translator, the sources
    and our outputs."""
    model = random_model(workload, device)
    sources = sources_of(workload)
    vocabulary = GeneratedVocabulary(workload.vocab)
    decode = DecodeConfig(max_len_a=0.0, max_len_b=workload.output)
    translator = Translator(ModelSearch(model, device), Tokenizers(vocabulary, vocabulary), decode)
    mean = sum(map(len, sources)) / len(sources)
    fixed = ExecutionPolicy.for_decoding(translator.decode, device).fixed_shape_decoding
    shape = "a batch of fixed shape" if fixed else "a shrinking batch"
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"\n{workload.name}: {len(sources)} sources (mean {mean:.1f} pieces), model="
        f"{workload.model} with random weights ({parameters:,} parameters, {workload.vocab:,} "
        f"pieces), beam {decode.beam_size}, length penalty {decode.length_penalty}, outputs of "
        f"at most {workload.output} pieces; ours in batches of {translator.decode.batch_tokens} "
        f"source tokens (the device's default), {shape}"
        + ("; transformers' in the same batches" if beside_generate else ""),
        flush=True,
    )
    seconds, ours = timed(translator.translate_ids, sources, device)
    print(row("ours (decode defaults)", seconds, ours), flush=True)
    if not beside_generate:
        return translator, sources, ours
    try:
        generate = TransformersGenerate(model, translator, translator.decode)
    except TransformerMTError as error:  # transformers not installed: one line
        print(f"  transformers' generate not timed: {error}", flush=True)
        generate = None
    if generate is not None:
        their_seconds, theirs = timed(generate, sources, device)
        name = f"transformers generate(num_beams=4), {str(generate.dtype)[6:]}"
        print(row(name, their_seconds, theirs), flush=True)
        print(
            f"  ours / transformers' speed: {their_seconds / seconds:.2f}x; BLEU of ours against "
            f"theirs {bleu_of(ours, theirs):.2f}, of theirs against ours "
            f"{bleu_of(theirs, ours):.2f}",
            flush=True,
        )
    return translator, sources, ours


def measure_levers(
    translator: Translator, sources: list[list[int]], ours: list[list[int]], device: torch.device
) -> None:
    """Ours with other decode.batch_tokens, check_every (the fixed-shape batch's) and the other
    batch_shape, each beside the defaults' output (BLEU against it: 100 = the same)."""
    default = translator.decode
    fixed = {"batch_shape": BatchShape.fixed}
    settings = [{"batch_tokens": value} for value in BATCH_TOKENS]
    settings += [{**fixed, "check_every": value} for value in CHECK_EVERY]
    on_cuda = ExecutionPolicy.for_decoding(default, device).fixed_shape_decoding
    settings += [{"batch_shape": BatchShape.shrinking} if on_cuda else fixed]
    settings += [{"source_lengths": SourceLengths.equal}]
    print("  levers, ours on the same sources (BLEU against the defaults' output):", flush=True)
    for changed in settings:
        decode = dataclasses.replace(default, **changed)
        translate = functools.partial(translator.translate_ids, decode=decode)
        seconds, outputs = timed(translate, sources, device)
        name = "ours, " + " ".join(
            f"{key}={value.value if isinstance(value, Enum) else value}"
            for key, value in changed.items()
        )
        print(f"{row(name, seconds, outputs)}  BLEU {bleu_of(outputs, ours):6.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rehearsal", action="store_true", help="tiny models, a few sentences")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument(
        "--levers", action="store_true", help="ours alone, one decode setting changed at a time"
    )
    args = parser.parse_args()
    device = set_up_process(args.device, args.threads)  # as tmt-train's: the allocator, TF32
    title = "beam search on one device: ours beside transformers' generate"
    print(*report_header(title, device), sep="\n")
    workloads = REHEARSAL_WORKLOADS if args.rehearsal else GPU_WORKLOADS
    for workload in workloads:
        measured = measure(workload, device, beside_generate=not args.levers)
        if args.levers:
            measure_levers(*measured, device)


if __name__ == "__main__":
    main()
