"""make gpu-check (benchmarks/gpu_check.py) on a machine like the lent GPU machine: its code runs
with only the packages of that machine's image and the wheels gpu_check.sh carries, and its
preflight asks for every package the image lacks."""

from __future__ import annotations

import importlib.metadata
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


def run_with_only(distributions: set[str], folder: Path, *arguments: str):
    env = {**os.environ, "PYTHONPATH": f"{site_of(distributions, folder)}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [sys.executable, "-S", *arguments], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_a_gpu_check_run_imports_with_only_the_images_packages_and_the_carried_wheels(tmp_path):
    """Every module the check's commands run (gpu_check.RUN_MODULES), the tokenized BLEU that
    tmt-eval computes, and the collection of the gpu tests, in an interpreter that sees only the
    image's packages and the carried wheels (installed without their requirements: those must
    be in the image). The modules import without sacremoses too: the Moses tokenizer is imported
    where the tokenized BLEU first uses it."""
    allowed = with_requirements(GPU_IMAGE) | {canonicalize_name(n) for n in carried_wheels()}
    modules = f"import importlib; [importlib.import_module(m) for m in {gpu_check.RUN_MODULES!r}]"
    without = run_with_only(allowed - {"sacremoses"}, tmp_path / "without", "-c", modules)
    assert without.returncode == 0, without.stderr[-3000:]
    score = (
        "from transformer_mt.metrics import tokenized_bleu_scores as score; "
        "line = ['Ein junger Mann sitzt auf einer Bank im Park.']; "
        "print(score(line, line).bleu_tokenized)"
    )
    done = run_with_only(allowed, tmp_path / "site", "-c", f"{modules}; {score}")
    assert done.returncode == 0 and done.stdout.split() == ["100.0"], done.stderr[-3000:]
    collected = run_with_only(
        allowed, tmp_path / "tests", "-m", "pytest", "--collect-only", "-q", "-p",
        "no:cacheprovider", "tests/gpu",
    )  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]


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
    def recorded(name: str):
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
            bench_train.worker("ours", None, None, 0, [], 1, torch.device("cuda", 0), None)


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
