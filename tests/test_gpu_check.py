"""make gpu-check (benchmarks/gpu_check.py): two commands of at most 5 minutes each, rehearsed
on the CPU with every figure they print; its code runs with only the packages of the lent GPU
machine's image and the wheels gpu_check.sh carries, and its preflight asks for every package
the image lacks; the GPU benchmarks set their process up as tmt-train does."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks import bench_decode, bench_train, gpu_check, gpu_decoding
from benchmarks.wmt_first_hour import seconds_per_update, validation_seconds
from transformer_mt import device

ROOT = Path(__file__).resolve().parents[1]

# What the lent GPU machine's image holds of what our code imports (besides the standard
# library): these and what they require.
GPU_IMAGE = (
    "torch", "transformers", "sentencepiece", "sacrebleu", "numpy", "tqdm", "tensorboard",
    "click", "joblib", "regex", "pytest",
)  # fmt: skip


def carried_wheels() -> list[str]:
    """The distributions gpu_check.sh carries in .whl/ (its WHEELS and SDIST_WHEELS)."""
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    lists = re.findall(r"^(?:SDIST_)?WHEELS=\(([^)]*)\)", script, re.MULTILINE)
    return [entry.split("==")[0] for words in lists for entry in words.split()]


def with_requirements(names: list[str] | tuple[str, ...]) -> set[str]:
    """`names` and every distribution they require, as installed here (extras left out)."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python
        found.add(name)
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def site_of(distributions: set[str], folder: Path) -> Path:
    """A site-packages folder that holds only `distributions` (links to this environment's
    files, their metadata included), for an interpreter started with -S."""
    folder.mkdir()
    for name in sorted(distributions):
        distribution = importlib.metadata.distribution(name)
        tops = {Path(file).parts[0] for file in distribution.files or []}
        for top in tops - {".."}:
            source = Path(distribution.locate_file(top))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder


def start_with_only(distributions: set[str], folder: Path, *arguments: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{site_of(distributions, folder)}{os.pathsep}{ROOT}"}
    return subprocess.Popen(
        [sys.executable, "-S", *arguments], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_gpu_check_run_imports_with_only_the_images_packages_and_the_carried_wheels(tmp_path):
    """Every module the check's commands run (gpu_check.RUN_MODULES), the tokenized BLEU that
    tmt-eval computes, and the collection of the gpu tests, in an interpreter that sees only the
    image's packages and the carried wheels (installed without their requirements: those must
    be in the image). The modules import without sacremoses too: the Moses tokenizer is imported
    where the tokenized BLEU first uses it. The three interpreters run at once."""
    allowed = with_requirements(GPU_IMAGE) | {canonicalize_name(n) for n in carried_wheels()}
    modules = f"import importlib; [importlib.import_module(m) for m in {gpu_check.RUN_MODULES!r}]"
    score = (
        "from transformer_mt.metrics import tokenized_bleu_scores as score; "
        "line = ['Ein junger Mann sitzt auf einer Bank im Park.']; "
        "print(score(line, line).bleu_tokenized)"
    )
    started = [
        start_with_only(allowed - {"sacremoses"}, tmp_path / "without", "-c", modules),
        start_with_only(allowed, tmp_path / "site", "-c", f"{modules}; {score}"),
        start_with_only(
            allowed, tmp_path / "tests", "-m", "pytest", "--collect-only", "-q", "-p",
            "no:cacheprovider", "tests/gpu",
        ),
    ]  # fmt: skip
    without_out, done_out, collected_out = [p.communicate(timeout=300) for p in started]
    without, done, collected = started
    assert without.returncode == 0, without_out[1][-3000:]
    assert done.returncode == 0 and done_out[0].split() == ["100.0"], done_out[1][-3000:]
    assert collected.returncode == 0, collected_out[0][-3000:] + collected_out[1][-3000:]


def test_the_wheels_and_the_preflight_cover_every_requirement_the_image_lacks():
    """Each of our requirements that the image does not bring is carried and checked before the
    check starts; but `datasets`, imported only to read a corpus from the Hugging Face hub, which
    a machine without a network cannot reach."""
    image = with_requirements(GPU_IMAGE)
    ours = [Requirement(line) for line in importlib.metadata.requires("transformer_mt") or []]
    needed = {canonicalize_name(r.name) for r in ours if r.marker is None} - image - {"datasets"}
    carried = {canonicalize_name(name) for name in carried_wheels()}
    assert needed <= carried, needed - carried
    checked = {canonicalize_name(name) for name in gpu_check.REQUIRED_DISTRIBUTIONS}
    assert needed <= checked, needed - checked


class SetUp(Exception):  # noqa: N818  (not an error: where a benchmark stopped, on purpose)
    """Raised by a stand-in for set_up_process: the device a benchmark set its process up for."""


def set_up_first(monkeypatch, module) -> None:
    def recorded(name: str, threads: int = 0):
        raise SetUp(name)

    monkeypatch.setattr(module, "set_up_process", recorded)


@pytest.mark.parametrize(
    "module,argv",
    [
        (bench_train, ["bench_train", "--device", "cuda:0"]),
        (gpu_decoding, ["gpu_decoding", "--device", "cuda:0"]),
        (bench_decode, ["bench_decode", "--generated", "10", "--device", "cuda:0"]),
    ],
)
def test_the_gpu_benchmarks_set_their_process_up_as_tmt_train_does(monkeypatch, module, argv):
    """Before they start CUDA: the allocator's expandable segments and TF32, as tmt-train has
    them (device.set_up_process), so that they time the allocator a training run uses."""
    set_up_first(monkeypatch, module)
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SetUp, match="^cuda:0$"):
        module.main()
    if module is bench_train:  # and each model's own process
        with pytest.raises(SetUp, match="^cuda:0$"):
            bench_train.worker(
                "ours", None, None, 0, [], 1, torch.device("cuda", 0), "inductor", None
            )


def test_set_up_process_gives_cuda_expandable_segments_before_it_starts_and_tf32(monkeypatch):
    started_with = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: started_with.append(
        os.environ.get("PYTORCH_ALLOC_CONF")))  # fmt: skip
    for name in device.ALLOCATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # torch's default: TF32 off
        assert device.set_up_process("cuda:0") == torch.device("cuda", 0)
        assert torch.backends.cuda.matmul.allow_tf32
        assert device.describe_set_up(torch.device("cuda", 0)) == (
            "cuda:0: CUDA allocator PYTORCH_ALLOC_CONF=expandable_segments:True; TF32 for float32 "
            "products on"
        )
    finally:
        torch.set_float32_matmul_precision(precision)
    assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert started_with in ([], ["expandable_segments:True"])


