"""Values a command cannot run with are refused by their key before anything is written or
allocated: one line, exit 2 from the CLI, no run folder, no output file touched."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from console_commands import run_commands_together

from transformer_mt.commands.train import train
from transformer_mt.commands.translate import translate
from transformer_mt.config import DecodeConfig, ServeJob, compose_job
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.sdpa_backends=[efficient]", "trainer.sdpa_backends"),  # CUDA's kernels only
        ("trainer.sdpa_backends=[cudnn]", "trainer.sdpa_backends"),
        ("trainer.num_threads=-1", "trainer.num_threads"),
        # one enum for what multiplies on the CPU: each key takes its own values of it
        ("trainer.cpu_linear=int8", "trainer.cpu_linear"),
        ("decode.cpu_linear=int8_batch", "decode.cpu_linear"),
        ("decode.quantize=onednn", "decode.quantize"),
        ("decode.precision=fp16", "decode.precision"),  # one precision enum: fp16 trains only
        ("decode.length_penalty=nan", "decode.length_penalty"),
        ("decode.beam_size=100000", "decode.beam_size"),
    ],
)
def test_a_training_value_that_cannot_run_is_refused_before_the_run_folder(
    tiny_train_job, tmp_path, override, key
):
    job = tiny_train_job(override, "trainer.device=cpu", "trainer.max_steps=1")
    with pytest.raises(ConfigError) as refused:
        train(job)
    message = str(refused.value)
    assert f"config key '{key}'" in message and "\n" not in message
    assert not (tmp_path / "run").exists() and not (tmp_path / "prepared").exists()


def test_an_attention_kernel_the_cpu_has_may_be_listed_with_one_it_lacks(tiny_train_job):
    """[efficient, math]: SDPA passes over the kernel the CPU lacks and takes math."""
    trainer = tiny_train_job("trainer.sdpa_backends=[efficient,math]").trainer
    policy = ExecutionPolicy.for_training(trainer, torch.device("cpu"))
    assert [kernel.value for kernel in policy.attention] == ["efficient", "math"]


@pytest.mark.parametrize(
    "override",
    [
        "decode.length_penalty=1e308",
        "decode.length_penalty=inf",
        "decode.temperature=1e-300",
        "decode.temperature=inf",
        "decode.beam_size=100000",
    ],
)
def test_a_decode_value_that_cannot_run_is_refused_before_the_model_loads(tmp_path, override):
    kept = tmp_path / "out.txt"
    kept.write_text("a previous output\n")
    job = compose_job(
        "translate",
        [f"run_dir={tmp_path / 'no-run'}", f"output={kept}", "decode.strategy=sample", override],
    )
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        translate(job)
    assert kept.read_text() == "a previous output\n"


def test_a_server_whose_own_settings_refuse_every_request_does_not_start(monkeypatch):
    """decode.beam_size over max_beam_size would refuse every request that names no beam; a port
    outside 0-65535 failed after the model had loaded."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import uvicorn

    from transformer_mt.commands import serve as command
    from transformer_mt.serve import app as serve_app

    loaded = []
    monkeypatch.setattr(command, "load_translator", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(serve_app, "create_app", lambda translator, limits: "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: None)
    job = ServeJob(run_dir="unused", decode=DecodeConfig())
    for changed, key in [
        ({"decode": DecodeConfig(beam_size=32)}, "decode.beam_size"),
        ({"port": 70000}, "port"),
        ({"port": -1}, "port"),
    ]:
        with pytest.raises(ConfigError, match=f"config key '{key}'"):
            command.serve(dataclasses.replace(job, **changed))
    assert loaded == []


def test_the_cli_says_it_in_one_line_with_exit_2_and_writes_nothing(tmp_path):
    refused = [
        ("tmt-train", ["data=toy", "model=tiny", "trainer.device=cpu",
                       "trainer.sdpa_backends=[efficient]"], "trainer.sdpa_backends"),
        ("tmt-translate", ["decode.beam_size=100000"], "decode.beam_size"),
        ("tmt-translate", ["decode=sample", "decode.temperature=1e-300"], "decode.temperature"),
        ("tmt-serve", ["port=70000"], "port"),
        ("tmt-serve", ["host=no.such.host.invalid"], "host"),  # before the model loads
    ]  # fmt: skip
    commands = []
    for number, (command, settings, _) in enumerate(refused):
        folder = tmp_path / str(number)  # each command's own, to be left empty
        folder.mkdir()
        extra = [f"data.prepared_dir={folder / 'prepared'}"] if command == "tmt-train" else []
        commands.append([command, f"run_dir={folder / 'run'}", *extra, *settings])
    results = run_commands_together(commands)
    for number, ((_, _, key), result) in enumerate(zip(refused, results, strict=True)):
        stderr = result.stderr.decode()
        assert result.returncode == 2, stderr
        errors = [line for line in stderr.splitlines() if "[ERROR]" in line]
        assert len(errors) == 1 and f"config key '{key}'" in errors[0], stderr
        assert "Traceback" not in stderr
        assert list((tmp_path / str(number)).iterdir()) == []
