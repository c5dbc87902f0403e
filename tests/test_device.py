"""Device choice on machines we do not have here: GPUs that torch cannot use, a system without
os.sched_getaffinity (macOS)."""

import os
import stat

import pytest
import torch

from transformer_mt import device
from transformer_mt.data.tokenizer import train_tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.errors import ConfigError

NVIDIA_SMI_TABLE = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.199.02   Driver Version: 470.199.02   CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
|   0  NVIDIA A100-SXM...  On   | 00000000:07:00.0 Off |                    0 |
|   1  NVIDIA A100-SXM...  On   | 00000000:0F:00.0 Off |                    0 |
+-------------------------------+----------------------+----------------------+"""
NVIDIA_SMI_LIST = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f1b1f9c-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5f1b1f9c-0000-0000-0000-000000000001)"""


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An `nvidia-smi` on PATH that prints a 2-GPU machine with a CUDA 11.4 driver."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then cat <<"EOF"\n{NVIDIA_SMI_LIST}\nEOF\n'
        f'else cat <<"EOF"\n{NVIDIA_SMI_TABLE}\nEOF\nfi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_gpus_that_torch_cannot_use_stop_the_run_with_the_cause(fake_nvidia_smi, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(ConfigError) as error:
        device.resolve_device("auto")
    message = str(error.value)
    assert "nvidia-smi lists 2 GPU(s) (NVIDIA A100-SXM4-40GB) but torch sees none" in message
    assert "built for CUDA 12.4, and the driver supports CUDA 11.4" in message
    assert "trainer.device=cpu" in message
    with pytest.raises(ConfigError, match="nvidia-smi lists 2 GPU"):
        device.resolve_device("cuda")


def test_a_cpu_only_wheel_on_a_gpu_machine_is_named(fake_nvidia_smi, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match="is a CPU-only build"):
        device.resolve_device("auto")


def test_the_cpu_is_used_where_there_is_no_gpu_and_where_it_is_asked_for(fake_nvidia_smi):
    assert device.resolve_device("cpu") == torch.device("cpu")  # explicit: no check
    device.check_no_unusable_gpus(None)  # no nvidia-smi: no GPU to miss
    device.check_no_unusable_gpus("No devices were found")


def test_sentencepiece_trains_without_sched_getaffinity(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # as on macOS
    assert device.usable_cpus() == (os.cpu_count() or 1)
    sentences = [s for pair in toy_pairs(300, seed=2) for s in pair]
    tokenizer = train_tokenizer(sentences, tmp_path / "spm.model", vocab_size=400)
    assert tokenizer.vocab_size == 400


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"), [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")]
)
def test_auto_prefers_cuda_then_apples_gpu_then_the_cpu_and_says_which(
    cuda, mps, expected, monkeypatch, caplog
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setattr(device, "nvidia_smi_with_gpus", lambda: None)
    with caplog.at_level("INFO", logger="transformer_mt"):
        assert device.resolve_device("auto").type == expected
    assert f"device=auto: {expected} (" in caplog.text


@pytest.fixture(autouse=True)
def allocator_settings_unset(monkeypatch):
    """Neither allocator variable set during a test, and whatever a test (or resolve_device
    inside it) sets undone after it."""
    for name in device.ALLOCATOR_SETTINGS:
        monkeypatch.setenv(name, os.environ.get(name, "placeholder"))
        monkeypatch.delenv(name)


def test_expandable_segments_are_asked_for_unless_the_user_configured_the_allocator():
    environ: dict[str, str] = {}
    assert device.use_expandable_segments(environ)
    assert environ == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):  # either name is the user's
        mine = {name: "max_split_size_mb:128"}
        assert not device.use_expandable_segments(mine)
        assert mine == {name: "max_split_size_mb:128"}


@pytest.mark.parametrize("name", ["auto", "cuda", "cuda:1"])
def test_a_cuda_device_gets_expandable_segments_before_cuda_starts(name, monkeypatch):
    seen_by_cuda = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # get_device_name is what starts CUDA (and reads the allocator's settings) in resolve_device
    monkeypatch.setattr(
        torch.cuda,
        "get_device_name",
        lambda: seen_by_cuda.append(os.environ.get("PYTORCH_ALLOC_CONF")),
    )
    assert device.resolve_device(name).type == "cuda"
    assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert seen_by_cuda in ([], ["expandable_segments:True"])


def test_the_cpu_and_a_users_allocator_setting_are_left_alone(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device.resolve_device("cpu")
    assert "PYTORCH_ALLOC_CONF" not in os.environ
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    device.resolve_device("cuda")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6"
    assert "PYTORCH_ALLOC_CONF" not in os.environ
