"""How a device runs the model, decided in one place: the ExecutionPolicy and the rules here.

A policy is built from a job's settings and its device and validated with them: a training
run's once, before anything is written (`for_training`: trainer.precision, sdpa_backends,
compile, cpu_linear, source_lengths); a search's once per call (`for_decoding`: decode.precision,
sdpa_backends, cpu_linear, quantize, batch_shape, source_lengths; a call's settings may differ
from the last). It decides
- what autocast computes in (`autocast_dtype`, the one home of precision=auto for every device),
  and with it whether the training step scales its loss (fp16: `scales_loss`);
- which attention kernels F.scaled_dot_product_attention may use, and in which order;
- whether torch.compile runs (the repeated layers; the loss's chunks: `compile_loss`) and by
  which backend;
- what multiplies the linear layers on the CPU (`cpu_products`: torch's F.linear, oneDNN's
  kernel, int8 weights);
- how batches are shaped and moved: lengths rounded to few shapes (`round_lengths`), sentences of
  one source length (`equal_source_lengths`), beam search's fixed-shape batch, a search batch's
  default size (`decode_batch_tokens`), pinned memory for the copy to the GPU (`pins_memory`);
- how the training loss works through its tokens (`loss_chunks`: tokens a chunk, padding
  dropped first or weighted 0, the products' dtype and kernels, compiled or eager).
Training, validation and every search take it: `forward()` is the one context a forward pass
runs in; `with_kernels` the one way a model gets the policy's kernels and compiled layers, for
training (a copy over the model's own parameters) and decoding (a copy whose weights are made
ready once: onednn.OneDnnLinear, int8.py) alike; `loss_chunks` what the training loss reads
(train/loss.py). Nothing else in the package enters autocast, SDPA-kernel or oneDNN contexts
(the loss turns autocast off around its own products, whose dtype `loss_chunks` gives it).

A few rules depend on the tensors of one call, not on a run's settings; they are functions here
that the model and the search ask: `attends_few_queries` (a decoding step's attention on the
CPU), `draws_cpu_dropout_masks` (the CPU's dropout masks), `gathers_in_place` (a KV cache's
gather on MPS) and `score_dtype` (beam search's scores). What a process sets once for
its device (the GPU made current, TF32, the CUDA allocator, malloc, threads) is
device.prepare_process, for training and decoding alike.

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
import functools
import itertools
import logging
import os
import platform
import shutil
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.utils import skip_init

from transformer_mt import int8, onednn
from transformer_mt.config import (
    BatchShape,
    CpuLinear,
    DecodeConfig,
    Precision,
    SdpaBackend,
    SourceLengths,
    TrainerConfig,
    compile_setting,
    validate_sdpa_device,
)
from transformer_mt.errors import ConfigError

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


# The training loss's logits held at once: chunks of about this many elements (64 MiB of fp32 on
# a CPU), so that a chunk stays small next to the model while its matmuls are still large.
LOSS_CHUNK_ELEMENTS = {"cpu": 2**24, "cuda": 2**27}

# What a search's copy of the model puts in place of nn.Linear, by the policy's CPU products
# (int8_batch: torch.ao's dynamic quantization, int8.with_int8_batch_linears).
DECODING_LINEARS = {CpuLinear.onednn: onednn.OneDnnLinear, CpuLinear.int8: int8.Int8RowLinear}


@dataclass(frozen=True, kw_only=True)
class LossChunks:
    """How the training loss works through a batch's tokens (train/loss.projected_loss), as the
    policy decides it for its device (`ExecutionPolicy.loss_chunks`)."""

    tokens: int
    """Tokens a chunk (`loss_chunk_tokens`)."""
    drop_padding: bool
    """Select the non-pad positions first, so that padding never reaches the projection: on the
    CPU. On a GPU that selection would wait for the device (its size is data), so there padded
    positions go through with weight 0 instead."""
    dtype: torch.dtype | None = None
    """The products' dtype (the policy's autocast dtype); None: the tokens' own (float32)."""
    by_onednn: bool = False
    """The float32 products by oneDNN's kernel (the policy's CPU products), the weight reordered
    once for all the chunks."""
    compiled: bool = False
    """Each chunk's passes over its logits through torch.compile (loss.softmax_terms)."""
    compile_backend: str = "inductor"


