"""Decoding benchmark: beam search speed and BLEU on Multi30k test_2016_flickr, CTranslate2 parity.

    make bench-decode RUN=runs/multi30k_de_en_small          # a model trained on Multi30k
    .venv/bin/python -m benchmarks.bench_decode --run runs/x --reference-sentences 1000

With the paper's decoding (beam 4, GNMT length penalty 0.6, max length = source length + 50) on
--threads CPU threads, the same source sentences go through:

  (a) ours: Translator (batched by length, KV cache, finished sentences leave the batch) in
      fp32, with the exact stopping rule (the default) and with CTranslate2's
      (decode.stop_early=true: a sentence ends once 4 hypotheses have finished), which is the
      same work as (c); under bf16 autocast (decode.precision=bf16, faster on a CPU with native
      bf16 products, the report's header says which; decode.precision=auto is fp32 on the CPU); with
      torch's F.linear in place of the default oneDNN prepacked weights (decode.cpu_linear=torch,
      CTranslate2's stopping rule); and with int8 weights (CTranslate2's stopping rule), beside
      (c) int8: decode.quantize=int8 (each row of a layer's input quantized from its own range,
      torch._int_mm: a sentence's translation does not depend on its batch) and
      decode.quantize=int8_batch (one scale for the whole batch, PyTorch's dynamic quantization,
      fbgemm: it does), the first again in a process whose malloc hands freed memory back to the
      kernel (glibc's default; load_translator's keep_freed_memory=False) where the others keep
      it, as the commands do. Each int8 also translates the first --reference-sentences
      sentences one by one: how many come out otherwise than in their batches;
  (b) reference: the tutorial approach, kept in this file as the yardstick: one sentence at a
      time, and at every step one decoder call per beam over its whole prefix, without a cache
      (the same search rule as ours, so the outputs should be the same); it is slow, so it is
      timed on the first --reference-sentences sentences, with ours timed again on those;
  (c) the checkpoint exported to CTranslate2 (transformer_mt.export.ctranslate2),
      computing in float32 and in int8.

Timed runs are interleaved over --rounds rounds, in ABBA order (a, a int8, ..., c int8, then
c int8, ..., a), each in a process of its own (in one process, torch's and CTranslate2's thread
pools slow each other's next run on a small machine), and each system's fastest round is
reported, with the load average around it (the machine is shared); the ratios are given twice:
of the fastest rounds, and the median of the ratios within a round. Every output is scored with
sacreBLEU. Parity:
greedy outputs of ours and of CTranslate2 float32, token for token, and their BLEU difference.
--sentences N: the first N test sentences only (a quick check that the script runs:
`--sentences 20 --reference-sentences 2 --rounds 1`).

Without a trained model (what `make gpu-check` runs, benchmarks/gpu_check.py):

    python -m benchmarks.bench_decode --generated 3000 --model base --device cuda

times the same beam search on generated sentences of WMT14 length (benchmarks/bench_train.py's
generator) with a random-weight model of the --model preset: ours in float32 (TF32 matmuls on a
GPU), under bf16 autocast (decode.precision=bf16, on the CPU too) and with int8 weights on the
CPU (decode.quantize=int8 and int8_batch), against CTranslate2 float32 and float16 (int8 on the
CPU), all in one process, each after a warm-up, through the same Translator batches. Random weights
rarely choose EOS, so nearly every hypothesis runs to its length limit (source + 50): the
search's worst case, and the same number of steps for both; no BLEU.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.measure import abba_order, in_fresh_process, report_header
from benchmarks.reference_search import reference_beam_search
from transformer_mt.config import CpuLinear, DecodeConfig, Precision, Strategy, compose_job
from transformer_mt.data.sources import read_pairs
from transformer_mt.data.tokenizer import PAD_ID, Tokenizers
from transformer_mt.decode.ctranslate2_backend import CTranslate2Search, import_ctranslate2
from transformer_mt.decode.loading import load_translator, translator_from_export
from transformer_mt.decode.translator import ModelSearch, Translator
from transformer_mt.device import set_up_process
from transformer_mt.errors import TransformerMTError
from transformer_mt.export.ctranslate2 import export_model
from transformer_mt.metrics import sacrebleu_scores
from transformer_mt.model import Transformer
from transformer_mt.run_dir import RunDir

PAPER = DecodeConfig()  # beam 4, alpha 0.6, max length = source length + 50
# Ours in fp32 by name (precision=auto is bf16 on CUDA), and in bf16 in a row of its own.
PAPER_FP32 = dataclasses.replace(PAPER, precision=Precision.fp32)
OURS = "(a) ours (Translator, KV cache)"
OURS_EARLY = "(a) ours, CTranslate2's stopping"
OURS_BF16 = "(a) ours bf16 autocast, CTranslate2's stopping"
OURS_INT8 = "(a) ours int8, CTranslate2's stopping"
OURS_TORCH = "(a) ours F.linear, CTranslate2's stopping"
OURS_INT8_GLIBC = "(a) ours int8, glibc's default malloc"
OURS_INT8_BATCH = "(a) ours int8_batch, CTranslate2's stopping"
EARLY = dataclasses.replace(PAPER_FP32, stop_early=True)
OURS_DECODE = {
    OURS: PAPER_FP32,
    OURS_EARLY: EARLY,
    OURS_BF16: dataclasses.replace(EARLY, precision=Precision.bf16),
    OURS_TORCH: dataclasses.replace(EARLY, cpu_linear=CpuLinear.torch),
    OURS_INT8: dataclasses.replace(EARLY, quantize=CpuLinear.int8),
    OURS_INT8_BATCH: dataclasses.replace(EARLY, quantize=CpuLinear.int8_batch),
    OURS_INT8_GLIBC: dataclasses.replace(EARLY, quantize=CpuLinear.int8),
}
CT2_TYPES = {"(c) CTranslate2 float32": "float32", "(c) CTranslate2 int8": "int8"}
GREEDY = DecodeConfig(strategy=Strategy.greedy, beam_size=1)  # auto: a CTranslate2 model's only


def timed(translate: Callable[[list[str]], list[str]], sources: list[str]):
    load = os.getloadavg()[0]
    started = time.perf_counter()
    outputs = translate(sources)
    return time.perf_counter() - started, outputs, (load, os.getloadavg()[0])


def interleaved(systems: list[str], args, sources: list[str], folder: Path) -> dict:
    """name -> (fastest seconds, outputs, load average before/after that run, every round's
    seconds); every timed run is a fresh process (`time_one`), the systems in ABBA order over the
    rounds."""
    best: dict = {}
    rounds: dict[str, list[float]] = {name: [] for name in systems}
    for turn in range(args.rounds):
        for name in abba_order(systems, turn):
            seconds, outputs, load = in_fresh_process(time_one, args, name, folder, sources)
            rounds[name].append(seconds)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, outputs, load)
    return {name: (*best[name], rounds[name]) for name in systems}


def time_one(args, name: str, export: Path, sources: list[str]):
    """(seconds, outputs, load average before/after) of system `name` translating `sources`
    once, after a warm-up; `export`: the CTranslate2 export of the run's checkpoint."""
    torch.set_num_threads(args.threads)
    if name in OURS_DECODE:
        keep = name != OURS_INT8_GLIBC
        system = load_translator(
            args.run,
            args.checkpoint,
            decode=OURS_DECODE[name],
            device="cpu",
            keep_freed_memory=keep,
        )
    else:
        system = translator_from_export(
            export, decode=PAPER, device="cpu", compute_type=CT2_TYPES[name], threads=args.threads
        )
    system.translate(sources[:32])  # warm-up: first calls allocate
    return timed(system.translate, sources)


