"""The benchmarks and drills behind make bench, bench-data, bench-decode, bench-serve, fault-drill
and gpu-check (the package benchmarks/) and the tools in scripts/ still run against the library as
it is (a change of a library call once broke make bench unnoticed): every one's --help, and the
cheap ones for real at toy size."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from benchmarks import profile_step
from transformer_mt import onednn

ROOT = Path(__file__).resolve().parents[1]


def runnable(folder: str) -> list[Path]:
    """The files of `folder` that run (the others are modules they import)."""
    return sorted(
        path
        for path in (ROOT / folder).glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    )


# Each runnable one as python's arguments: a benchmark as a module of the package, a tool as a file.
COMMANDS = {
    **{
        f"benchmarks.{path.stem}": ["-m", f"benchmarks.{path.stem}"]
        for path in runnable("benchmarks")
    },
    **{f"scripts/{path.name}": [str(path)] for path in runnable("scripts")},
}


def run(*command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable}  # gpu_check.sh: this interpreter
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout
    )


# Every command's --help in one interpreter, one after the other (each as `python -m` or
# `python FILE` would run it, as __main__): torch and the library are imported once, not once a
# command. Writes {name: [exit status, stdout, stderr]} as JSON to the file named first.
HELP_EACH = """
import contextlib, io, json, runpy, sys, traceback
said, where, commands = {}, sys.argv[1], json.loads(sys.argv[2])
for name, arguments in commands.items():
    out, err, status = io.StringIO(), io.StringIO(), 0
    sys.argv = [arguments[-1], "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if arguments[0] == "-m":
                runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(arguments[0], run_name="__main__")
    except SystemExit as exit:
        status = exit.code or 0
    except BaseException:
        err.write(traceback.format_exc())
        status = 1
    said[name] = [status, out.getvalue(), err.getvalue()]
with open(where, "w") as file:
    json.dump(said, file)
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, list]:
    """Each command's [exit status, stdout, stderr] for --help."""
    said = tmp_path_factory.mktemp("helps") / "said.json"
    done = run(sys.executable, "-c", HELP_EACH, str(said), json.dumps(COMMANDS))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(said.read_text())


@pytest.mark.parametrize("name", COMMANDS)
def test_every_benchmark_and_tool_starts(name, helps):
    status, stdout, stderr = helps[name]
    assert status == 0, stderr
    assert "usage:" in stdout


def test_the_makefile_runs_the_benchmarks_as_modules_of_the_package():
    """What make runs of benchmarks/ is among the modules above (so each one's --help is run)
    and goes through `python -m`, never a path (a path would not import the package)."""
    makefile = (ROOT / "Makefile").read_text()
    modules = set(re.findall(r"-m (benchmarks\.\w+)", makefile))
    assert modules and modules <= COMMANDS.keys(), modules - COMMANDS.keys()
    assert re.findall(r"benchmarks/\w+\.py", makefile) == []


@pytest.mark.slow
def test_bench_train_times_ours_its_plain_loss_bf16_and_marian_side_by_side_at_toy_size():
    """One run of make bench at toy size: our step, the plain loss (issue 25's step before),
    bf16 and Marian (where the hf extra is installed) on the same batches, then ours profiled.
    One thread a process: two would wait on each other on a busy 2-core machine."""
    marian = importlib.util.find_spec("transformers") is not None
    done = run(
        sys.executable,
        "-m",
        "benchmarks.bench_train",
        *("--data", "toy", "--vocab", "2000", "--model", "tiny", "--steps", "2", "--warmup", "0"),
        *("--threads", "1", "--profile"),
        *("--columns", "ours,ours-plain,ours-bf16" + (",marian" if marian else "")),
    )
    assert done.returncode == 0, done.stderr
    assert "ours plain (transformer_mt)" in done.stdout
    assert "ours plain / ours:" in done.stdout and "ours bf16 / ours:" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if "(transformer_mt)" in line]
    losses = [float(row[-5]) for row in rows]  # the loss column
    # The same updates; only the dropout masks differ (torch's against the model's own), which
    # moves a tiny model's loss at the start by well under 1% (8.143 against 8.147 here); bf16's
    # products round to 8 bits of mantissa, which moves it by about as much.
    assert len(rows) == 3, rows
    assert all(abs(loss - losses[0]) < 0.01 * losses[0] for loss in losses), rows
    scale = next(line for line in done.stdout.splitlines() if "for scale:" in line)
    assert "torch.mm" in scale and ("oneDNN" in scale) == onednn.available(), scale
    if marian:
        assert "marian (transformers" in done.stdout and "ours / marian:" in done.stdout
        shares = r"share of the faster product's: ours \d+%, .*marian \d+%"
        assert re.search(shares, done.stdout)
    profile = done.stdout[done.stdout.index("profile, ours") :].splitlines()
    assert "3 updates after 1 skipped and 1 warm-up; CPU operators by torch.profiler" in profile[0]
    assert profile[1].startswith("    of the busy time: ") and "matmul" in profile[1]
    assert any(line.endswith("aten::mm") for line in profile[2:])


def test_bench_loss_compares_the_two_forms_at_toy_size():
    done = run(
        sys.executable,
        "-m",
        "benchmarks.bench_loss",
        *("--vocab", "300", "--tokens", "512", "--length", "16", "--d-model", "16"),
        *("--repeats", "1", "--threads", "1"),
    )
    assert done.returncode == 0, done.stderr
    assert "chunked / plain: time" in done.stdout
    same = next(line for line in done.stdout.splitlines() if "same values" in line)
    hidden = float(same.split("hidden ")[1].split(",")[0])
    assert hidden < 1e-5, same


