"""trainer.compile: the setting and its auto rule, eager fallback without build tools, a compiled
micro-batch equal to an eager one, and shapes that stop making new graphs."""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code
from toy_runs import TINY_TRAIN, trainer_for

from transformer_mt import execution
from transformer_mt.commands.train import train
from transformer_mt.config import CpuLinear, ModelConfig, Precision, TrainerConfig, compile_setting
from transformer_mt.data.batching import collate, pad_sequences, token_batches
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy, should_compile
from transformer_mt.model import EncoderLayer, Transformer
from transformer_mt.run_dir import RunDir
from transformer_mt.train import compiling
from transformer_mt.train.compiling import CompileCounts
from transformer_mt.train.loss import TrainingLoss, compiled_softmax_terms

CPU = torch.device("cpu")
EAGER = ExecutionPolicy.for_training(
    TrainerConfig(compile="false", cpu_linear=CpuLinear.torch), CPU
)
"""An eager policy with torch's products: the loss over the model as it is."""


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("auto", None),
        (True, True),
        ("True", True),
        ("true", True),
        (False, False),
        ("false", False),
    ],
)
def test_compile_setting_reads_what_hydra_hands_over(given, meant):
    assert compile_setting(given) is meant


def test_a_bad_compile_setting_names_the_key():
    with pytest.raises(ConfigError, match="config key 'trainer.compile': 'yes' is not one of"):
        compile_setting("yes")


def test_a_bad_compile_setting_is_refused_before_anything_is_written(tiny_train_job, tmp_path):
    """A new run: no run folder and no prepared data; a run that exists: byte for byte."""
    job = tiny_train_job("trainer.compile=maybe")
    with pytest.raises(ConfigError, match="trainer.compile"):
        train(job)
    assert not (tmp_path / "run").exists() and not (tmp_path / "prepared").exists()
    run = RunDir(job.run_dir)
    run.write_config(tiny_train_job())
    run.append_history({"event": "start", "kind": "new", "step": 0})
    before = {path: path.read_bytes() for path in run.path.rglob("*")}
    with pytest.raises(ConfigError, match="trainer.compile"):
        train(job)
    assert {path: path.read_bytes() for path in run.path.rglob("*")} == before


def test_auto_leaves_compile_off_on_the_cpu_and_says_why(caplog):
    with caplog.at_level(logging.INFO):
        assert should_compile("auto", CPU) is False
    assert "trainer.compile=auto: off on the CPU" in caplog.text