def row(name: str, sentences: int, seconds: float, bleu: float | None, load) -> str:
    score = f"{bleu:6.2f}" if bleu is not None else "     -"
    return (
        f"  {name:42s} {sentences:5d} {seconds:8.2f} s {sentences / seconds:8.1f} sent/s"
        f"  BLEU {score}  load {load[0]:.2f} -> {load[1]:.2f}"
    )


def bleu(hypotheses: list[str], references: list[str]) -> float:
    return sacrebleu_scores(hypotheses, references).bleu


def print_header(args, ctranslate2) -> None:
    print(
        *report_header("make bench-decode: decoding speed, BLEU and CTranslate2 parity"), sep="\n"
    )
    print(
        f"# ctranslate2 {ctranslate2.__version__}; threads: torch {torch.get_num_threads()}, "
        f"CTranslate2 intra_threads {args.threads}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default="runs/multi30k_de_en_small", help="Multi30k run folder")
    parser.add_argument("--checkpoint", default="last.pt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timed rounds")
    parser.add_argument(
        "--reference-sentences", type=int, default=100, help="the reference is timed on these"
    )
    parser.add_argument(
        "--sentences", type=int, default=0, help="the first N test sentences only (0: all)"
    )
    parser.add_argument(
        "--generated",
        type=int,
        default=0,
        help="time this many generated WMT-length sentences with a random-weight --model "
        "instead (no run folder, no BLEU)",
    )
    parser.add_argument("--model", default="base", help="--generated: the model preset")
    parser.add_argument("--vocab", type=int, default=37000, help="--generated: vocabulary size")
    parser.add_argument("--device", default="cpu", help="--generated: cpu, cuda or cuda:N")
    args = parser.parse_args()
    if args.generated:
        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory(prefix="bench_decode_") as folder:
            benchmark_generated(args, Path(folder) / "ctranslate2")
        return
    ctranslate2 = import_ctranslate2()
    torch.set_num_threads(args.threads)
    print_header(args, ctranslate2)
    with tempfile.TemporaryDirectory(prefix="bench_decode_") as folder:
        benchmark(args, Path(folder) / "ctranslate2")


def benchmark(args, folder: Path) -> None:
    """Export the run's checkpoint to `folder`, then time, score and compare every system."""
    run = Path(args.run)
    data = RunDir(run).data_config()
    pairs = split_pairs(data, args.sentences)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    ours = load_translator(run, args.checkpoint, decode=PAPER_FP32, device="cpu")
    ours_greedy = load_translator(
        run,
        args.checkpoint,
        decode=dataclasses.replace(GREEDY, precision=Precision.fp32),
        device="cpu",
    )
    model = ours.backend.model
    export_model(model, ours.tokenizers, folder, unicode_form=data.unicode_form)

    def ct2(decode: DecodeConfig, compute_type: str) -> Translator:
        return translator_from_export(
            folder, decode=decode, device="cpu", compute_type=compute_type, threads=args.threads
        )

    print(
        f"# data: {data.dir}/{data.test_split}.{data.src_lang} -> .{data.tgt_lang}, "
        f"{len(sources)} sentences; model: {args.run}/checkpoints/{args.checkpoint} "
        f"({sum(p.numel() for p in model.parameters()):,} parameters)"
    )
    print(
        f"# decoding: beam {PAPER.beam_size}, length penalty {PAPER.length_penalty}, max length "
        f"{PAPER.max_len_a:g} * source + {PAPER.max_len_b}, batches of "
        f"{ours.decode.batch_tokens} source tokens (ours and CTranslate2 alike)"
    )
    print(
        f"\nbeam search, all {len(sources)} sentences, fastest of {args.rounds} rounds, each "
        "in a process of its own:"
    )
    results = interleaved([*OURS_DECODE, *CT2_TYPES], args, sources, folder)
    for name, (seconds, outputs, load, _) in results.items():
        print(row(name, len(sources), seconds, bleu(outputs, references), load))

    report_reference(args, ours, sources, references)
    report_ratios(results)
    report_parity(ours_greedy, ct2(GREEDY, "float32"), sources, references, results)
    report_batch_dependence(args, sources[: args.reference_sentences])


def split_pairs(data, sentences: int) -> list[tuple[str, str]]:
    """The run's test split, or its first `sentences` pairs (0: all)."""
    pairs = list(read_pairs(data, "test"))
    return pairs[:sentences] if sentences else pairs


def report_reference(args, ours: Translator, sources, references) -> None:
    n = args.reference_sentences
    subset, subset_refs = sources[:n], references[:n]

    def reference(lines: list[str]) -> list[str]:
        sources = ours.truncate(ours.encode(lines))
        return ours.tokenizers.tgt.decode(
            [reference_beam_search(ours.backend.model, s, PAPER_FP32) for s in sources]
        )

    print(f"\nbeam search, the first {n} sentences (the reference is slow), one round each:")
    runs = {
        "(b) reference (no cache, per beam)": timed(reference, subset),
        "(a) ours on the same sentences": timed(ours.translate, subset),
    }
    for name, (seconds, outputs, load) in runs.items():
        print(row(name, n, seconds, bleu(outputs, subset_refs), load))
    (ref_seconds, ref_outputs, _), (ours_seconds, ours_outputs, _) = runs.values()
    same = sum(a == b for a, b in zip(ref_outputs, ours_outputs, strict=True))
    print(f"  reference output = ours on {same} of {n} sentences")
    ratio = ref_seconds / ours_seconds
    print(f"  ours is {ratio:.1f}x faster than the reference (target >= 3x: {verdict(ratio >= 3)})")


def report_ratios(results: dict) -> None:
    """The target compares equal work: the same stopping rule. The exact rule's extra steps are
    a choice of search, reported beside it. Each ratio as fastest / fastest, then as the median
    of its ratios within a round (one round: the same)."""
    fp32, int8 = "(c) CTranslate2 float32", "(c) CTranslate2 int8"

    def ratio(a: str, b: str) -> str:
        fastest = results[a][0] / results[b][0]
        within = statistics.median(x / y for x, y in zip(results[a][3], results[b][3], strict=True))
        return f"{fastest:.2f} (median within a round {within:.2f})"

    early_fp32 = results[OURS_EARLY][0] / results[fp32][0]
    int8_int8 = results[OURS_INT8][0] / results[int8][0]
    print(
        f"\nsame stopping rule: ours' time / CTranslate2 float32's: {ratio(OURS_EARLY, fp32)} "
        f"(target <= 1.5: {verdict(early_fp32 <= 1.5)}); / int8's: {ratio(OURS_EARLY, int8)}"
        f"\nours bf16 autocast, same stopping rule: time / ours float32's: "
        f"{ratio(OURS_BF16, OURS_EARLY)}; / CTranslate2 float32's: {ratio(OURS_BF16, fp32)}; "
        f"/ int8's: {ratio(OURS_BF16, int8)}"
        f"\nours float32 with oneDNN's prepacked weights (the default) / with torch's F.linear: "
        f"{ratio(OURS_EARLY, OURS_TORCH)}"
        f"\nours int8, same stopping rule: time / ours float32's: {ratio(OURS_INT8, OURS_EARLY)}"
        f"; / CTranslate2 int8's: {ratio(OURS_INT8, int8)} (target <= 1.0: "
        f"{verdict(int8_int8 <= 1.0)})"
        f"\nours int8 (a scale per row) / int8_batch (a scale per batch): "
        f"{ratio(OURS_INT8, OURS_INT8_BATCH)}; int8_batch / CTranslate2 int8's: "
        f"{ratio(OURS_INT8_BATCH, int8)}"
        f"\nours int8, freed memory kept (as the commands do) / glibc's default malloc: "
        f"{ratio(OURS_INT8, OURS_INT8_GLIBC)}"
        f"\nours with the exact rule (the default; more steps) / CTranslate2 float32's: "
        f"{ratio(OURS, fp32)}; / ours with CTranslate2's rule: {ratio(OURS, OURS_EARLY)}"
    )


def report_parity(ours: Translator, theirs: Translator, sources, references, beam):
    print(f"\nparity, greedy search, all {len(sources)} sentences:")
    ours_s, ours_ids, ours_load = timed(lambda s: ours.translate_ids(ours.encode(s)), sources)
    ct2_s, ct2_ids, ct2_load = timed(lambda s: theirs.translate_ids(theirs.encode(s)), sources)
    ours_text, ct2_text = ours.tokenizers.tgt.decode(ours_ids), ours.tokenizers.tgt.decode(ct2_ids)
    ours_bleu, ct2_bleu = bleu(ours_text, references), bleu(ct2_text, references)
    print(row("(a) ours, greedy", len(sources), ours_s, ours_bleu, ours_load))
    print(row("(c) CTranslate2 float32, greedy", len(sources), ct2_s, ct2_bleu, ct2_load))
    same = sum(a == b for a, b in zip(ours_ids, ct2_ids, strict=True))
    share = 100 * same / len(sources)
    delta = ct2_bleu - ours_bleu
    print(
        f"  identical token for token: {same} of {len(sources)} ({share:.1f}%; target >= 99%: "
        f"{verdict(share >= 99)}); BLEU difference {delta:+.2f} (target |d| <= 0.1: "
        f"{verdict(abs(delta) <= 0.1)})"
    )
    compared = [*itertools.product((OURS_EARLY, OURS), CT2_TYPES)]
    compared += [(OURS_BF16, OURS_EARLY), (OURS_BF16, "(c) CTranslate2 float32")]
    compared += [(OURS_INT8, "(c) CTranslate2 int8"), (OURS_INT8, OURS_EARLY)]
    compared += [(OURS_INT8_BATCH, OURS_EARLY), (OURS_INT8_BATCH, OURS_INT8)]
    compared += [(OURS_INT8_GLIBC, OURS_INT8)]
    for ours_name, name in compared:
        pairs = list(zip(beam[ours_name][1], beam[name][1], strict=True))
        differ = [(a, b) for a, b in pairs if a != b]
        longer = sum(len(a.split()) > len(b.split()) for a, b in differ)
        print(
            f"  beam 4: {name[4:]} output = {ours_name[4:]} on "
            f"{len(pairs) - len(differ)} of {len(pairs)} sentences; of the {len(differ)} "
            f"others, {ours_name[4:]} is longer in {longer}"
        )
    print(
        "  (CTranslate2 stops a sentence once 4 hypotheses have finished, fairseq's rule; ours\n"
        "  by default goes on while a live hypothesis could still beat one of them)"
    )


def report_batch_dependence(args, sources: list[str]) -> None:
    """Each int8 translating `sources` in its batches and one by one: how many lines differ (a
    translation that depends on the sentences batched with it differs on many)."""
    print(f"\nint8, the first {len(sources)} sentences in their batches and one by one:")
    for name in (OURS_INT8, OURS_INT8_BATCH):
        system = load_translator(args.run, args.checkpoint, decode=OURS_DECODE[name], device="cpu")
        batched = system.translate(sources)
        alone = [system.translate([source])[0] for source in sources]
        differ = sum(a != b for a, b in zip(batched, alone, strict=True))
        print(f"  {name[4:]}: {differ} of {len(sources)} lines differ")


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


# ---- --generated: random weights, generated sources, on any device ------------------------------
def benchmark_generated(args, folder: Path) -> None:
    """Beam search sentences/s on generated sources: ours and CTranslate2 on args.device."""
    from benchmarks.bench_train import GeneratedVocabulary, generated_pairs

    device = set_up_process(args.device)  # as tmt-train's: the allocator, TF32
    torch.manual_seed(1)
    model_cfg = compose_job("train", [f"model={args.model}", "run_dir=unused"]).model
    model = Transformer(model_cfg, vocab_size=args.vocab, pad_id=PAD_ID).to(device).eval()
    generated = generated_pairs(args.generated, args.vocab, seed=2).src
    sources = [generated[i].tolist() for i in range(len(generated))]
    title = "beam search on generated sentences, ours beside CTranslate2"
    print(*report_header(title, device), sep="\n")
    vocabulary = GeneratedVocabulary(args.vocab)
    tokenizers = Tokenizers(vocabulary, vocabulary)
    fp32 = dataclasses.replace(PAPER, precision=Precision.fp32)  # auto: bf16 on CUDA
    ours = Translator(ModelSearch(model, device), tokenizers, fp32)
    systems = {"(a) ours, float32": ours.translate_ids}  # with TF32 matmuls on CUDA
    # bf16 on the CPU too: CPUs with AVX512-BF16 or AMX multiply it natively.
    bf16 = dataclasses.replace(PAPER, precision=Precision.bf16)
    systems["(a) ours, bf16 autocast"] = lambda ids: ours.translate_ids(ids, bf16)
    if device.type != "cuda":
        for quantize in (CpuLinear.int8, CpuLinear.int8_batch):
            int8 = dataclasses.replace(fp32, quantize=quantize)
            search = ModelSearch(model, device, quantize=quantize)
            systems[f"(a) ours, {quantize.value}"] = Translator(
                search, tokenizers, int8
            ).translate_ids
    print(
        f"# generated: {len(sources)} sentences of WMT14 length (mean "
        f"{sum(map(len, sources)) / len(sources):.1f} pieces), {args.vocab:,}-piece vocabulary; "
        f"model={args.model} with random weights ({sum(p.numel() for p in model.parameters()):,} "
        f"parameters) on {device_name(device)}"
    )
    print(
        f"# beam {PAPER.beam_size}, length penalty "
        f"{PAPER.length_penalty}, max length source + {PAPER.max_len_b}, batches of "
        f"{ours.decode.batch_tokens} source tokens (ours and CTranslate2 alike)"
    )
    budget = ours.decode.batch_tokens  # the device's default: CTranslate2's batches the same
    systems |= ctranslate2_systems(model, tokenizers, folder, device, args.threads, budget)
    outputs = {}
    for name, translate in systems.items():
        try:
            translate(sources[:64])  # warm-up: first calls allocate, load kernels
            seconds, outputs[name], load = timed(translate, sources)
        except RuntimeError as error:  # CTranslate2 loads CUDA libraries at its first call
            print(f"  {name:42s} failed: {str(error).splitlines()[0]}")
            continue
        print(speed_row(name, outputs[name], seconds, load))
    ct2_fp32 = outputs.get("(c) CTranslate2 float32")
    if ct2_fp32 is not None:
        same = sum(a == b for a, b in zip(outputs["(a) ours, float32"], ct2_fp32, strict=True))
        print(f"  CTranslate2 float32 output = ours float32 on {same} of {len(sources)} sentences")


def ctranslate2_systems(
    model, tokenizers, folder: Path, device: torch.device, threads: int, batch_tokens: int
):
    """name -> translate_ids of CTranslate2 over the exported `model` ({} without ctranslate2),
    in batches of `batch_tokens` source tokens."""
    try:
        ctranslate2 = import_ctranslate2()
    except TransformerMTError as error:
        print(f"  CTranslate2 not timed: {error}")
        return {}
    print(f"# ctranslate2 {ctranslate2.__version__}")
    export_model(
        model,
        SimpleNamespace(src=tokenizers.src, tgt=tokenizers.tgt, files=[]),
        folder,
        unicode_form=None,
    )
    types = ("float32", "float16") if device.type == "cuda" else ("float32", "int8")
    systems = {}
    for compute_type in types:
        try:
            engine = ctranslate2.Translator(
                str(folder),
                device=device.type,
                device_index=device.index or 0,
                compute_type=compute_type,
                intra_threads=threads,
            )
        except (RuntimeError, ValueError) as error:
            print(f"  (c) CTranslate2 {compute_type} on {device}: {str(error).splitlines()[0]}")
            continue
        backend = CTranslate2Search(engine, tokenizers, max_positions=model.positions.shape[0])
        translator = Translator(
            backend, tokenizers, dataclasses.replace(PAPER, batch_tokens=batch_tokens)
        )
        systems[f"(c) CTranslate2 {compute_type}"] = translator.translate_ids
    return systems


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"the CPU ({torch.get_num_threads()} threads)"


def speed_row(name: str, outputs: list[list[int]], seconds: float, load) -> str:
    pieces = sum(len(o) + 1 for o in outputs)  # + EOS
    return (
        f"  {name:42s} {len(outputs):5d} {seconds:8.2f} s {len(outputs) / seconds:8.1f} sent/s"
        f" {pieces / seconds:9,.0f} pieces/s  mean output {pieces / len(outputs):5.1f} pieces"
        f"  load {load[0]:.2f} -> {load[1]:.2f}"
    )


if __name__ == "__main__":
    main()
