"""A search's copies of our model for the CPU (execution.ExecutionPolicy.with_kernels), whose
linear layers and output projection run oneDNN's prepacked float32 product
(decode.cpu_linear=onednn, the default: onednn.OneDnnLinear) or int8 weights (decode.quantize=int8
or int8_batch: int8.py): every layer replaced, close to the model (oneDNN: to float32 rounding),
the right copy for each call; the loaded model and the checkpoint left as they were."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from transformer_mt import onednn
from transformer_mt.commands.train import train
from transformer_mt.config import (
    INT8_PRODUCTS,
    BatchShape,
    CpuLinear,
    DecodeConfig,
    Precision,
    Strategy,
    compose_job,
)
from transformer_mt.decode.loading import load_translator, translator_from_export
from transformer_mt.decode.search import Ensemble
from transformer_mt.decode.translator import ModelSearch
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.files import file_sha256
from transformer_mt.int8 import Int8RowLinear
from transformer_mt.onednn import OneDnnLinear

CPU = torch.device("cpu")
INT8 = DecodeConfig(quantize=CpuLinear.int8)
needs_onednn = pytest.mark.skipif(not onednn.available(), reason="this torch has no oneDNN")
INT8_LAYERS = {CpuLinear.int8: Int8RowLinear, CpuLinear.int8_batch: DynamicInt8Linear}
"""What each decode.quantize puts in place of nn.Linear."""
both_int8 = pytest.mark.parametrize("quantize", list(INT8_LAYERS))


def cpu_copy(model, products: CpuLinear):
    """A search's copy of `model` with these CPU products (a float32 search's policy on the CPU,
    its products as given)."""
    policy = ExecutionPolicy.for_decoding(DecodeConfig(), CPU)
    return dataclasses.replace(policy, cpu_products=products).with_kernels(model)


def int8_copy(model, quantize: CpuLinear = CpuLinear.int8):
    return cpu_copy(model, quantize)


def members(search: ModelSearch, decode: DecodeConfig) -> Ensemble:
    """The members that search a call with these settings."""
    return search.members(ExecutionPolicy.for_decoding(decode, CPU))


def linear_kinds(model: nn.Module) -> set[type]:
    """The kinds of linear layer in `model`."""
    kinds = (nn.Linear, OneDnnLinear, DynamicInt8Linear, Int8RowLinear)
    return {type(m) for m in model.modules() if isinstance(m, kinds)}


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return float((x - reference).norm() / reference.norm())


@both_int8
def test_every_linear_layer_and_the_output_projection_compute_in_int8(random_model, quantize):
    model = random_model(vocab=50, seed=0, sharpen=1.0)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    quantized = int8_copy(model, quantize)
    float_linears = [name for name, m in quantized.named_modules() if type(m) is nn.Linear]
    assert float_linears == []
    projection = quantized.output_projection
    assert isinstance(projection, INT8_LAYERS[quantize])
    weight = projection.weight_t if quantize == CpuLinear.int8 else projection.weight()
    assert weight.dtype == (torch.int8 if quantize == CpuLinear.int8 else torch.qint8)
    src = torch.tensor([[5, 9, 13, 7, 3], [22, 41, 3, 0, 0]])
    tgt_in = torch.tensor([[2, 8, 12, 30], [2, 17, 6, 45]])
    with torch.no_grad():
        reference = model.decode(tgt_in, model.encode(src))  # (B, T, V)
        logits = quantized.decode(tgt_in, quantized.encode(src))
    # int8 weights (a scale per row: rounding error <= 1/254 of the row's largest weight, about
    # 1% of a typical one) and activations in steps of 1/127 of each row's range (int8) or of
    # the call's (int8_batch, fbgemm's reduce_range) put each of the 9 layers' outputs about
    # 1-2% off float32; through residuals
    # and LayerNorm that stays a few percent, far from the 100% of unrelated logits.
    error = relative_error(logits, reference)
    assert 0 < error < 0.1
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_int8_is_refused_on_cuda_and_with_bf16_naming_the_key(random_model):
    model = random_model(vocab=50, seed=0)
    with pytest.raises(ConfigError, match=r"'decode\.quantize': int8 runs on the CPU only"):
        ModelSearch(model, torch.device("cuda"), quantize=CpuLinear.int8)
    with pytest.raises(ConfigError, match=r"'decode\.precision': bf16 cannot run int8 weights"):
        dataclasses.replace(INT8, precision=Precision.bf16).validate()
    with pytest.raises(ConfigError, match=r"'decode\.quantize': int8 is for transformer_mt"):
        translator_from_export("never-read", decode=INT8)  # refused before the folder is read
    job = compose_job("eval", ["run_dir=x", "decode.quantize=int8"])
    assert job.decode.quantize == CpuLinear.int8 and job.decode.precision == Precision.auto


def test_int8_batch_without_torch_ao_quantization_is_refused_naming_the_key(
    random_model, monkeypatch
):
    """torch marks torch.ao.quantization deprecated: a torch without it still decodes in
    float32 and in int8 (torch._int_mm), and int8_batch is refused in one line."""
    import sys

    monkeypatch.setitem(sys.modules, "torch.ao.quantization", None)  # as if it were gone
    model = random_model(vocab=50, seed=0)
    with pytest.raises(ConfigError) as refused:
        ModelSearch(model, torch.device("cpu"), quantize=CpuLinear.int8_batch)
    message = str(refused.value)
    assert message.startswith(
        "config key 'decode.quantize': int8_batch needs torch.ao.quantization"
    )
    assert "\n" not in message and "decode.quantize=int8 or none" in message
    assert cpu_copy(model, CpuLinear.onednn) is not None  # float32 is unaffected
    assert cpu_copy(model, CpuLinear.int8) is not None


@both_int8
def test_each_member_of_an_ensemble_searches_in_int8(random_model, quantize):
    pair = Ensemble([random_model(vocab=50, seed=1, eos_bonus=3.0) for _ in range(2)])
    search = ModelSearch(pair, torch.device("cpu"), quantize=quantize)
    kinds = [linear_kinds(member) for member in search.ensemble.models]
    assert kinds == [{INT8_LAYERS[quantize]}] * 2
    assert [linear_kinds(member) for member in pair.models] == [{nn.Linear}] * 2  # copies
    decode = DecodeConfig(quantize=quantize)
    assert members(search, decode) is search.ensemble  # int8 whatever decode.cpu_linear says
    nbest = search.search([[5, 6, 7], [8, 9]], decode)
    assert [len(hyps) >= 1 for hyps in nbest] == [True, True]
    attention = search.cross_attention([[5, 6, 7]], [nbest[0][0].tokens], layer=-1)
    assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in attention[0])


def test_int8_leaves_the_checkpoint_on_disk_unchanged(tiny_train_job):
    checkpoint = train(tiny_train_job("trainer.max_steps=1", "trainer.valid_bleu_sentences=0"))
    run_dir = checkpoint.parents[1]
    digest, modified = file_sha256(checkpoint), checkpoint.stat().st_mtime_ns
    translator = load_translator(run_dir, decode=INT8, device="cpu")
    assert linear_kinds(translator.backend.model) == {Int8RowLinear}
    assert len(translator.translate(["the dog sees the cat.", ""])) == 2
    assert file_sha256(checkpoint) == digest and checkpoint.stat().st_mtime_ns == modified
    with pytest.raises(ConfigError, match=r"'decode\.quantize': none is chosen when the model"):
        translator.translate(["the dog."], decode=DecodeConfig())


def test_int8_beam_search_mostly_gives_the_float_models_outputs(random_model):
    """A few percent of logit error (the test above) flips a choice only where two pieces are
    nearly tied, so an int8 copy's beam search gives most of the float32 model's outputs: 34 of
    these 40 when measured (a broken int8 path, such as wrong scales, gives next to none). On a
    trained model: BLEU beside float32 on Multi30k in benchmarks/decode.txt (make bench-decode)."""
    model = random_model(vocab=60, seed=4)
    torch.manual_seed(0)
    sources = [[int(t) for t in torch.randint(4, 60, (n % 12 + 3,))] for n in range(40)]
    beam = DecodeConfig(strategy=Strategy.beam, beam_size=4, max_len_a=1.0, max_len_b=2)
    fp32 = ModelSearch(model, torch.device("cpu")).search(sources, beam)
    int8 = ModelSearch(model, torch.device("cpu"), quantize=CpuLinear.int8).search(
        sources, dataclasses.replace(beam, quantize=CpuLinear.int8)
    )
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(fp32, int8, strict=True))
    assert same >= 24, f"{same} of 40 best hypotheses equal"


SOURCES = torch.tensor([[5, 9, 13, 7, 3], [22, 41, 3, 0, 0]])
TARGETS = torch.tensor([[2, 8, 12, 30], [2, 17, 6, 45]])


@needs_onednn
def test_every_linear_layer_and_the_output_projection_run_onednn_sharing_the_rest(random_model):
    model = random_model(vocab=50, seed=0, sharpen=1.0)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    packed = cpu_copy(model, CpuLinear.onednn)
    assert linear_kinds(packed) == {OneDnnLinear} and linear_kinds(model) == {nn.Linear}
    assert isinstance(packed.output_projection, OneDnnLinear) and model.output_projection is None
    assert packed.embed.weight is model.embed.weight  # shared, not copied
    bias = model.decoder[0].ffn.inner.bias
    assert packed.decoder[0].ffn.inner.bias.data_ptr() == bias.data_ptr()  # the same memory
    with torch.no_grad():
        reference = model.decode(TARGETS, model.encode(SOURCES))  # (B, T, V)
        logits = packed.decode(TARGETS, packed.encode(SOURCES))
    # The same float32 products summed in another order: rounding, not a percent as in int8.
    assert relative_error(logits, reference) < 1e-5
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


@needs_onednn
def test_float32_calls_on_the_cpu_search_with_the_onednn_copies_others_with_the_model(
    random_model,
):
    pair = Ensemble([random_model(vocab=60, seed=s, eos_bonus=1.0) for s in (4, 5)])
    search = ModelSearch(pair, torch.device("cpu"))
    assert search.copies == {}  # made by the first call that needs them
    onednn = members(search, DecodeConfig())
    assert [linear_kinds(member) for member in onednn.models] == [{OneDnnLinear}] * 2
    assert members(search, DecodeConfig(precision=Precision.fp32)) is onednn  # made once
    assert members(search, DecodeConfig(cpu_linear=CpuLinear.torch)) is search.ensemble
    assert members(search, DecodeConfig(precision=Precision.bf16)) is search.ensemble
    torch.manual_seed(0)
    sources = [[int(t) for t in torch.randint(4, 60, (n % 12 + 3,))] for n in range(40)]
    beam = DecodeConfig(beam_size=4, max_len_a=1.0, max_len_b=2)
    packed = search.search(sources, beam)
    plain = search.search(sources, dataclasses.replace(beam, cpu_linear=CpuLinear.torch))
    same = [(a[0], b[0]) for a, b in zip(packed, plain, strict=True) if a[0].tokens == b[0].tokens]
    # Only a near-tie (a difference in the 7th digit) can rank otherwise: next to all are equal,
    # and equal hypotheses score alike to float32 rounding.
    assert len(same) >= 36, f"{len(same)} of 40 best hypotheses equal"
    assert all(abs(ours.score - theirs.score) < 1e-4 for ours, theirs in same)


def test_decoding_pads_rows_to_few_counts_and_at_most_an_eighth_more():
    padded = {count: onednn.decoding_rows(count) for count in range(1, 8193)}
    assert onednn.decoding_rows(0) == 0
    assert all(padded[count] == count for count in range(1, 16))  # a sentence's beams: as they are
    assert all(count <= rows < count * 9 / 8 for count, rows in padded.items())
    # oneDNN caches a kernel per shape (1,024 in all): 15 counts, then 8 per doubling to 8,192.
    assert len(set(padded.values())) == 15 + 8 * 9 + 1
    assert all(onednn.decoding_rows(rows) == rows for rows in padded.values())


@needs_onednn
@pytest.mark.parametrize("count", [1, 15, 17, 100, 1000])
def test_a_onednn_layer_gives_f_linears_rows_and_the_kernel_its_padded_rows(count, monkeypatch):
    layer = nn.Linear(48, 40)
    x = torch.randn(count, 48, generator=torch.Generator().manual_seed(count))
    given = []  # the rows each kernel call is given
    product = onednn.packed_product
    monkeypatch.setattr(
        onednn, "packed_product", lambda x, *a, **k: given.append(len(x)) or product(x, *a, **k)
    )
    with torch.no_grad():
        y = OneDnnLinear(layer)(x.view(count, 1, 48))
        reference = layer(x).view(count, 1, 40)
    assert given == [onednn.decoding_rows(count)]
    assert relative_error(y, reference) < 1e-5


@pytest.mark.parametrize("kernel", [CpuLinear.onednn, *INT8_PRODUCTS])
def test_a_copy_and_its_search_leave_torchs_random_stream_alone(random_model, kernel):
    """Training validates through these copies: drawing from torch's generator there would
    make a run that validated differ from one that did not (tests/train/test_resume.py)."""
    if kernel == CpuLinear.onednn and not onednn.available():
        pytest.skip("this torch has no oneDNN")
    model = random_model(vocab=50, seed=0)
    onednn.available.cache_clear()  # its probe too, which the first search on the CPU runs
    state = torch.get_rng_state()
    onednn.available()
    copied = cpu_copy(model, kernel)
    with torch.no_grad():
        copied.decode(TARGETS, copied.encode(SOURCES))
    assert torch.equal(torch.get_rng_state(), state)


def test_without_a_working_onednn_product_float32_calls_search_with_the_model(
    random_model, monkeypatch
):
    def missing_kernel(*args, **kwargs):
        raise RuntimeError("no kernel for this CPU")  # as a build without the op would fail

    monkeypatch.setattr(onednn, "packed_product", missing_kernel)
    onednn.available.cache_clear()
    try:
        assert not onednn.available()
        search = ModelSearch(random_model(vocab=50, seed=0), torch.device("cpu"))
        assert members(search, DecodeConfig()) is search.ensemble
        assert len(search.search([[5, 6, 7]], DecodeConfig(max_len_b=3))) == 1
    finally:
        onednn.available.cache_clear()  # the next test probes the real kernel again


def test_an_int8_layer_gives_each_row_what_it_gives_that_row_alone(random_model):
    """decode.quantize=int8 quantizes each row from its own range: a row's output is bitwise the
    same whatever rows share the call. int8_batch (PyTorch's dynamic quantization) takes one
    scale from the whole batch: a row beside a row of wider range comes out otherwise."""
    model = random_model(vocab=60, seed=4)
    torch.manual_seed(0)
    narrow, wide = torch.randn(3, 16), 40 * torch.randn(2, 16)
    for kernel, independent in [(CpuLinear.int8, True), (CpuLinear.int8_batch, False)]:
        layer = cpu_copy(model, kernel).output_projection
        with torch.no_grad():
            together, alone = layer(torch.cat([narrow, wide]))[:3], layer(narrow)
        assert torch.equal(together, alone) == independent, kernel


def test_an_int8_translation_does_not_depend_on_the_sentences_batched_with_it(random_model):
    """A sentence translated alone, in a batch of 12 (shrinking) or in a batch of fixed shape:
    with int8 the same best hypotheses, with scores the same up to float rounding. (The float32
    parts, such as attention over the batch's padded length, round a little differently with
    the batch's shape, as in float32; where that moves a value across an int8 step a score moves
    by about 1e-3: at most 0.0045 over 40 such sentences, all 40 the same.) With one scale for
    the whole batch (int8_batch, what int8 was), the scores here are 0.249 apart; on Multi30k
    36 of 100 lines differed between the two shapes."""
    model = random_model(vocab=60, seed=4, eos_bonus=3.0)
    torch.manual_seed(0)
    sources = [[int(t) for t in torch.randint(4, 60, (n % 6 + 3,))] for n in range(12)]
    sources[0] = sources[0] * 4  # a longer one, with activations of another range
    search = ModelSearch(model, torch.device("cpu"), quantize=CpuLinear.int8)
    decode = DecodeConfig(beam_size=4, max_len_b=2, quantize=CpuLinear.int8)
    alone = [search.search([source], decode)[0][0] for source in sources]
    for shape in (BatchShape.shrinking, BatchShape.fixed):
        batched = dataclasses.replace(decode, batch_shape=shape)
        together = [hyps[0] for hyps in search.search(sources, batched)]
        pairs = [(a, b) for a, b in zip(together, alone, strict=True) if a.tokens == b.tokens]
        assert len(pairs) >= 11, f"{shape.value}: {len(pairs)} of 12 the same as alone"
        assert max(abs(a.score - b.score) for a, b in pairs) < 0.05, shape.value


def test_int8_batch_says_that_its_translations_depend_on_the_batch(random_model, caplog):
    """The per-batch form stays for make bench-decode to time beside the per-row one; a search
    built with it (tmt-translate, tmt-serve at start) says what it does."""
    model = random_model(vocab=50, seed=0)
    with caplog.at_level(logging.INFO):
        ModelSearch(model, torch.device("cpu"), quantize=CpuLinear.int8)
    assert "depends on the sentences" not in caplog.text
    with caplog.at_level(logging.WARNING):
        ModelSearch(model, torch.device("cpu"), quantize=CpuLinear.int8_batch)
    assert "a sentence's translation depends on the sentences translated with it" in caplog.text