def test_without_a_compiler_training_is_eager_with_one_line(monkeypatch, caplog):
    monkeypatch.setattr(execution.shutil, "which", lambda name: None)
    with caplog.at_level(logging.INFO):
        assert should_compile("true", CPU) is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_without_python_headers_training_is_eager(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(execution.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    with caplog.at_level(logging.WARNING):
        assert should_compile("true", CPU) is False
    assert "Python headers" in caplog.text and "python3-dev" in caplog.text


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0
    )
    return Transformer(cfg, vocab_size=50, pad_id=0)


def batch(rows: int, src_length: int, tgt_length: int, seed: int):
    """A padded batch of random pairs (ids 3..49) with lengths up to the given ones."""
    rng = np.random.default_rng(seed)

    def side(length: int) -> list[np.ndarray]:
        sizes = rng.integers(1, length + 1, rows)
        sizes[0] = length
        return [rng.integers(3, 50, size) for size in sizes]

    src, tgt = side(src_length), side(tgt_length)
    return (
        pad_sequences(src, 0, suffix=2),
        pad_sequences(tgt, 0, prefix=1),
        pad_sequences(tgt, 0, suffix=2),
    )


def loss_and_gradients(module: torch.nn.Module, tensors) -> tuple[torch.Tensor, list]:
    module.zero_grad(set_to_none=True)
    sums = module(*tensors)
    sums.loss.backward()
    return sums, [p.grad.clone() for p in module.parameters()]


@pytest.mark.slow
def test_compiled_layers_equal_eager_ones_and_every_layer_shares_their_graphs():
    # fp32, dropout off: the compiled layers compute the same sums in another order (fused
    # kernels), so loss, nll and every gradient agree to float32 rounding; 1e-5 of each tensor's
    # largest entry is two orders of magnitude above it and far below any real difference.
    model = tiny_model()
    eager = TrainingLoss.for_policy(model, EAGER, epsilon=0.1, pad_id=0)
    policy = ExecutionPolicy.for_training(TrainerConfig(compile="true"), CPU)
    compiled = TrainingLoss.for_policy(model, policy, epsilon=0.1, pad_id=0)
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    shapes = [(6, 11, 9), (5, 17, 21), (7, 30, 12), (3, 9, 28), (8, 22, 19), (4, 14, 6)]
    graphs = []
    for seed, (rows, src_length, tgt_length) in enumerate(shapes):
        tensors = batch(rows, src_length, tgt_length, seed)
        want, want_grads = loss_and_gradients(eager, tensors)
        got, got_grads = loss_and_gradients(compiled, tensors)
        assert int(got.n_tokens) == int(want.n_tokens)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=0)
        torch.testing.assert_close(got.nll, want.nll, rtol=1e-5, atol=0)
        for g, w in zip(got_grads, want_grads, strict=True):
            assert (g - w).abs().max() <= 1e-5 * w.abs().max()
        graphs.append(CompileCounts.now())
    # One graph for the encoder's layers, one for the decoder's and one for the loss's chunks,
    # traced once with dynamic shapes: no layer after the first of its stack, no later chunk,
    # and no later shape of these batches, compiles again.
    assert graphs[0].graphs == 3 and graphs[-1] == graphs[0], graphs


@pytest.mark.slow
def test_a_compiled_layer_fuses_its_residual_add_dropout_and_layer_norm_forward_and_backward():
    # The elementwise half of an eager step (issue 46): per sublayer a dropout mask, its product,
    # the residual add, LayerNorm and autocast's casts, each its own pass. Compiled, each
    # sublayer's add, dropout and LayerNorm are one kernel forward (their casts with them), and
    # the backwards of dropout and LayerNorm one kernel too (Inductor names a kernel by the
    # operators it fuses).
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, dropout=0.1)
    layer = EncoderLayer(cfg).train()
    x = torch.randn(4, 10, 32, requires_grad=True)
    keep = torch.ones(4, 10, dtype=torch.bool)
    compiled = torch.compile(layer, dynamic=True)

    def step():
        with ExecutionPolicy.for_training(TrainerConfig(precision=Precision.bf16), CPU).forward():
            out = compiled(x, keep)
        out.sum().backward()

    torch._dynamo.reset()
    _, (forward, backward) = run_and_get_code(step)
    fused = "add_native_dropout_native_layer_norm"
    assert len(set(re.findall(rf"cpp_fused_\w*{fused}\w*", forward))) == 2, forward  # 2 sublayers
    assert re.search(r"cpp_fused_\w*native_dropout_backward_native_layer_norm_backward", backward)


def test_recompiles_are_counted_and_warned_about_at_the_limit(caplog):
    # Static shapes: each new length compiles the frame again, so 3 lengths are 2 recompiles
    # (Dynamo's own counters have no entry for them: the count comes from its callbacks).
    torch._dynamo.reset()  # which also forgets the callbacks: the watch registers its own after
    watch = compiling.CompileWatch(warn_after=2)
    before = CompileCounts.now().recompiles
    double = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    with caplog.at_level(logging.INFO, logger=compiling.__name__):
        for length in (3, 4, 5, 5):
            double(torch.ones(length))
            watch.check(length)
    assert CompileCounts.now().recompiles - before == 2
    assert "torch.compile recompiled" in caplog.text
    # and why: at each recompile, the guard each earlier graph failed (the length: 3, then 4)
    logged = [r.getMessage() for r in caplog.records]
    reasons = [m for m in logged if m.startswith("torch.compile recompiled <lambda>")]
    assert len(reasons) >= 2 and all("size mismatch" in m for m in reasons), reasons


