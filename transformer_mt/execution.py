"""How a device runs the model, decided in one place: the ExecutionPolicy.

A run's policy is built once from its settings and its device, and validated with them, before
anything is written: the precision autocast computes in, the attention kernels
F.scaled_dot_product_attention may use and in which order, whether torch.compile runs, which
kernel multiplies the linear layers on the CPU, whether batch lengths are rounded to few shapes,
and whether a batch holds sentences of one source length (so that attention needs no key-padding
mask). Training, validation and every search take it: `forward()` is the one context a forward
pass runs in, `with_kernels` the one way a model gets the policy's kernels and compiled layers
(the training loss reads the policy for its own chunks: loss.TrainingLoss.for_policy). Nothing
else in the package enters autocast, SDPA-kernel or oneDNN contexts (the loss turns autocast off
around its own products, whose precision the policy gives it: train/loss.py).

The attention order on CUDA is ours, not torch's: flash, then memory-efficient, then math.
torch 2.9 and later put cuDNN's attention first on H100/H200 (cuDNN >= 9.15), and cuDNN builds an
execution plan for every new (batch, length) shape, forward and backward: on the first GPU run
(one H200, torch 2.11, the base model, 25,000-token updates) a first pass over unseen shapes ran
at 62,890 target tokens/s against 415,972 on the same shapes seen again; with cuDNN's attention
off, 330,377 against 425,910 (benchmarks/gpu.txt). Its backward can also give NaN gradients on
those GPUs (pytorch#196678). `[default]` in the settings still gives torch's own choice.

Flash attention takes no mask. A batch whose sentences are padded to its longest source needs a
key-padding mask in the encoder's self-attention and in the cross-attention, so those calls (12
of a training update's 18 in the base model) ran the memory-efficient kernel, and only the
decoder's self-attention (causal, no mask: right-padded targets are queries only, and no real
query sees a later pad) took flash. With `equal_source_lengths` a batch holds sentences of one
source length wherever a length fills half a batch: nothing to mask, and every call can take
flash (data/batching.one_length_batches: the same token budgets; `Batch.src_padded`,
`EncoderOutput.padded`); the sentences a length leaves over are packed together, masked.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import logging
import os
import shutil
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_mt import onednn
from transformer_mt.config import (
    BatchShape,
    CpuLinear,
    DecodeConfig,
    Precision,
    Quantize,
    SdpaBackend,
    SourceLengths,
    TrainerConfig,
    compile_setting,
    validate_sdpa_device,
)

log = logging.getLogger(__name__)

SDPA_KERNELS = {
    SdpaBackend.flash: SDPBackend.FLASH_ATTENTION,
    SdpaBackend.efficient: SDPBackend.EFFICIENT_ATTENTION,
    SdpaBackend.cudnn: SDPBackend.CUDNN_ATTENTION,
    SdpaBackend.math: SDPBackend.MATH,
}
# [auto] by device kind; a kind not named here gets torch's own choice (the CPU has flash and
# math only, and torch orders them well).
AUTO_ATTENTION = {"cuda": (SdpaBackend.flash, SdpaBackend.efficient, SdpaBackend.math)}

# trainer.compile=auto compiles on no device yet: on the CPU the compiled step measured slower
# than the eager one, and on CUDA no compiled step has been timed (`should_compile`).
AUTO_COMPILE_OFF = {
    "cpu": "off on the CPU, where the compiled step measured slower than the eager one "
    "(benchmarks/train_speed.txt)",
    "cuda": "off on CUDA until make gpu-check measures the compiled step faster than the eager "
    "one (benchmarks/gpu.txt)",
}

# source_lengths=auto: the device kinds whose batches hold one source length wherever a length
# fills half a batch (data/batching.one_length_batches), in training and in decoding; elsewhere
# sentences of similar lengths, padded and masked. On CUDA every attention call of such a batch
# can take flash (the module's docstring), for as many batches as similar lengths give
# (benchmarks/batch_plan.txt: 99.5% of a WMT-sized epoch's target tokens, 85-96% of
# Multi30k's). On the CPU, whose flash kernel takes masks, today's batches stay until measured.
AUTO_EQUAL_SOURCES = {"training": ("cuda",), "decoding": ("cuda",)}

# decode.batch_tokens=null by device kind; a kind not named here gets the CPU's. The CPU's 4,000
# source tokens is the setting bench_decode has measured with (benchmarks/decode.txt); CUDA's is
# provisional: 4x that, about the 1,000 Multi30k test sentences in one batch (4,000 beam rows),
# until `make gpu-check`'s decoding part measures a few budgets on a GPU.
DECODE_BATCH_TOKENS = {"cpu": 4000, "cuda": 16384}


class CpuProducts(str, Enum):
    """What multiplies the linear layers on the CPU: torch's F.linear, oneDNN's kernel (training:
    the weight reordered at each call; decoding: reordered once, in a copy), or int8 weights
    (decoding only)."""

    torch = "torch"
    onednn = "onednn"
    int8 = "int8"


@dataclass(frozen=True, kw_only=True)
class ExecutionPolicy:
    """How one device runs the model (the module's docstring)."""

    device: torch.device
    dtype: torch.dtype | None
    """What autocast computes in (bf16, fp16); None: float32, autocast off."""
    attention: tuple[SdpaBackend, ...] | None
    """SDPA's kernels in order of preference; None: torch's own choice."""
    compile: bool
    """Whether the training module goes through torch.compile."""
    cpu_products: CpuProducts
    """What multiplies the linear layers (and the loss's output projection) on the CPU."""
    fixed_shape_decoding: bool = False
    """Beam search keeps every row to the batch's end in a preallocated KV cache and decides on
    the device which sentences are done (decode.batch_shape; search.fixed_shape_beam_search): on
    CUDA, where each step's copy to the host waits for the device and each new shape costs. On
    the CPU finished sentences leave the batch, decided on the host after each step: fewer rows
    to compute, and the copy waits for nothing."""
    equal_source_lengths: bool = False
    """Batches hold sentences of one source length wherever a length fills half a batch
    (trainer.source_lengths, decode.source_lengths): their attention needs no key-padding mask
    (the module's docstring)."""
    compile_backend: str = "inductor"
    """torch.compile's backend where the policy compiles: Inductor (generated kernels). A CPU
    rehearsal of the GPU check passes aot_eager, which traces the same graphs (Dynamo's guards
    and recompiles, AOTAutograd's forward and backward) without generating their code."""

    @classmethod
    def for_training(cls, trainer: TrainerConfig, device: torch.device) -> ExecutionPolicy:
        """The training step's policy (trainer.precision, sdpa_backends, compile, cpu_linear);
        ConfigError naming the key for a setting that cannot be (the decision logged)."""
        validate_sdpa_device(trainer.sdpa_backends, "trainer.sdpa_backends", device.type)
        dtype = autocast_dtype(device, trainer.precision)
        compiles = should_compile(trainer.compile, device)
        onednn_products = (
            device.type == "cpu"
            and dtype is None
            and not compiles  # torch.compile traces F.linear
            and trainer.cpu_linear == CpuLinear.onednn
            and onednn.available()
        )
        return cls(
            device=device,
            dtype=dtype,
            attention=attention_order(trainer.sdpa_backends, device),
            compile=compiles,
            cpu_products=CpuProducts.onednn if onednn_products else CpuProducts.torch,
            equal_source_lengths=equal_sources(trainer.source_lengths, device, "training"),
        )

    @classmethod
    def for_decoding(cls, decode: DecodeConfig, device: torch.device) -> ExecutionPolicy:
        """A search's policy (decode.precision, sdpa_backends, cpu_linear, quantize): float32 on
        the CPU multiplies by int8 weights (decode.quantize=int8) or oneDNN's prepacked ones
        (decode.cpu_linear=onednn, where torch has oneDNN); never compiled. Beam search's batch
        keeps a fixed shape on CUDA (decode.batch_shape=auto), shrinks elsewhere."""
        validate_sdpa_device(decode.sdpa_backends, "decode.sdpa_backends", device.type)
        dtype = autocast_dtype(device, Precision(decode.precision.value))
        products = CpuProducts.torch
        if device.type == "cpu" and dtype is None:
            if decode.quantize != Quantize.none:
                products = CpuProducts.int8
            elif decode.cpu_linear == CpuLinear.onednn and onednn.available():
                products = CpuProducts.onednn
        shape = decode.batch_shape
        return cls(
            device=device,
            dtype=dtype,
            attention=attention_order(decode.sdpa_backends, device),
            compile=False,
            cpu_products=products,
            fixed_shape_decoding=shape == BatchShape.fixed
            or (shape == BatchShape.auto and device.type == "cuda"),
            equal_source_lengths=equal_sources(decode.source_lengths, device, "decoding"),
        )

    @property
    def round_lengths(self) -> bool:
        """Whether batches' padded lengths are rounded up to 8 lengths per doubling
        (data/batching.batch_shapes): on CUDA, where every new shape costs a kernel's plan, the
        allocator's blocks and (compiled) guards, and wherever the model is compiled. A
        WMT-like epoch of 25,000-token updates meets 2.4x fewer shapes (1,622 against 3,856 in
        11,445 micro-batches) for 3.7% padded positions against 0.7%
        (tests/data/test_batching.py). With `equal_source_lengths` only the target's length is
        rounded: a rounded source would be padded, and masked."""
        return self.device.type == "cuda" or self.compile

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """The context every forward pass runs in: autocast in `dtype` (off for float32, also
        inside an enclosing autocast) and SDPA's kernels in `attention`'s order."""
        kind = self.device.type
        autocast = torch.autocast(kind, dtype=self.dtype, enabled=self.dtype is not None)
        kernels = (
            contextlib.nullcontext()
            if self.attention is None
            else sdpa_kernel([SDPA_KERNELS[kernel] for kernel in self.attention], set_priority=True)
        )
        with autocast, kernels:
            yield

    def with_kernels(self, model: nn.Module) -> nn.Module:
        """`model` as the training step runs it: where the policy has kernels of its own, a copy
        over the model's own parameters (so that the optimizer, the checkpoint and validation
        BLEU's searches see one set of weights, and the searches the model as it is), with
        oneDNN's products on the CPU (onednn.TrainingLinear) and, where it compiles, each of its
        repeated layers compiled (`compile_repeated_layers`); otherwise the model itself."""
        onednn_products = self.cpu_products == CpuProducts.onednn
        if not (onednn_products or self.compile):
            return model
        copied = copy_with_linears(model, onednn.TrainingLinear.over if onednn_products else None)
        if self.compile:
            compile_repeated_layers(copied, self.compile_backend)
        return copied

    def describe(self) -> str:
        """One line for the log: what this policy runs."""
        attention = (
            "torch's choice"
            if self.attention is None
            else ",".join(a.value for a in self.attention)
        )
        precision = "fp32" if self.dtype is None else str(self.dtype).removeprefix("torch.")
        sources = "one source length" if self.equal_source_lengths else "similar source lengths"
        return (
            f"{self.device}, {precision}, attention [{attention}], "
            f"compile {'on' if self.compile else 'off'}, CPU products {self.cpu_products.value}, "
            f"batches of {sources}"
        )

    def eager(self) -> ExecutionPolicy:
        """This policy without torch.compile: what validation's loss runs in (a compiled step's
        layers in eval and without gradients would be new graphs, compiled for a pass that runs
        once in many updates)."""
        return dataclasses.replace(self, compile=False)


def decode_batch_tokens(device: torch.device) -> int:
    """decode.batch_tokens=null on `device`: its default source tokens per decoding batch
    (DECODE_BATCH_TOKENS; a device not listed there: the CPU's)."""
    return DECODE_BATCH_TOKENS.get(device.type, DECODE_BATCH_TOKENS["cpu"])


def autocast_dtype(device: torch.device, precision: Precision) -> torch.dtype | None:
    """bf16 on GPU by default, fp16 when asked for; None (fp32) on CPU unless bf16 is asked for."""
    if precision == Precision.fp16:
        return torch.float16
    if precision == Precision.bf16 or (precision == Precision.auto and device.type == "cuda"):
        return torch.bfloat16
    return None


def attention_order(
    backends: list[SdpaBackend], device: torch.device
) -> tuple[SdpaBackend, ...] | None:
    """The kernels SDPA may choose from, in order ([auto]: ours for the device; [default] and
    devices we leave to torch: None). A kernel that cannot take a call (cuDNN and flash: no
    fp32; the CPU: flash and math only) is passed over; with none left, SDPA fails ("No viable
    backend for scaled_dot_product_attention")."""
    if backends == [SdpaBackend.default]:
        return None
    if backends == [SdpaBackend.auto]:
        return AUTO_ATTENTION.get(device.type)
    return tuple(backends)


def equal_sources(setting: SourceLengths, device: torch.device, use: str) -> bool:
    """trainer.source_lengths (use="training") or decode.source_lengths ("decoding") decided for
    `device`: auto by AUTO_EQUAL_SOURCES."""
    if setting == SourceLengths.auto:
        return device.type in AUTO_EQUAL_SOURCES[use]
    return setting == SourceLengths.equal


def should_compile(value: object, device: torch.device) -> bool:
    """trainer.compile decided for `device`, the decision and why logged. auto compiles where a
    compiled step has measured faster than the eager one, which is nowhere yet. On the CPU it
    measured slower (benchmarks/train_speed.txt: model=small on Multi30k, 0.81x the eager
    step's speed per update in the median in run 7, 0.68x in run 8 on another machine, before
    counting its compile time). On CUDA the whole step compiled cost minutes on the first GPU
    run and was never timed to the end (2026-12-04, benchmarks/gpu.txt); the layers compiled
    one by one (`compile_repeated_layers`) are timed by `make gpu-check` against eager, and
    this rule follows what it measures."""
    setting = compile_setting(value)
    if setting is None:
        setting = False
        why = AUTO_COMPILE_OFF.get(device.type, f"off on {device.type}: not measured there")
        log.info("trainer.compile=auto: %s", why)
    if setting and (missing := missing_build_tools()):
        log.warning("trainer.compile: %s, so the model trains without torch.compile", missing)
        return False
    return setting


def missing_build_tools() -> str | None:
    """What torch.compile's code generation lacks here, or None. Compiling needs a C compiler
    and the Python headers (Inductor builds its kernels' wrappers with them); without them the
    run says so in one line and trains eagerly."""
    compilers = [os.environ.get("CXX"), "g++", "clang++", "c++"]
    if not any(name and shutil.which(name) for name in compilers):
        return "no C++ compiler (g++ or clang++; or set CXX) is installed"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return (
            f"the Python headers ({header}) are not installed (Debian/Ubuntu: the python3-dev "
            "package)"
        )
    return None


def copy_with_linears(
    model: nn.Module, make: Callable[[nn.Linear], nn.Module] | None = None
) -> nn.Module:
    """A copy of `model` (of its own class, new modules over the same parameters and buffers)
    whose every nn.Linear is replaced by make(linear) (None: kept); `model` is left as it is."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    copied = copy.deepcopy(model, memo=shared)
    for parent in list(copied.modules()) if make else []:
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                setattr(parent, name, make(child))
    return copied


def compile_repeated_layers(model: nn.Module, backend: str = "inductor") -> None:
    """Compile each of the model's repeated layers in place (regional compilation: the
    Transformer's `repeated_layers()`, its encoder and decoder layers). The layers of a stack
    share their code, so Dynamo traces one encoder layer and one decoder layer, and their
    graphs serve every layer of the stack, where the whole step compiled as one graph traced
    all twelve; the embeddings and the final norms stay eager (the loss compiles its chunks'
    passes itself: loss.TrainingLoss.for_policy). Dynamic shapes: a new batch shape
    reuses the graphs, and no size is assumed equal to another because it was in the first
    batch (`no_duck_shapes`)."""
    no_duck_shapes()
    for layer in model.repeated_layers():
        layer.compile(dynamic=True, backend=backend)


def no_duck_shapes() -> None:
    """Turn Dynamo's duck sizing off for this process. With it, sizes that are equal in the
    first traced call share one symbol, and the graph guards that they stay equal: a first
    batch whose source and target had one length made the decoder layer's graph assume
    `memory_k.size(2) == x.size(1)`, and the next batch without that equality compiled it
    again (12% of rounded WMT-like batches have S == T). torch reads the setting whenever it
    traces a new graph; the graphs are as general without it, only their first call's guess
    is gone."""
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False