@dataclass(frozen=True, kw_only=True)
class ExecutionPolicy:
    """How one device runs the model (the module's docstring)."""

    device: torch.device
    dtype: torch.dtype | None
    """What autocast computes in (bf16, fp16); None: float32, autocast off."""
    attention: tuple[SdpaBackend, ...] | None
    """SDPA's kernels in order of preference; None: torch's own choice."""
    compile: bool
    """Whether the training module goes through torch.compile (its repeated layers, and the
    loss's chunks where `compile_loss`)."""
    cpu_products: CpuLinear
    """What multiplies the linear layers (and the output projection) on the CPU: torch, onednn,
    int8 or int8_batch (a search's only), never none; torch off the CPU and under autocast."""
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
    compile_loss: bool = True
    """Where the policy compiles, whether the loss's chunks compile too (False: only the layers,
    a column of make gpu-check's training benchmark, benchmarks/bench_train.py)."""
    decoding: bool = False
    """A search's policy (`for_decoding`): the weights do not change while a search runs, so
    `with_kernels` makes them ready once for the CPU's products, in a copy."""

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
            cpu_products=CpuLinear.onednn if onednn_products else CpuLinear.torch,
            equal_source_lengths=equal_sources(trainer.source_lengths, device, "training"),
        )

    @classmethod
    def for_decoding(cls, decode: DecodeConfig, device: torch.device) -> ExecutionPolicy:
        """A search's policy (decode.precision, sdpa_backends, cpu_linear, quantize): float32 on
        the CPU multiplies by int8 weights (decode.quantize=int8 or int8_batch, the CPU only:
        ConfigError naming the key elsewhere) or oneDNN's prepacked ones (decode.cpu_linear=onednn,
        where torch has oneDNN); never compiled. Beam search's batch keeps a fixed shape on CUDA
        (decode.batch_shape=auto), shrinks elsewhere."""
        validate_sdpa_device(decode.sdpa_backends, "decode.sdpa_backends", device.type)
        if decode.quantize != CpuLinear.none and device.type != "cpu":
            raise ConfigError(
                f"config key 'decode.quantize': {decode.quantize.value} runs on the CPU only, not "
                f"on {device} (PyTorch's int8 kernels are CPU ones); on a GPU "
                "decode.precision=auto (bf16) is the fast setting"
            )
        # int8 weights compute in fp32 (decode.precision=bf16 with them is refused by its check)
        quantized = decode.quantize != CpuLinear.none
        dtype = None if quantized else autocast_dtype(device, decode.precision)
        products = CpuLinear.torch
        if device.type == "cpu" and dtype is None:
            if decode.quantize != CpuLinear.none:
                products = decode.quantize
            elif decode.cpu_linear == CpuLinear.onednn and onednn.available():
                products = CpuLinear.onednn
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
            decoding=True,
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

    @property
    def scales_loss(self) -> bool:
        """Whether the training step scales its loss (torch.amp.GradScaler): in fp16, whose small
        gradients would underflow to zero without it."""
        return self.dtype == torch.float16

    @property
    def pins_memory(self) -> bool:
        """Whether training batches are pinned for their copy to the device: on CUDA, where a
        pinned batch is copied without a staging copy, in the background."""
        return self.device.type == "cuda"

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
        """`model` as this policy runs it: where the policy has kernels of its own, a copy of it
        (`shared_copy`: its own class, new modules over the model's own tensors; the model is
        left as it is), otherwise the model itself.
        - Training: oneDNN's products on the CPU with gradients (onednn.TrainingLinear), over the
          model's own parameters (so that the optimizer, the checkpoint and validation BLEU's
          searches see one set of weights, and the searches the model as it is), and, where the
          policy compiles, each of its repeated layers compiled (`compile_repeated_layers`).
        - Decoding (`decoding`): a copy in eval mode whose linear layers and output projection
          multiply with weights made ready once for the policy's products (`decoding_copy`); a
          copy holds the weights of one moment, made again after the model changes."""
        if self.decoding:
            return model if self.cpu_products == CpuLinear.torch else decoding_copy(model, self)
        onednn_products = self.cpu_products == CpuLinear.onednn
        if not (onednn_products or self.compile):
            return model
        copied = shared_copy(model)
        if onednn_products:
            replace_linears(copied, onednn.TrainingLinear.over)
        if self.compile:
            compile_repeated_layers(copied, self.compile_backend)
        return copied

    def loss_chunks(self, vocab_size: int) -> LossChunks:
        """How the training loss works through the tokens under this policy: chunks of
        `loss_chunk_tokens`, padding dropped first on the CPU, the products in `dtype` (by
        oneDNN's kernel where the policy takes it), the passes over the logits compiled where
        the policy compiles the loss."""
        return LossChunks(
            tokens=loss_chunk_tokens(self.device, vocab_size),
            drop_padding=self.device.type == "cpu",
            dtype=self.dtype,
            by_onednn=self.cpu_products == CpuLinear.onednn,
            compiled=self.compile and self.compile_loss,
            compile_backend=self.compile_backend,
        )

    @property
    def precision(self) -> str:
        """What the model computes in, as trainer.precision names it: fp32, bf16 or fp16."""
        names = {
            None: Precision.fp32,
            torch.bfloat16: Precision.bf16,
            torch.float16: Precision.fp16,
        }
        return names[self.dtype].value

    def describe(self) -> str:
        """One line for the log: what this policy runs."""
        attention = (
            "torch's choice"
            if self.attention is None
            else ",".join(a.value for a in self.attention)
        )
        precision = self.precision
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
    """What autocast computes in for trainer.precision or decode.precision on `device`: fp16 or
    bf16 when asked for; by default (auto) bf16 on CUDA, None (fp32) elsewhere. The one place
    where precision=auto is decided, for training and searching alike.

    The CPU keeps fp32 also where it multiplies bf16 natively (`cpu_multiplies_bf16`). A search
    in bf16 took 0.74x fp32's time there with the small model and about 0.83x with the demo one,
    at the same BLEU (docs/results.md, bf16 on the CPU), but a sentence's translation then
    depends on the sentences batched with it: bf16 rounds each product to 8 bits, and the
    batch's shape decides how the kernels sum them (2 of 100 toy test sentences changed when
    translated alone, 2 of 40 server answers between one request and concurrent ones; 0 in
    fp32). tmt-translate, tmt-eval and tmt-serve promise translations independent of their batch
    mates by default, so bf16 is asked for by name (decode.precision=bf16, logged as
    batch-dependent: decode/translator.describe_precision). A training step went 0.73x as fast
    in bf16 with the demo model, 1.1x with the small one and 1.55x with base, so training keeps
    fp32 on the CPU unless trainer.precision=bf16 asks. CUDA's auto stays bf16: its kernels are
    chosen by shape in any precision (TF32 for fp32's products), so a translation there matches
    its batch mates' only up to float rounding whatever decode.precision says."""
    if precision == Precision.fp16:
        return torch.float16
    if precision == Precision.bf16:
        return torch.bfloat16
    if precision == Precision.auto and device.type == "cuda":
        return torch.bfloat16
    return None


