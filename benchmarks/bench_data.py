"""Data-preparation benchmark: WMT-sized generated corpora, peak memory, padding, shared stores.

    make bench-data                                      # 4.5M and 1M pairs (benchmarks/)
    make bench-data ARGS="--sizes 200000 --slice 50000"  # a quick run

For each size it writes a generated parallel corpus with a WMT-like length distribution (mean
about 25 words, a long tail to 250), then times `prepare` (clean + SentencePiece + encode +
binarize, in a child process) and samples the whole process tree's RSS to report its peak. On a
slice it times the tutorial approach (one process, Python lists, batches padded to their longest
sentence) against ours. It then prints the padding share of our batches on Multi30k, and the RSS
of two data-parallel ranks that read the largest store at once. Of the largest corpus it draws
--samples sampled segmentations (subword regularization) and reports their time and disk.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.measure import report_header, status_kib
from transformer_mt.config import DataConfig, SourceKind
from transformer_mt.data.batching import token_batches

WORDS = 30_000


def synthetic_words(rng: np.random.Generator, n: int) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöüß"))
    lengths = rng.integers(2, 11, n)
    return np.array(["".join(rng.choice(letters, k)) for k in lengths])


def write_corpus(folder: Path, pairs: int, seed: int = 1, valid: int = 3000) -> None:
    """train/valid .en/.de files (`pairs` and `valid` lines); the target maps each source word
    through a dictionary and reverses the order."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    src_words, tgt_words = synthetic_words(rng, WORDS), synthetic_words(rng, WORDS)
    zipf = 1.0 / np.arange(1, WORDS + 1)
    zipf /= zipf.sum()
    for split, count in (("train", pairs), ("valid", valid)):
        with open(folder / f"{split}.en", "w") as en, open(folder / f"{split}.de", "w") as de:
            for start in range(0, count, 50_000):
                n = min(50_000, count - start)
                lengths = np.clip(rng.lognormal(3.0, 0.6, n).astype(int), 1, 250)  # mean ~ 24 words
                ids = rng.choice(WORDS, size=int(lengths.sum()), p=zipf)
                bounds = np.concatenate([[0], np.cumsum(lengths)])
                en.writelines(
                    " ".join(src_words[ids[a:b]]) + "\n"
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                )
                de.writelines(
                    " ".join(tgt_words[ids[a:b]][::-1]) + "\n"
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                )


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants at once, in MB: the sum over the processes that
    run together (preparation's encoding workers beside their parent), which the peak RSS of
    any one of them (measure.peak_rss_mib) does not give."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            total += status_kib(current, ("VmRSS",))["VmRSS"]
            with open(f"/proc/{current}/task/{current}/children") as children:
                stack += [int(c) for c in children.read().split()]
        except (FileNotFoundError, KeyError, ProcessLookupError):
            continue
    return total / 1024


def run_measured(command: list[str]) -> tuple[float, float, str]:
    """(seconds, peak tree RSS in MB sampled every 0.2 s, stdout) of a child process."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peak = 0.0
    while child.poll() is None:
        peak = max(peak, tree_rss_mb(child.pid))
        time.sleep(0.2)
    output = child.stdout.read()
    if child.returncode:
        raise SystemExit(f"{command} failed with exit code {child.returncode}")
    return time.perf_counter() - started, peak, output


def prepare_in_child(corpus: Path, prepared: Path, vocab: int) -> dict:
    command = [
        sys.executable,
        "-m",
        __spec__.name,
        "--child-prepare",
        str(corpus),
        str(prepared),
        str(vocab),
    ]
    seconds, peak, output = run_measured(command)
    return {"seconds": seconds, "peak_mb": peak, **json.loads(output.strip().splitlines()[-1])}


def bench_data_config(corpus: str, prepared: str, vocab: str, **settings) -> DataConfig:
    """The generated corpus's data configuration (English into German, local files)."""
    return DataConfig(
        name="bench",
        source=SourceKind.files,
        dir=corpus,
        src_lang="en",
        tgt_lang="de",
        vocab_size=int(vocab),
        prepared_dir=prepared,
        **settings,
    )


def child_prepare(corpus: str, prepared: str, vocab: str) -> None:
    """Runs in the measured child process: prepare the corpus, print a JSON summary."""
    from transformer_mt.data.prepare import prepare

    data = prepare(bench_data_config(corpus, prepared, vocab))
    stats = json.loads((data.folder / "stats.json").read_text())
    print(
        json.dumps(
            {"folder": str(data.folder), "train": len(data.train), "phases": stats["seconds"]}
        )
    )


def tutorial_prepare(
    corpus: Path, model: Path, pairs: int, batch_size: int = 64
) -> tuple[float, float]:
    """The tutorial way on the first `pairs` lines: lists, one encode call per sentence, batches
    of a fixed number of sentences padded to their longest. Returns (seconds, padding share)."""
    import sentencepiece as spm
    import torch

    started = time.perf_counter()
    processor = spm.SentencePieceProcessor(model_file=str(model))
    with open(corpus / "train.en") as en, open(corpus / "train.de") as de:
        src = [line.strip() for _, line in zip(range(pairs), en, strict=False)]
        tgt = [line.strip() for _, line in zip(range(pairs), de, strict=False)]
    src_ids = [processor.encode(s) for s in src]
    tgt_ids = [processor.encode(t) for t in tgt]
    real = padded = 0
    for start in range(0, pairs, batch_size):
        chunk = tgt_ids[start : start + batch_size]
        width = max(len(t) for t in chunk) + 1
        batch = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, ids in enumerate(chunk):
            batch[row, : len(ids)] = torch.tensor(ids)
        real, padded = real + sum(len(t) + 1 for t in chunk), padded + batch.numel()
    _ = src_ids
    return time.perf_counter() - started, 1 - real / padded


def padding_share(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int) -> float:
    """Average share of padding in the target side of our batches."""
    batches = token_batches(src_lengths, tgt_lengths, max_tokens, seed=1, epoch=0)
    real = sum(int(tgt_lengths[b].sum()) + len(b) for b in batches)
    padded = sum(len(b) * (int(tgt_lengths[b].max()) + 1) for b in batches)
    return 1 - real / padded


def memory_mb() -> dict[str, int]:
    """This process's VmRSS, RssAnon and RssFile in MB."""
    return {
        key: kib // 1024 for key, kib in status_kib("self", ("VmRSS", "RssAnon", "RssFile")).items()
    }


def rank_reader(folder: str, rank: int, world_size: int, results: dict) -> None:
    """One data-parallel rank: open the store, walk all its batches touching every token; report
    its memory before opening the store (interpreter and libraries) and after the walk."""
    from transformer_mt.data.batching import collate
    from transformer_mt.data.store import ParallelTokens

    before = memory_mb()
    data = ParallelTokens.load(Path(folder), "train")
    batches = token_batches(
        data.src.lengths,
        data.tgt.lengths,
        25_000,
        seed=1,
        epoch=0,
        rank=rank,
        world_size=world_size,
    )
    for indices in batches:
        collate(data, indices, pad_id=0, bos_id=2, eos_id=3)
    results[rank] = {"before": before, "after": memory_mb(), "batches": len(batches)}


def sample_in_child(corpus: Path, prepared: Path, vocab: int, samples: int) -> dict:
    command = [sys.executable, "-m", __spec__.name, "--child-sample"]
    command += [str(corpus), str(prepared), str(vocab), str(samples)]
    seconds, peak, output = run_measured(command)
    return {"seconds": seconds, "peak_mb": peak, **json.loads(output.strip().splitlines()[-1])}


def child_sample(corpus: str, prepared: str, vocab: str, samples: str) -> None:
    """Runs in the measured child process: draw the sampled segmentations of both sides of a
    prepared corpus (subword regularization at alpha 0.1), print a JSON summary."""
    from transformer_mt.data.prepare import prepare
    from transformer_mt.data.subword_sampling import prepare_samples

    cfg = bench_data_config(
        corpus,
        prepared,
        vocab,
        src_subword_alpha=0.1,
        tgt_subword_alpha=0.1,
        subword_samples=int(samples),
    )
    data = prepare(cfg)
    started = time.perf_counter()
    folder = prepare_samples(cfg, data.folder, data.tokenizers, data.train)
    seconds = time.perf_counter() - started
    best = sum(path.stat().st_size for path in data.folder.glob("train.*"))
    drawn = sum(path.stat().st_size for path in folder.iterdir())
    print(json.dumps({"draw_seconds": seconds, "best_bytes": best, "samples_bytes": drawn}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_500_000, 1_000_000])
    parser.add_argument(
        "--slice", type=int, default=200_000, help="pairs for the tutorial comparison"
    )
    parser.add_argument("--vocab", type=int, default=37_000)
    parser.add_argument(
        "--multi30k", default=None, help="a Multi30k folder (train.de, train.en) for its padding"
    )
    parser.add_argument(
        "--workdir", default=None, help="where corpora are written (default: a temp dir)"
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=4,
        help="sampled segmentations to draw of the largest corpus (subword regularization; 0: "
        "none)",
    )
    parser.add_argument("--child-prepare", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--child-sample", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_prepare:
        child_prepare(*args.child_prepare)
        return
    if args.child_sample:
        child_sample(*args.child_sample)
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_data_"))
    print(*report_header("make bench-data: data preparation at WMT scale"), sep="\n")
    print(f"# workdir: {workdir}")
    prepared = {}
    for size in args.sizes:
        corpus = workdir / f"corpus_{size}"
        started = time.perf_counter()
        write_corpus(corpus, size)
        print(
            f"generated {size:,} pairs in {time.perf_counter() - started:.0f} s "
            f"({(corpus / 'train.en').stat().st_size / 1e6:,.0f} MB English)"
        )
        result = prepare_in_child(corpus, workdir / f"prepared_{size}", args.vocab)
        prepared[size] = result
        phases = result["phases"]
        work = phases["clean"] + phases["binarize"]
        print(
            f"prepare {size:,} pairs: clean + encode + binarize {work:.0f} s = "
            f"{size / work:,.0f} pairs/s; "
            f"SentencePiece training {phases['sentencepiece']:.0f} s; whole child process "
            f"{result['seconds']:.0f} s; peak RSS {result['peak_mb']:,.0f} MB (process tree); "
            f"{result['train']:,} pairs kept"
        )

    if args.samples:
        report_sampling(workdir, args.sizes[0], args.vocab, args.samples)

    size = args.sizes[-1]
    corpus = workdir / f"corpus_{size}"
    model = Path(prepared[size]["folder"]) / "spm.model"
    tutorial_seconds, tutorial_padding = tutorial_prepare(corpus, model, args.slice)
    phases = prepared[size]["phases"]
    ours_per_pair = (phases["clean"] + phases["binarize"]) / size
    print(
        f"tutorial approach (one process, lists, pad to longest) on {args.slice:,} pairs: "
        f"{args.slice / tutorial_seconds:,.0f} pairs/s, padding {tutorial_padding:.1%}; ours "
        f"{1 / ours_per_pair:,.0f} pairs/s (clean + encode + binarize): "
        f"{tutorial_seconds / args.slice / ours_per_pair:.1f}x faster"
    )

    multi30k = Path(args.multi30k) if args.multi30k else None
    if multi30k and (multi30k / "train.de").is_file():
        from transformer_mt.data.prepare import prepare

        cfg = DataConfig(
            name="multi30k_de_en",
            source=SourceKind.files,
            dir=str(multi30k),
            src_lang="de",
            tgt_lang="en",
            valid_split="val",
            vocab_size=8000,
            prepared_dir=str(workdir / "prepared_m30k"),
        )
        data = prepare(cfg)
        for budget in (4096, 25_000):
            share = padding_share(data.train.src.lengths, data.train.tgt.lengths, budget)
            print(
                f"Multi30k de->en, batches of {budget:,} tokens: "
                f"padding is {share:.2%} of target tokens"
            )

    largest = Path(prepared[args.sizes[0]]["folder"])
    manager = multiprocessing.Manager()
    results = manager.dict()
    ranks = [
        multiprocessing.Process(target=rank_reader, args=(str(largest), r, 2, results))
        for r in range(2)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    for rank in sorted(results.keys()):
        before, after = results[rank]["before"], results[rank]["after"]
        print(
            f"rank {rank} of 2 walking its {results[rank]['batches']:,} batches of the "
            f"{args.sizes[0]:,}-pair store: RSS {before['VmRSS']:,} MB before opening it, "
            f"{after['VmRSS']:,} MB after = {after['RssAnon']:,} MB private "
            f"(+{after['RssAnon'] - before['RssAnon']:,} MB for the data) "
            f"+ {after['RssFile']:,} MB "
            "shared file pages (the page cache, one copy for both ranks)"
        )


def report_sampling(workdir: Path, size: int, vocab: int, samples: int) -> None:
    """What subword regularization costs as we do it (samples drawn once, kept on disk) and
    what drawing them in the loader each epoch instead would (one sample's encoding, every
    epoch)."""
    corpus = workdir / f"corpus_{size}"
    result = sample_in_child(corpus, workdir / f"prepared_{size}", vocab, samples)
    seconds, mb = result["draw_seconds"], 1e6
    print(
        f"subword sampling of {size:,} pairs (both sides, alpha 0.1): {samples} samples drawn in "
        f"{seconds:.0f} s ({size * samples / seconds:,.0f} pairs/s), "
        f"{result['samples_bytes'] / mb:,.0f} MB on disk beside the best segmentation's "
        f"{result['best_bytes'] / mb:,.0f} MB; peak RSS {result['peak_mb']:,.0f} MB; drawn in the "
        f"loader instead: {seconds / samples:.0f} s of encoding every epoch"
    )


if __name__ == "__main__":
    main()
