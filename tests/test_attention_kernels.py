"""trainer.sdpa_backends and decode.sdpa_backends: which kernels scaled_dot_product_attention may
use in the training step and in our searches, as the execution policy orders them ([auto]: ours,
on CUDA flash, efficient, math: cuDNN's per-shape plans and pytorch#196678 kept out). On the CPU,
a list that holds no CPU kernel (cudnn alone) is refused by its key before anything runs, and the
kernels each attention call may take (torch's flags, read inside the call) are the list's: the
proof that the switch reaches the call."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from toy_runs import trainer_for

from transformer_mt import execution
from transformer_mt.config import (
    DecodeConfig,
    ModelConfig,
    SdpaBackend,
    Strategy,
    TrainerConfig,
)
from transformer_mt.data.prepare import prepare
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.decode.translator import ModelSearch
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import Transformer
from transformer_mt.train.start import STEERING_KEYS


@pytest.fixture
def kernels_seen(monkeypatch) -> list[tuple[bool, bool]]:
    """(flash allowed, math allowed) as each attention call of the model finds torch's flags."""
    seen, attention = [], F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(
            (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
        )
        return attention(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return seen


def attend() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 5, 8, generator=generator).unbind(0)  # (B, H, L, Dh) each
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]  # (B, 1, 1, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def policy(*backends: SdpaBackend, device: str = "cpu") -> ExecutionPolicy:
    return ExecutionPolicy.for_training(
        TrainerConfig(sdpa_backends=list(backends)), torch.device(device)
    )


def test_the_switch_limits_the_kernels_and_default_leaves_torchs_choice(kernels_seen):
    reference = attend()
    with policy(SdpaBackend.math).forward():
        assert torch.allclose(attend(), reference, atol=1e-6)
    with policy(SdpaBackend.flash).forward():
        attend()
    with policy(SdpaBackend.default).forward():
        attend()
    attend()  # the context restores what it found
    assert kernels_seen == [(True, True), (False, True), (True, False), (True, True), (True, True)]
    with pytest.raises(ConfigError, match=r"'trainer.sdpa_backends'.*\[cudnn\]: none of these"):
        policy(SdpaBackend.cudnn)


def test_on_cuda_auto_orders_flash_efficient_math_and_keeps_cudnn_out(monkeypatch):
    """Checked without a GPU: the order the policy hands torch's sdpa_kernel."""
    handed = []
    monkeypatch.setattr(
        execution, "sdpa_kernel", lambda kernels, **_: handed.append(kernels) or nullcontext()
    )
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: nullcontext())
    cuda = policy(SdpaBackend.auto, device="cuda")
    assert cuda.attention == (SdpaBackend.flash, SdpaBackend.efficient, SdpaBackend.math)
    with cuda.forward():
        pass
    flash, efficient, math = (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    )
    assert handed == [[flash, efficient, math]]
    assert TrainerConfig().sdpa_backends == DecodeConfig().sdpa_backends == [SdpaBackend.auto]
    decoding = ExecutionPolicy.for_decoding(DecodeConfig(), torch.device("cuda"))
    assert decoding.attention == cuda.attention
    # torch's own choice: [default] anywhere, and [auto] where we have no order of our own
    assert policy(SdpaBackend.default, device="cuda").attention is None
    assert policy(SdpaBackend.auto).attention is None


def test_the_training_step_runs_under_trainer_sdpa_backends(tiny_train_job, kernels_seen):
    job = tiny_train_job("trainer.sdpa_backends=[math]")
    assert job.trainer.sdpa_backends == [SdpaBackend.math]  # composed as the enum
    data = prepare(job.data)
    trainer = trainer_for(job, data)
    trainer.metrics.close()
    batch = next(iter(trainer.epoch_loader()))
    assert torch.isfinite(trainer.train_step([batch]).loss)
    assert kernels_seen and set(kernels_seen) == {(False, True)}
    kernels_seen.clear()
    job.trainer.sdpa_backends = [SdpaBackend.flash]
    trainer = trainer_for(job, data)
    trainer.metrics.close()
    assert torch.isfinite(trainer.train_step([batch]).loss)
    assert kernels_seen and set(kernels_seen) == {(True, False)}


def test_our_searches_run_under_decode_sdpa_backends(kernels_seen):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1)
    search = ModelSearch(Transformer(cfg, vocab_size=30, pad_id=PAD_ID), torch.device("cpu"))
    sources = [[5, 6, 7], [8, 9]]
    greedy = DecodeConfig(strategy=Strategy.greedy, max_len_b=3)
    default = tokens(search.search(sources, greedy))
    kernels_seen.clear()
    math_only = dataclasses.replace(greedy, sdpa_backends=[SdpaBackend.math])
    assert tokens(search.search(sources, math_only)) == default
    assert kernels_seen and set(kernels_seen) == {(False, True)}
    with pytest.raises(ConfigError, match=r"'decode.sdpa_backends'.*\[cudnn\]: none of these"):
        search.search(sources, dataclasses.replace(greedy, sdpa_backends=[SdpaBackend.cudnn]))


def tokens(nbest_lists) -> list[list[list[int]]]:
    return [[list(hypothesis.tokens) for hypothesis in nbest] for nbest in nbest_lists]


def test_default_goes_alone_and_the_key_steers_a_resume(tiny_train_job):
    with pytest.raises(ConfigError, match=r"'trainer.sdpa_backends'.*got \[default,math\]"):
        tiny_train_job("trainer.sdpa_backends=[default,math]").validate()
    with pytest.raises(ConfigError, match=r"'trainer.sdpa_backends'.*got \[auto,flash\]"):
        tiny_train_job("trainer.sdpa_backends=[auto,flash]").validate()
    with pytest.raises(ConfigError, match="'decode.sdpa_backends'"):
        tiny_train_job("decode.sdpa_backends=[]").validate()
    with pytest.raises(Exception, match="fast"):  # not a kernel's name: refused when composed
        tiny_train_job("trainer.sdpa_backends=[fast]")
    assert "trainer.sdpa_backends" in STEERING_KEYS  # a resume may turn cuDNN off


def test_the_bitwise_gpu_tests_run_the_math_kernel_alone_under_the_policy(tiny_train_job):
    """tests/gpu/test_train_cuda.py's runs compared bitwise ask for the math kernel in their
    settings (BITWISE): under the execution policy on CUDA, whose forward() every micro-batch
    enters, flash, efficient and cuDNN's are off and math alone is on."""
    path = Path(__file__).parent / "gpu" / "test_train_cuda.py"
    spec = importlib.util.spec_from_file_location("gpu_test_train_cuda", path)
    gpu_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_tests)
    job = tiny_train_job(*gpu_tests.BITWISE)
    policy = ExecutionPolicy.for_training(job.trainer, torch.device("cuda"))
    cuda = torch.backends.cuda
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast on "cuda" without CUDA: disabled, and says so
        with policy.forward():
            enabled = [
                cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
                cuda.cudnn_sdp_enabled(), cuda.math_sdp_enabled(),
            ]  # fmt: skip
    assert enabled == [False, False, False, True]