@functools.cache
def cpu_multiplies_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware, decided once a process and logged with its
    reason: AVX512-BF16 on x86 (AMX-BF16 CPUs have it too), the BF16 extension on Arm (torch's
    oneDNN check, which there asks for it). Not that oneDNN check on x86: it is True on any
    AVX512-BW CPU, where oneDNN emulates bf16 products, slower than fp32 ones. What it decides:
    whether a search asked to compute in bf16 by name is faster than fp32 here (the log of
    decode/translator.describe_precision); precision=auto is fp32 on every CPU."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        native, instructions = torch.cpu._is_avx512_bf16_supported(), "AVX512-BF16"
    elif machine in ("aarch64", "arm64"):
        native, instructions = torch.ops.mkldnn._is_mkldnn_bf16_supported(), "Arm's BF16"
    else:
        native, instructions = False, "native bf16 products"
    if native:
        log.info(
            "this CPU has %s: precision=bf16 is faster than fp32 for searches and wide models' "
            "training steps, slower for narrow models' (docs/results.md, bf16 on the CPU); "
            "precision=auto computes in fp32",
            instructions,
        )
    else:
        log.info("this CPU lacks %s: bf16 is emulated on it, slower than fp32", instructions)
    return native


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


def shared_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` of its own class: new modules over the same parameters and buffers
    (`model` is left as it is)."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo=shared)


def replace_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> None:
    """Every nn.Linear inside `module` replaced by make(it), in place."""
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                setattr(parent, name, make(child))


def decoding_copy(model: nn.Module, policy: ExecutionPolicy) -> nn.Module:
    """A search's copy of our model (`shared_copy`, in eval mode) whose linear layers and output
    projection multiply with weights made ready once for `policy`'s CPU products: oneDNN's
    prepacked float32 (onednn.OneDnnLinear), int8 with a scale per input row
    (int8.Int8RowLinear), or torch.ao's dynamic int8 (int8.with_int8_batch_linears). The output
    projection is no nn.Linear in the model (Transformer.decode multiplies by the shared
    embedding, V x D: the largest matmul of a decoding step), so the copy's `output_projection`
    is a linear layer over the embedding; every other tensor is shared with the model."""
    copied = shared_copy(model).eval()
    # skip_init: no initial weights drawn from torch's generator (training validates through
    # here, and its random stream must not depend on it).
    vocab, width = model.embed.weight.shape
    projection = skip_init(nn.Linear, width, vocab, bias=False)
    projection.weight = model.embed.weight  # (V, D), shared
    copied.output_projection = projection
    if policy.cpu_products == CpuLinear.int8_batch:
        int8.with_int8_batch_linears(copied)
    else:
        replace_linears(copied, DECODING_LINEARS[policy.cpu_products])
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


def loss_chunk_tokens(device: torch.device, vocab_size: int) -> int:
    """Tokens per chunk of the training loss: about LOSS_CHUNK_ELEMENTS logits, in whole steps of
    onednn.ROW_STEP rows, so that the CPU's padded products (onednn.product_in_row_steps) pad
    only the last chunk (at 37,000 pieces 2**24 elements are 453 rows, which it would pad to 512
    in every chunk)."""
    budget = LOSS_CHUNK_ELEMENTS.get(device.type, LOSS_CHUNK_ELEMENTS["cpu"])
    return onednn.ROW_STEP * max(1, round(budget / vocab_size / onednn.ROW_STEP))


# ---- rules decided per call, from the tensors at hand ------------------------------------------
def attends_few_queries(q: Tensor, training: bool) -> bool:
    """Whether attention over queries q (N, H, T, Dh) takes model.attend_few_queries, two batched
    products around a softmax, instead of SDPA: one query row (a decoding step), no dropout, in
    float32 on the CPU, where SDPA's kernel (built to block long queries) took 1.5-2.9x their
    time (1,200 rows, 4 heads, 8-40 keys; benchmarks/bench_decode_kernels.py,
    benchmarks/decode.txt). On a GPU SDPA's kernels handle this shape in one launch, and under
    bf16 autocast SDPA keeps its scores in float32 where bmm would round them."""
    return q.shape[2] == 1 and not training and q.device.type == "cpu" and q.dtype == torch.float32


def draws_cpu_dropout_masks(x: Tensor) -> bool:
    """Whether model.Dropout draws its own cheaper masks for x: eagerly on the CPU, where torch's
    dropout draws a double for every element in one thread (about a tenth of a CPU training
    step, benchmarks/train_speed.txt). Under torch.compile and on other devices (CUDA's kernel
    draws four numbers at a time already) it is F.dropout."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def gathers_in_place(device: torch.device) -> bool:
    """Whether a KV cache's rows are gathered into a strided slice in one copy (index_select
    with out=, model.gathered): on the CPU and CUDA. MPS's kernel has written such an output as
    if it were contiguous, so there the rows are gathered first, then copied."""
    return device.type in ("cpu", "cuda")


def score_dtype(device: torch.device) -> torch.dtype:
    """The dtype of beam search's length-normalised scores on `device` (the shrinking and the
    fixed-shape batch alike): float64, as search.length_penalty computes the penalty; float32 on
    MPS, which has none."""
    return torch.float32 if device.type == "mps" else torch.float64
