"""make install's torch build on machines we do not have here: a fake `nvidia-smi` on PATH prints
the driver's "CUDA Version", scripts/torch_index.py prints pip's index arguments (or which driver
is needed), `make -n install` shows them; device.py names the same build when torch cannot use
the GPUs."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_mt import device, torch_builds
from transformer_mt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def smi_table(driver: str, cuda: str) -> str:
    """The head of nvidia-smi's table, as a driver of this version prints it."""
    rule = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    return "\n".join(
        [
            rule,
            f"| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}     |",
            rule.replace("+", "|"),
            "|   0  NVIDIA A100-SXM4-80GB   On  |   00000000:07:00.0 Off |     0 |",
            rule,
        ]
    )


GPU_LIST = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5f1b1f9c-0000-0000-0000-000000000000)"


def fake_nvidia_smi(folder: Path, driver: str, cuda: str) -> Path:
    """An `nvidia-smi` in `folder` that prints the table (`-L`: the GPU list) with shell
    built-ins only."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    lines = " ".join(f"'{line}'" for line in smi_table(driver, cuda).splitlines())
    script.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = \"-L\" ]; then printf '%s\\n' '{GPU_LIST}'; exit 0; fi\n"
        f"printf '%s\\n' {lines}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"


def failing_nvidia_smi(folder: Path, status: int = 18, said: str = MISMATCH) -> str:
    """PATH with an `nvidia-smi` that says `said` on stderr and exits with `status`, as one
    does after a driver upgrade without a reboot."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def torch_index(path: str, *arguments: str) -> subprocess.CompletedProcess:
    """scripts/torch_index.py run as make install runs it, with PATH = `path`."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "torch_index.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path},
    )


def with_fake(tmp_path: Path, driver: str, cuda: str) -> str:
    return f"{fake_nvidia_smi(tmp_path / 'bin', driver, cuda)}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize(
    ("driver", "cuda", "index"),
    [
        ("570.86.10", "12.8", "cu126"),  # torch 2.13 has no cu128: the newest it runs is cu126
        ("560.35.03", "12.6", "cu126"),
        ("580.65.06", "13.0", "cu130"),
        ("590.44.01", "13.1", "cu130"),
    ],
)
def test_the_driver_s_cuda_version_picks_the_newest_build_it_runs(tmp_path, driver, cuda, index):
    result = torch_index(with_fake(tmp_path, driver, cuda))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"--index-url https://download.pytorch.org/whl/{index}"


def test_a_driver_older_than_every_build_is_one_line_naming_the_driver(tmp_path):
    result = torch_index(with_fake(tmp_path, "550.54.15", "12.4"))
    assert result.returncode == 1
    assert result.stdout == ""
    message = result.stderr.strip()
    assert "\n" not in message
    assert "no build for a driver of CUDA 12.4" in message
    assert "update the driver to R560 or newer (R580 for cu130" in message
    assert "TORCH_CUDA=cu126 to try it on this driver" in message and "TORCH_CUDA=cpu" in message
    cuda_11 = torch_index(with_fake(tmp_path, "470.199.02", "11.4")).stderr
    assert "no build for a driver of CUDA 11.4" in cuda_11
    assert "TORCH_CUDA=cu126" not in cuda_11  # a CUDA 12 build does not run on a CUDA 11 driver


def test_without_nvidia_smi_the_cpu_build_is_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    result = torch_index(str(tmp_path / "empty"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == CPU_INDEX


def test_an_nvidia_smi_that_fails_stops_the_choice_with_what_it_said(tmp_path):
    result = torch_index(failing_nvidia_smi(tmp_path / "bin"))
    assert result.returncode == 1 and result.stdout == ""
    message = result.stderr.strip()
    assert "\n" not in message
    assert message.startswith(f"make install: nvidia-smi failed (exit status 18): {MISMATCH}.")
    assert "reboot" in message and "TORCH_CUDA=cpu|cu126|cu130" in message
    assert torch_index(failing_nvidia_smi(tmp_path / "bin"), "cpu").stdout.strip() == CPU_INDEX


def test_an_nvidia_smi_that_finds_no_gpu_gives_the_cpu_build(tmp_path):
    path = failing_nvidia_smi(tmp_path / "bin", status=6, said="No devices were found")
    result = torch_index(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == CPU_INDEX


def test_torch_cuda_overrides_the_driver(tmp_path):
    path = with_fake(tmp_path, "580.65.06", "13.0")
    assert torch_index(path, "cu126").stdout.strip().endswith("/whl/cu126")
    assert torch_index(path, "cpu").stdout.strip() == CPU_INDEX
    old = with_fake(tmp_path, "535.104.05", "12.2")  # too old for detection, not for an override
    assert torch_index(old, "cu126").stdout.strip().endswith("/whl/cu126")
    result = torch_index(path, "cu128")
    assert result.returncode == 1
    assert "TORCH_CUDA=cu128: torch 2.13 has no such build; one of cpu, cu126, cu130" in (
        result.stderr
    )


def test_the_chooser_imports_neither_torch_nor_the_installed_package():
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import transformer_mt.torch_builds; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize(
    ("cuda", "build"), [((12, 5), None), ((12, 6), "cu126"), ((12, 9), "cu126"), ((13, 0), "cu130")]
)
def test_the_build_for_a_driver(cuda, build):
    assert torch_builds.build_for_driver(cuda) == build
    assert torch_builds.driver_cuda(smi_table("x", f"{cuda[0]}.{cuda[1]}")) == cuda


def test_the_builds_listed_are_those_of_the_torch_make_install_takes():
    version = re.search(r"^TORCH_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version is not None
    assert version.group(1).startswith(f"{torch_builds.TORCH_SERIES}.")


def make_dry_run(tmp_path: Path, path: str, *variables: str) -> subprocess.CompletedProcess:
    """`make -n install` (what it would run: stdout) for a virtual environment that does not
    exist, with PATH = `path`."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAKE")}
    venv = tmp_path / "venv"
    result = subprocess.run(
        [
            make,
            "-n",
            "-C",
            str(ROOT),
            "install",
            f"VENV={venv}",
            f"PYTHON={sys.executable}",
            *variables,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PATH": path},
    )
    assert result.returncode == 0, result.stderr
    assert not venv.exists()
    return result


def test_make_install_takes_the_index_torch_cuda_names(tmp_path):
    path = with_fake(tmp_path, "580.65.06", "13.0")
    commands = make_dry_run(tmp_path, path, "TORCH_CUDA=cu126").stdout
    assert '--index-url https://download.pytorch.org/whl/cu126 "torch==2.13.0"' in commands
    # export-cuda: CTranslate2's cuBLAS 12
    assert '-e ".[dev,export,hf,serve,sweep,slurm,export-cuda]"' in commands


def test_make_install_keeps_the_cpu_wheel_without_nvidia_smi(tmp_path):
    (tmp_path / "empty").mkdir()
    commands = make_dry_run(tmp_path, str(tmp_path / "empty")).stdout
    assert f'{CPU_INDEX} "torch==2.13.0"' in commands
    assert '-e ".[dev,export,hf,serve,sweep,slurm]"' in commands


def test_make_install_stops_on_a_driver_too_old(tmp_path):
    result = make_dry_run(tmp_path, with_fake(tmp_path, "550.54.15", "12.4"))
    assert "make install: torch 2.13 has no build for a driver of CUDA 12.4" in result.stderr
    assert 'test -n ""' in result.stdout  # the recipe stops there, before the virtual environment
    assert "--index-url" not in result.stdout


def test_make_install_stops_on_an_nvidia_smi_that_fails(tmp_path):
    result = make_dry_run(tmp_path, failing_nvidia_smi(tmp_path / "bin"))
    assert f"make install: nvidia-smi failed (exit status 18): {MISMATCH}" in result.stderr
    assert 'test -n ""' in result.stdout  # the recipe stops there, before the virtual environment
    assert "index-url" not in result.stdout  # neither a CUDA build nor the CPU one


def test_training_stops_on_an_nvidia_smi_that_fails(tmp_path, monkeypatch, tiny_train_job):
    from transformer_mt.commands.train import train

    monkeypatch.setenv("PATH", failing_nvidia_smi(tmp_path / "bin"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as with a broken driver
    job = tiny_train_job("trainer.device=auto")
    with pytest.raises(ConfigError) as stopped:
        train(job)
    message = str(stopped.value)
    assert message.startswith(f"nvidia-smi failed (exit status 18): {MISMATCH}: ")
    assert "trainer.device=cpu" in message
    assert not Path(job.run_dir).exists()  # stopped before anything was written


# ---- device.py: the fix named when torch cannot use the GPUs ----------------------------------
def unusable_gpus_message(monkeypatch, cuda: str, wheel_cuda: str | None) -> str:
    monkeypatch.setattr(torch.version, "cuda", wheel_cuda)
    build = "cpu" if wheel_cuda is None else "cu" + wheel_cuda.replace(".", "")
    monkeypatch.setattr(torch, "__version__", f"2.13.0+{build}")
    with pytest.raises(ConfigError) as error:
        device.check_no_unusable_gpus(smi_table("x", cuda) + "\n" + GPU_LIST)
    message = str(error.value)
    assert "\n" not in message and "cu121" not in message
    assert "trainer.device=cpu" in message
    return message


def test_a_cuda_12_4_driver_is_told_which_driver_torch_needs(monkeypatch):
    message = unusable_gpus_message(monkeypatch, "12.4", "13.0")
    assert "built for CUDA 13.0, and the driver supports CUDA 12.4 (a driver older" in message
    assert "torch 2.13 has no build for a driver of CUDA 12.4" in message
    assert "update the driver to R560 or newer" in message


def test_a_cuda_12_8_driver_is_told_the_index_of_the_build_it_runs(monkeypatch):
    message = unusable_gpus_message(monkeypatch, "12.8", "13.0")
    assert (
        "pip install torch==2.13.0+cu126 --index-url https://download.pytorch.org/whl/cu126"
        in message
    )
    assert "TORCH_CUDA=cu126" in message
    message = unusable_gpus_message(monkeypatch, "12.8", None)  # a CPU wheel on a GPU machine
    assert "is a CPU-only build" in message and "/whl/cu126" in message


def test_a_build_that_suits_the_driver_points_elsewhere(monkeypatch):
    message = unusable_gpus_message(monkeypatch, "13.0", "13.0")
    assert "(a driver older" not in message
    assert "CUDA_VISIBLE_DEVICES" in message and "--index-url" not in message