def test_the_prepared_run_is_two_commands_of_at_most_five_minutes_each(tmp_path):
    """`make gpu-check` with no argument: the first command (kernels, base eager and compiled,
    beam search) and the second (the Multi30k recipe), each within 300 s set-up included (the
    parts' limits: a part stopped at its limit keeps what it printed); the rest optional."""
    report = gpu_check.Report(tmp_path / "gpu.txt", tmp_path / "gpu.log")
    args = gpu_check.main_parser().parse_args([])
    assert args.parts == ["speed", "recipe"]
    for group, names in (
        ("speed", ["attention kernels", "base eager", "base compiled", "beam search"]),
        ("recipe", ["multi30k recipe"]),
    ):
        args.parts = [group]
        parts = gpu_check.chosen_parts(args, gpu_check.GPU, report)
        assert [part.name for part in parts] == names
        assert sum(part.limit for part in parts) <= 300 - 10  # the wheels' install: seconds


def start_rehearsal(folder: Path, group: str) -> subprocess.Popen:
    """`gpu_check.sh --rehearse-on-cpu --parts GROUP`, its report, log and output in `folder`.
    One thread a process (conftest.py's OMP_NUM_THREADS, which tmt-average's and tmt-eval's torch
    read), so that two rehearsals share two cores without waiting on each other's threads."""
    folder.mkdir()
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "GPU_CHECK_SITE": str(folder / "site"),
    }  # .whl/'s wheels, where it has some
    with open(folder / "output.txt", "w") as output:  # a file: a full pipe would stall it
        return subprocess.Popen(
            ["bash", "benchmarks/gpu_check.sh", "--rehearse-on-cpu", "--parts", group,
             "--output", str(folder / "gpu.txt"), "--log", str(folder / "gpu_check.log")],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip


def rehearsed(folder: Path, process: subprocess.Popen) -> str:
    """The report of a rehearsal started by start_rehearsal; every part must end well."""
    process.wait(timeout=300)
    report = (folder / "gpu.txt").read_text()
    assert process.returncode == 0, report[-3000:] + (folder / "output.txt").read_text()[-2000:]
    return report


RECORDED = {
    "kernels": r"^training, trainer\.source_lengths=equal \(one source length a batch; .*\n  "
    r"encoder self-attention \w+; decoder self-attention \w+; cross-attention \w+$",
    "eager pass": r"^  \.\. pass 2 of 2, ours: [\d,]+ target tok/s, [\d.]+ TFLOP/s, MFU .*, "
    r"[\d.]+ s/update$",
    "eager ratio": r"^  \.\. ours: pass 1 \(shapes unseen\) took [\d.]+x the last pass's time",
    "warm-up": r"^  \.\. ours compiled: 1 warm-up update\(s\) in [\d.]+ s$",
    "graphs": r"^  \.\. ours compiled: torch\.compile by the warm-up: 3 graph\(s\), \d+ "
    r"recompile\(s\)$",
    "compiled pass": r"^  \.\. pass 2 of 2, ours compiled: [\d,]+ target tok/s, .*, MFU ",
    "compiled ratio": r"^  \.\. ours compiled: pass 1 \(shapes unseen\) took [\d.]+x",
    "beam search": r"^  ours / transformers' speed: [\d.]+x; BLEU of ours against theirs",
}


@pytest.mark.slow
def test_both_commands_rehearse_on_the_cpu_and_print_every_figure(tmp_path):
    """Both commands at once, as small as they go (tiny models, torch.compile's eager backend).
    The first: the kernel of each call site, base eager and compiled in two passes (the pass
    figures, the unseen-shapes ratio, the compile's warm-up and graphs), beam search beside
    transformers' generate on both workloads (where the hf extra is installed). The second,
    from a fresh run folder on a generated corpus in Multi30k's layout: tmt-train
    --config-name multi30k_gpu (its log lines as they come), tmt-average, tmt-eval with
    averaged.pt and alpha=auto, the test BLEU and the wall time. Slow: about 25 s on a 2-core
    machine."""
    groups = ["recipe"]
    if importlib.util.find_spec("transformers") is not None:
        groups.append("speed")
    started = {group: start_rehearsal(tmp_path / group, group) for group in groups}
    reports = {group: rehearsed(tmp_path / group, process) for group, process in started.items()}
    report = reports["recipe"]
    for step in (
        "tmt-train --config-name multi30k_gpu: ok",
        "tmt-average last=auto: ok",
        "tmt-eval checkpoint=averaged.pt decode.length_penalty=auto: ok",
    ):
        assert step in report, report[-3000:]
    assert re.search(
        r"^   [\d:]{8} stopped: reached trainer.max_steps=6 after 6 updates", report, re.M
    )
    assert re.search(r"^recipe: test BLEU [\d.]+ in \d+ s of wall time", report, re.M), report
    if "speed" not in reports:
        pytest.skip("the first command's beam search needs the hf extra (make install)")
    report = reports["speed"]
    for name, pattern in RECORDED.items():
        assert re.search(pattern, report, re.MULTILINE), (name, report[-4000:])
    assert report.count("ours / transformers' speed:") == 2  # Multi30k-like and WMT-length
    summary = report[report.index("== summary") :].splitlines()[1:-1]
    assert len(summary) == 4 and all(" ok, " in line for line in summary), summary


LOG = [
    "[2026-12-04 17:40:00,000][transformer_mt.train.metrics][INFO] - update 50 epoch 0 loss=9.1 "
    "nll=9.0 ppl=8100.00 lr=1.0e-04 gnorm=1.0 tok/s=100000 elapsed=0.2min",
    "[2026-12-04 17:41:00,000][transformer_mt.train.metrics][INFO] - update 100 epoch 0 loss=8.0 "
    "nll=7.9 ppl=2700.00 lr=2.0e-04 gnorm=1.0 tok/s=250000 mfu=0.1 mfu_padded=0.1 elapsed=0.3min",
    "[2026-12-04 17:41:00,500][transformer_mt.train.trainer][INFO] - stopped: reached "
    "trainer.max_steps=100 after 100 updates, 0.3 min of training",
    "[2026-12-04 17:41:42,750][transformer_mt.train.metrics][INFO] - update 100: valid loss 7.5, "
    "nll 7.4, ppl 1600.00, BLEU 0.50",
]


def test_wmt_first_hours_projection_reads_the_late_windows_and_the_validation_from_the_log():
    """Seconds an update from the windows after the first half only (the first is the warm-up);
    the validation from 'stopped' to its result (benchmarks/wmt_first_hour.py, an optional
    run)."""
    assert seconds_per_update(LOG, 25_000, after=50) == pytest.approx(0.1)
    assert seconds_per_update(LOG, 25_000, after=0) == pytest.approx((0.25 + 0.1) / 2)
    assert validation_seconds(LOG) == pytest.approx(42.25)