def test_bench_decode_kernels_times_each_kernel_beside_the_form_it_replaced():
    done = run(
        sys.executable, "-m", "benchmarks.bench_decode_kernels", "--reps", "1", "--threads", "1"
    )
    assert done.returncode == 0, done.stderr
    # F.linear, prepacked, int8 (a scale per row), int8_batch (a scale per call)
    products = re.findall(r"^  \d+ x \(\d+ x \d+\)( +[\d.]+){4}$", done.stdout, re.M)
    assert len(products) == (7 if onednn.available() else 0)
    assert len(re.findall(r"keys: unmasked \(self\).*masked \(cross\)", done.stdout)) == 3
    assert "F.log_softmax" in done.stdout


def test_profile_kinds_name_the_kernels_of_a_gpu_update():
    kinds = {
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT": "matmul",  # cuBLAS on Hopper
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64": "matmul",
        "aten::addmm": "matmul",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>": "attention",
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80": "attention",
        "triton_per_fused__to_copy_add_native_layer_norm_0": "fused by torch.compile",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float>": "dropout",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": (
            "other"
        ),
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>": (
            "softmax and loss"
        ),
        "void multi_tensor_apply_kernel<FusedAdamMathFunctor<float>>": "optimizer",
    }
    assert {name: profile_step.kind_of(name) for name in kinds} == kinds


@pytest.mark.slow
def test_bench_data_runs_at_toy_size(tmp_path):
    done = run(
        sys.executable,
        "-m",
        "benchmarks.bench_data",
        *("--sizes", "3000", "--slice", "1000", "--vocab", "500", "--workdir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert "prepare 3,000 pairs" in done.stdout and "rank 1 of 2 walking" in done.stdout


def test_a_kernel_is_counted_once_not_again_under_the_op_that_launched_it():
    mm = FunctionEvent(0, "aten::mm", thread=0, start_us=0, end_us=10, use_device="cuda")
    mm.append_kernel("sm90_xmma_gemm_bf16", 0, 6)  # the profiler files the kernel under its op
    gemm = FunctionEvent(
        1, "sm90_xmma_gemm_bf16", 0, 2, 8, use_device="cuda", device_type=DeviceType.CUDA
    )
    step = FunctionEvent(  # a profiler step's span on the GPU's timeline
        2, "ProfilerStep#3", 0, 0, 12, use_device="cuda", device_type=DeviceType.CUDA,
        is_user_annotation=True,
    )  # fmt: skip
    events = [mm, gemm, step]
    assert profile_step.device_events(events) == [("sm90_xmma_gemm_bf16", 6e-6, 1)]
    assert profile_step.host_operators(events) == [("aten::mm", 10e-6, 1)]
    # What summing every row's own device time gave: the kernel twice, and the step's span.
    assert sum(event.self_device_time_total for event in events) == 6 + 6 + 12


def test_a_cpu_profile_is_never_busier_than_its_wall_time():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64)

    def update():
        loss = layer(torch.randn(256, 64)).relu().square().mean()
        loss.backward()

    profiled = profile_step.profile_update(update, torch.device("cpu"))
    assert profiled.updates == 3 and profiled.where == "CPU operators"
    assert 0 < profiled.busy_seconds <= profiled.wall_seconds
    assert sum(profiled.kinds.values()) == pytest.approx(profiled.busy_seconds)
    assert "matmul" in profiled.kinds and profiled.host == []


NO_GPU_LINE = re.compile(r"gpu-check: no CUDA GPU visible to torch: .+; nothing to measure")
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU: the check would run")


@needs_no_gpu
def test_gpu_check_without_a_gpu_says_so_in_one_line():
    done = run("bash", "benchmarks/gpu_check.sh", timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert NO_GPU_LINE.fullmatch(line), line


@needs_no_gpu
def test_make_gpu_check_without_a_gpu_says_so_in_one_line():
    venv = Path(sys.executable).parent.parent  # this interpreter's, not a fresh install
    stamp = venv / ".installed"  # make -o: never (re)install for this target's prerequisite
    done = run("make", "-s", "-o", str(stamp), f"VENV={venv}", "gpu-check", timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert NO_GPU_LINE.fullmatch(line), line


def test_copies_are_summed_by_what_asked_for_them():
    # On the CPU, from a real profile: autocast's casts of a linear layer's weight and input, and
    # their gradients cast back in ToCopyBackward0.
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
        out.float().sum().backward()
    origins = {
        name: calls for name, _, calls in profile_step.copies_by_origin(profiler.events(), False)
    }
    assert origins.get("aten::linear") == 3, origins  # weight, bias, input
    # their gradients, and the gradient of out.float() cast back to bf16
    assert origins.get("backward of ToCopyBackward0") == 4, origins
    # On a GPU, each copy kernel filed under its aten::copy_, named by what asked for it.
    backward = FunctionEvent(0, f"{profile_step.BACKWARD}ToCopyBackward0", 0, 0, 20, "cuda")
    to_copy = FunctionEvent(1, "aten::_to_copy", 0, 1, 19, "cuda")
    copy = FunctionEvent(2, "aten::copy_", 0, 2, 18, "cuda")
    to_copy.cpu_parent, copy.cpu_parent = backward, to_copy
    copy.append_kernel(
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::Te",
        0,
        5,
    )
    assert profile_step.copies_by_origin([backward, to_copy, copy], True) == [
        ("backward of ToCopyBackward0: direct_copy_kernel_cuda", 5e-6, 1)
    ]
