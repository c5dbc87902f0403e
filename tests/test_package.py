"""A real install: the wheel, installed (not editable) into a fresh virtual environment outside
the source tree, runs the commands from another folder with the presets it carries."""

import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from transformer_mt.export.transformers import HF_REQUIREMENT, HF_TORCH_REQUIREMENT

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_installed_wheel_trains_and_translates_from_any_folder(tmp_path):
    source = tmp_path / "source"  # what the wheel is built from, so the checkout stays clean
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "transformer_mt",
        source / "transformer_mt",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(wheels), str(source)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("transformer_mt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "transformer_mt/configs/demo.yaml" in names
    assert "transformer_mt/configs/model/base.yaml" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)

    # A fresh environment; the dependencies (torch, ...) are borrowed from this one's
    # site-packages, whose editable install of the source tree is not activated there.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: where this environment holds a non-editable install of the package
    # (pip install ".[dev]"), pip would see it through the borrowed path and install nothing.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
        + ["--quiet", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        check=True,
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(command: list[str], stdin: str | None = None) -> str:
        done = subprocess.run(
            [str(venv / "bin" / command[0]), *command[1:]],
            cwd=elsewhere,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    location = run(["python", "-c", "import transformer_mt; print(transformer_mt.__file__)"])
    assert Path(location.strip()).is_relative_to(venv)
    run(
        ["tmt-train", "--config-name", "demo", "run_dir=runs/wheel"]
        + ["trainer.max_steps=2", "trainer.max_time_minutes=0", "trainer.valid_every=0"]
        + ["trainer.valid_bleu_sentences=0", "trainer.progress_bar=false"]
        + ["data.toy_sizes=[2000,20,20]", "data.vocab_size=500"]
    )
    assert (elsewhere / "runs" / "wheel" / "checkpoints" / "last.pt").is_file()
    output = run(
        ["tmt-translate", "run_dir=runs/wheel", "decode=greedy"], "the dog sleeps.\nthe man.\n"
    )
    assert len(output.splitlines()) == 2


def test_the_hf_extra_is_what_the_export_asks_for():
    """The `hf` extra's versions, and the ones that tmt-export's error message names, are one."""
    (extra,) = re.findall(r"^hf = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert re.findall(r'"([^"]+)"', extra) == [HF_REQUIREMENT, HF_TORCH_REQUIREMENT]
