"""execution.py decides how a device runs the model: the rules the trainer, the model and the
search ask it (loss scaling, pinned batches, int8 off the CPU, a decoding step's attention, the
CPU's dropout masks, a cache's gather, the search's score dtype), on this CPU machine with the
devices it has not named."""

from __future__ import annotations

import pytest
import torch

from transformer_mt import execution
from transformer_mt.config import CpuLinear, DecodeConfig, Precision, TrainerConfig, compose_job
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy

# The detection itself, as imported before conftest's pin replaces it in the module.
from transformer_mt.execution import cpu_multiplies_bf16 as detected_native_bf16

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")


@pytest.mark.parametrize(
    ("precision", "device", "scales", "pins"),
    [
        (Precision.fp16, CUDA, True, True),
        (Precision.auto, CUDA, False, True),  # bf16
        (Precision.fp32, CPU, False, False),
        (Precision.bf16, CPU, False, False),
    ],
)
def test_the_trainer_scales_its_loss_in_fp16_and_pins_batches_for_cuda(
    precision, device, scales, pins
):
    policy = ExecutionPolicy.for_training(TrainerConfig(precision=precision), device)
    assert (policy.scales_loss, policy.pins_memory) == (scales, pins)


@pytest.mark.parametrize("native", [True, False])
def test_precision_auto_computes_in_fp32_on_every_cpu_and_in_bf16_on_cuda(monkeypatch, native):
    """The detection injected: a CPU reported with native bf16 products, and one without. On
    both, auto searches and trains in fp32: a search in bf16 would make a translation depend on
    its batch mates, and a training step does not gain at every width
    (execution.autocast_dtype)."""
    monkeypatch.setattr(execution, "cpu_multiplies_bf16", lambda: native)
    assert ExecutionPolicy.for_decoding(DecodeConfig(), CPU).dtype is None
    assert ExecutionPolicy.for_decoding(DecodeConfig(precision=Precision.auto), CPU).dtype is None
    for config in (TrainerConfig(), TrainerConfig(precision=Precision.auto)):
        assert ExecutionPolicy.for_training(config, CPU).dtype is None
    # bf16 asks for it; int8 weights compute in fp32; CUDA's auto is bf16 on any host.
    bf16 = DecodeConfig(precision=Precision.bf16)
    assert ExecutionPolicy.for_decoding(bf16, CPU).dtype == torch.bfloat16
    assert ExecutionPolicy.for_decoding(DecodeConfig(quantize=CpuLinear.int8), CPU).dtype is None
    bf16 = TrainerConfig(precision=Precision.bf16)
    assert ExecutionPolicy.for_training(bf16, CPU).dtype == torch.bfloat16
    assert ExecutionPolicy.for_training(TrainerConfig(), CUDA).dtype == torch.bfloat16
    assert ExecutionPolicy.for_decoding(DecodeConfig(), CUDA).dtype == torch.bfloat16


def test_the_cpus_bf16_products_are_asked_of_the_instructions_not_of_onednns_emulation(
    monkeypatch, caplog
):
    """On x86, oneDNN's bf16 check is True on any AVX512-BW CPU, where it emulates bf16 products
    slower than fp32: the detection asks for AVX512-BF16 itself, once, and logs its answer."""
    monkeypatch.setattr(execution.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    for native, said in ((False, "lacks AVX512-BF16"), (True, "has AVX512-BF16: precision=bf16")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda n=native: n)
        detected_native_bf16.cache_clear()
        with caplog.at_level("INFO", logger="transformer_mt.execution"):
            assert detected_native_bf16() is native
            assert detected_native_bf16() is native
        assert caplog.text.count(said) == 1, caplog.text
        caplog.clear()
    detected_native_bf16.cache_clear()


@pytest.mark.parametrize("quantize", [CpuLinear.int8, CpuLinear.int8_batch])
def test_a_search_policy_multiplies_by_int8_on_the_cpu_only(quantize):
    """decode.quantize is the search's CPU products, decided with the rest of its policy; on a
    GPU it is refused by its key, in one line."""
    decode = DecodeConfig(quantize=quantize)
    assert ExecutionPolicy.for_decoding(decode, CPU).cpu_products == quantize
    with pytest.raises(ConfigError, match=r"^config key 'decode\.quantize': .* CPU only") as no:
        ExecutionPolicy.for_decoding(decode, CUDA)
    assert "\n" not in str(no.value)


def test_old_settings_keep_their_values():
    """The one CPU-products enum and the one precision enum take the values the keys took
    before they were merged (and a run's config.yaml writes them as it did)."""
    job = compose_job(
        "eval",
        [
            "run_dir=x",
            "decode.quantize=int8_batch",
            "decode.cpu_linear=torch",
            "decode.precision=bf16",
        ],
    )
    decode = job.decode
    assert (decode.quantize, decode.cpu_linear, decode.precision) == (
        CpuLinear.int8_batch,
        CpuLinear.torch,
        Precision.bf16,
    )
    defaults = compose_job("train").decode
    assert (defaults.quantize.value, defaults.cpu_linear.value) == ("none", "onednn")


def test_a_decoding_steps_attention_on_the_cpu_is_two_products_in_fp32_alone():
    step = torch.zeros(4, 2, 1, 8)  # one query row
    assert execution.attends_few_queries(step, training=False)
    assert not execution.attends_few_queries(step, training=True)  # dropout: SDPA's
    assert not execution.attends_few_queries(torch.zeros(4, 2, 3, 8), training=False)
    assert not execution.attends_few_queries(step.bfloat16(), training=False)


def test_device_rules_for_dropout_gathers_and_scores():
    assert execution.draws_cpu_dropout_masks(torch.zeros(3))
    assert execution.gathers_in_place(CPU) and execution.gathers_in_place(CUDA)
    assert not execution.gathers_in_place(MPS)
    assert execution.score_dtype(CPU) == execution.score_dtype(CUDA) == torch.float64
    assert execution.score_dtype(MPS) == torch.float32  # MPS has no float64
