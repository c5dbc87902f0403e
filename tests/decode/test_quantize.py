"""decode.quantize=int8 (decode/quantize.py): every linear layer and the output projection in
int8, close to float32; on the CPU only; the loaded model and the checkpoint left as they were."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from transformer_mt.commands.train import train
from transformer_mt.config import (
    DecodeConfig,
    DecodePrecision,
    Quantize,
    Strategy,
    compose_job,
    validate_decode,
)
from transformer_mt.decode.loading import load_translator, translator_from_export
from transformer_mt.decode.quantize import Int8Transformer
from transformer_mt.decode.search import Ensemble
from transformer_mt.decode.translator import ModelSearch
from transformer_mt.errors import ConfigError
from transformer_mt.files import file_sha256

INT8 = DecodeConfig(quantize=Quantize.int8)


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return float((x - reference).norm() / reference.norm())


def test_every_linear_layer_and_the_output_projection_compute_in_int8(random_model):
    model = random_model(vocab=50, seed=0, sharpen=1.0)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    quantized = Int8Transformer(model)
    float_linears = [name for name, m in quantized.named_modules() if type(m) is nn.Linear]
    assert float_linears == []
    assert isinstance(quantized.projection, DynamicInt8Linear)
    assert quantized.projection.weight().dtype == torch.qint8
    src = torch.tensor([[5, 9, 13, 7, 3], [22, 41, 3, 0, 0]])
    tgt_in = torch.tensor([[2, 8, 12, 30], [2, 17, 6, 45]])
    with torch.no_grad():
        reference = model.decode(tgt_in, model.encode(src))  # (B, T, V)
        logits = quantized.decode(tgt_in, quantized.encode(src))
    # int8 weights (a scale per row: rounding error <= 1/254 of the row's largest weight, about
    # 1% of a typical one) and 7-bit activations (fbgemm's reduce_range: steps of 1/127 of each
    # input's range) put each of the 9 layers' outputs about 1-2% off float32; through residuals
    # and LayerNorm that stays a few percent, far from the 100% of unrelated logits.
    error = relative_error(logits, reference)
    assert 0 < error < 0.1
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_int8_is_refused_on_cuda_and_with_bf16_naming_the_key(random_model):
    model = random_model(vocab=50, seed=0)
    with pytest.raises(ConfigError, match=r"'decode\.quantize': int8 runs on the CPU only"):
        ModelSearch(model, torch.device("cuda"), quantize=Quantize.int8)
    with pytest.raises(ConfigError, match=r"'decode\.precision': bf16 cannot run int8 weights"):
        validate_decode(dataclasses.replace(INT8, precision=DecodePrecision.bf16))
    with pytest.raises(ConfigError, match=r"'decode\.quantize': int8 is for transformer_mt"):
        translator_from_export("never-read", decode=INT8)  # refused before the folder is read
    job = compose_job("eval", ["run_dir=x", "decode.quantize=int8"])
    assert job.decode.quantize == Quantize.int8 and job.decode.precision == DecodePrecision.auto


def test_each_member_of_an_ensemble_searches_in_int8(random_model):
    pair = Ensemble([random_model(vocab=50, seed=1, eos_bonus=3.0) for _ in range(2)])
    search = ModelSearch(pair, torch.device("cpu"), quantize=Quantize.int8)
    assert all(isinstance(member, Int8Transformer) for member in search.ensemble.models)
    assert all(type(member) is not Int8Transformer for member in pair.models)  # copies
    nbest = search.search([[5, 6, 7], [8, 9]], INT8)
    assert [len(hyps) >= 1 for hyps in nbest] == [True, True]
    attention = search.cross_attention([[5, 6, 7]], [nbest[0][0].tokens], layer=-1)
    assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in attention[0])


def test_int8_leaves_the_checkpoint_on_disk_unchanged(tiny_train_job):
    checkpoint = train(tiny_train_job("trainer.max_steps=1", "trainer.valid_bleu_sentences=0"))
    run_dir = checkpoint.parents[1]
    digest, modified = file_sha256(checkpoint), checkpoint.stat().st_mtime_ns
    translator = load_translator(run_dir, decode=INT8, device="cpu")
    assert isinstance(translator.backend.model, Int8Transformer)
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
    int8 = ModelSearch(model, torch.device("cpu"), quantize=Quantize.int8).search(
        sources, dataclasses.replace(beam, quantize=Quantize.int8)
    )
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(fp32, int8, strict=True))
    assert same >= 24, f"{same} of 40 best hypotheses equal"