class Planted:
    """A pickle that, when loaded, creates the file `marker` (the payload of a planted cache)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.slow
def test_a_cache_planted_in_the_run_folder_runs_nothing(tiny_train_job, tmp_path, monkeypatch):
    """The review's probe: a run folder whose compile-cache/ holds a pickle in every graph's
    folder (as a copied run folder, or an older version's, would), resumed with
    trainer.compile=true. Before, torch unpickled it while compiling the first update. Now the
    folder is named and never read; the resumed run takes its kernels from the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that the test's end restores it
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")  # the user's choice: none
    user_cache = tmp_path / "xdg" / "transformer_mt" / "compile"
    quick = ["trainer.compile=true", "trainer.valid_every=0", "trainer.valid_bleu_sentences=0"]
    run = Path(train(tiny_train_job(*quick, "trainer.max_steps=1")).parents[1])
    planted = run / "compile-cache"
    if not planted.is_dir():  # where the kernels are now, copied as an older version kept them
        (written,) = user_cache.iterdir()
        shutil.copytree(written, planted)
    marker = tmp_path / "the planted pickle ran"
    graphs = [*planted.glob("fxgraph/*/*"), *planted.glob("aotautograd/*")]
    assert graphs
    for folder in graphs:
        (folder / "planted").write_bytes(pickle.dumps(Planted(marker)))
    torch._dynamo.reset()  # a new process would start with no graphs in memory
    torch._dynamo.utils.counters.clear()
    try:
        train(tiny_train_job(*quick, "trainer.max_steps=2"))
        failed = None
    except Exception as error:  # before: torch failed on what the pickle gave it, after running it
        failed = error
    assert not marker.exists(), "the planted pickle ran"
    assert failed is None, failed
    counters = torch._dynamo.utils.counters["inductor"]
    assert counters["fxgraph_cache_hit"] > 0 and counters["fxgraph_cache_miss"] == 0, counters


@pytest.fixture(scope="module")
def compiled_by_a_new_process(tmp_path_factory) -> tuple[Path, list[str], dict]:
    """A folder where a new process (tmt-train, one update, trainer.compile=true) wrote its user
    cache under XDG_CACHE_HOME (xdg/), its command and its environment. Written by a new process:
    a test process's torch state (left by earlier tests in the same worker) can give its kernels
    other keys than a new process's, and then a copy's kernels would never be read."""
    folder = tmp_path_factory.mktemp("compiled")
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "xdg")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the user's choice: none
    overrides = [
        *TINY_TRAIN,
        "trainer.compile=true",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        f"data.prepared_dir={folder / 'prepared'}",
    ]
    command = [str(Path(sys.executable).parent / "tmt-train"), *overrides]
    first = subprocess.run(
        [*command, f"run_dir={folder / 'run'}", "trainer.max_steps=1"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    return folder, command, env


@pytest.mark.slow
def test_a_damaged_compile_cache_is_one_line_naming_it(compiled_by_a_new_process, tmp_path):
    """The review's damaged cache: every shared library of the user's cache garbled, read by a
    new process (a copy of the module's cache, its run folder continued in a copy too)."""
    written, command, env = compiled_by_a_new_process
    shutil.copytree(written, tmp_path / "copy")
    env = {**env, "XDG_CACHE_HOME": str(tmp_path / "copy" / "xdg")}
    user_cache = tmp_path / "copy" / "xdg" / "transformer_mt" / "compile"
    (in_use,) = user_cache.iterdir()
    libraries = list(in_use.rglob("*.so"))
    assert libraries
    for library in libraries:
        garbled = library.with_name(library.name + ".garbled")
        garbled.write_bytes(os.urandom(256))
        os.replace(garbled, library)
    run_dir = f"run_dir={tmp_path / 'copy' / 'run'}"
    result = subprocess.run(
        [*command, run_dir, "trainer.max_steps=2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    (error,) = [line for line in result.stderr.splitlines() if "[ERROR]" in line]
    assert f"torch.compile failed (its cache: {in_use})" in error
    assert f"delete {in_use} to compile afresh" in error and "Traceback" not in result.stderr


def compile_id(frame: int, compilation: int):
    """What Dynamo's end-of-compilation callback receives for `compilation` of `frame`."""
    return SimpleNamespace(
        compile_id=f"{frame}/{compilation}", callback_trigger=SimpleNamespace(name="DYNAMO")
    )


def test_the_recompile_warning_compares_one_frames_recompiles_with_the_per_frame_limit(
    monkeypatch, caplog
):
    """torch's recompile_limit holds per frame: 3 frames of limit / 2 + 1 graphs each (more
    recompiles in all than the limit) run nothing eagerly, so no warning; a frame's graph number
    `limit` fills its cache, and that is warned about."""
    monkeypatch.setattr(compiling, "RECOMPILES", compiling.RecompileCount())
    limit = torch._dynamo.config.recompile_limit  # 8
    each = limit // 2 + 1
    watch = compiling.CompileWatch()
    with caplog.at_level(logging.INFO, logger=compiling.__name__):
        for frame in range(3):
            for compilation in range(each):
                compiling.RECOMPILES(compile_id(frame, compilation))
        assert watch.check(1).recompiles == 3 * (each - 1) >= limit
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
        for compilation in range(each, limit):
            compiling.RECOMPILES(compile_id(0, compilation))
        watch.check(2)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    total = 3 * (each - 1) + limit - each
    assert f"recompiled one frame {limit - 1} times ({total} recompiles in all)" in warning


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with the eager backend (Dynamo's tracing, guards and recompiles, without
    generating code: quick), whatever backend its caller asks for; Dynamo's state afresh, and
    the process-wide settings a compiled policy changes restored after the test."""
    import torch.fx.experimental._config as fx_config

    compile_for_real = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda *a, **k: compile_for_real(*a, **{**k, "backend": "eager"})
    )
    duck_shapes = fx_config.use_duck_shape
    compiled_softmax_terms.cache_clear()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    fx_config.use_duck_shape = duck_shapes
    compiled_softmax_terms.cache_clear()
    torch._dynamo.reset()


def test_a_first_batch_whose_source_and_target_share_a_length_makes_no_later_recompile(
    eager_compile,
):
    """Duck sizing would have the decoder layer's graph assume memory_k.size(2) == x.size(1)
    after a first batch with S == T, and compile it again at the first batch without."""
    model = tiny_model()
    execution.compile_repeated_layers(model)
    loss = TrainingLoss.for_policy(model, EAGER, epsilon=0.1, pad_id=0)
    counts = []
    for seed, (rows, src_length, tgt_length) in enumerate([(5, 9, 9), (5, 11, 7), (6, 8, 13)]):
        loss(*batch(rows, src_length, tgt_length, seed)).loss.backward()
        counts.append(CompileCounts.now().graphs)
    assert counts == [2, 2, 2], counts  # an encoder layer's graph and a decoder layer's


def test_validation_runs_the_compiled_models_layers_eagerly(eager_compile, tiny_train_job):
    """Validation's loss (eval, no gradients) through the compiled layers would compile new
    graphs for a pass that runs once in many updates; it runs them eagerly, the same weights."""
    job = tiny_train_job("trainer.compile=true", "trainer.valid_bleu_sentences=0")
    trainer = trainer_for(job)
    data = trainer.data.train
    indices = token_batches(data.src.lengths, data.tgt.lengths, 400, seed=1, epoch=0)[:1]
    trainer.train_step([collate(data, indices[0], pad_id=0, bos_id=2, eos_id=3)])
    trained = CompileCounts.now().graphs
    assert trained > 0
    scores = trainer.validator.scores()
    assert CompileCounts.now().graphs == trained and math.isfinite(scores.loss)
