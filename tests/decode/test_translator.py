"""Translator: text in, text out, on a tiny random model and a small SentencePiece model."""

import dataclasses
import logging
import random

import numpy as np
import pytest
import torch

from transformer_mt.config import (
    CpuLinear,
    DecodeConfig,
    Precision,
    SdpaBackend,
    SourceLengths,
    Strategy,
)
from transformer_mt.data.tokenizer import UNK_ID
from transformer_mt.decode.search import Hypothesis
from transformer_mt.decode.translator import ModelSearch, Translation, Translator
from transformer_mt.errors import ConfigError
from transformer_mt.execution import ExecutionPolicy

VOCAB, POSITIONS = 400, 24  # the position table: 23 pieces + EOS (it grows past them)


@pytest.fixture
def make_translator(random_model, tokenizers):
    def make(seed: int = 0, sharpen: float = 1.0, **decode) -> Translator:
        model = random_model(VOCAB, seed, max_positions=POSITIONS, sharpen=sharpen, eos_bonus=4.0)
        config = DecodeConfig(max_len_a=1.0, max_len_b=3, **decode)
        return Translator.for_model(model, tokenizers, config, torch.device("cpu"))

    return make


def sentences_of_shuffled_lengths() -> list[str]:
    text = "the dog sees a small cat near the old house by the river"
    sentences = [text.rsplit(" ", n)[0] + "." for n in range(13)]  # 13 words down to 1
    random.Random(0).shuffle(sentences)
    return sentences


@pytest.mark.parametrize(
    "decode", [{"strategy": Strategy.greedy, "beam_size": 1}, {"beam_size": 3}]
)
def test_output_order_is_input_order_whatever_the_lengths(make_translator, decode):
    translator = make_translator(batch_tokens=40, **decode)  # several batches, sorted by length
    sentences = sentences_of_shuffled_lengths()
    assert len(translator.batches(translator.encode(sentences))) > 1
    one_by_one = [translator.translate([sentence])[0] for sentence in sentences]
    assert translator.translate(sentences) == one_by_one
    assert len(set(one_by_one)) > 1  # the check compares distinct outputs


def test_a_call_checks_its_settings_and_builds_its_execution_policy_once(
    make_translator, monkeypatch
):
    """The policy that batches a call's sentences is the one each batch searches with: built
    once a call (not again for the batches, nor twice in each search), with the settings given
    or the defaults, and attention maps read in the call's batches too."""
    translator = make_translator(batch_tokens=40)  # several batches
    built = []
    for_decoding = ExecutionPolicy.for_decoding.__func__

    def counted(cls, decode, device):
        built.append(decode)
        return for_decoding(cls, decode, device)

    monkeypatch.setattr(ExecutionPolicy, "for_decoding", classmethod(counted))
    searched = []
    search = translator.backend.search
    monkeypatch.setattr(
        translator.backend,
        "search",
        lambda sources, decode, policy: searched.append(policy) or search(sources, decode, policy),
    )
    sentences = sentences_of_shuffled_lengths()
    translator.translate(sentences)
    assert len(built) == 1 and len(searched) > 1 and len(set(map(id, searched))) == 1
    built.clear()
    greedy = dataclasses.replace(translator.decode, strategy=Strategy.greedy, beam_size=1)
    translator.translate_nbest(sentences, decode=greedy, attention=-1)
    assert len(built) == 1 and built[0].strategy == Strategy.greedy


def test_empty_input_lines_give_empty_output_lines(make_translator):
    translator = make_translator(nbest=2)
    outputs = translator.translate(["", "the dog.", "   ", ""])
    assert len(outputs) == 4 and outputs[0] == outputs[2] == outputs[3] == ""
    assert translator.translate_nbest([""]) == [[Translation("", 0.0)]]


@pytest.mark.parametrize(
    "decode", [{"strategy": Strategy.greedy, "beam_size": 1}, {"beam_size": 2}]
)
def test_a_300_word_line_longer_than_the_table_translates_completely(
    make_translator, caplog, decode
):
    translator = make_translator(**decode)
    thirteen_words = "the dog sees a small cat near the old house by the river"
    line = " ".join([thirteen_words] * 23) + " today."  # 300 words
    (ids,) = translator.encode([line])
    assert len(ids) >= 300 > POSITIONS
    with caplog.at_level(logging.WARNING, logger="transformer_mt.decode.translator"):
        (output,) = translator.translate_ids([ids])
    assert "truncated" not in caplog.text
    # The search read the whole source (the output is not the one of its first 23 pieces) and
    # wrote past the old table, up to the source's own limit (a * length + b, EOS included).
    assert output != translator.translate_ids([ids[: POSITIONS - 1]])[0]
    assert POSITIONS < len(output) < len(ids) + 3
    (text,) = translator.translate([line])
    assert text == translator.tokenizers.tgt.decode([output])[0]


def test_nbest_lists_are_ordered_by_score_and_start_with_the_translation(make_translator):
    translator = make_translator(beam_size=4, nbest=3)
    sentences = sentences_of_shuffled_lengths()
    nbest = translator.translate_nbest(sentences)
    assert [translations[0].text for translations in nbest] == translator.translate(sentences)
    for translations in nbest:
        assert 1 <= len(translations) <= 3
        scores = [t.score for t in translations]
        assert scores == sorted(scores, reverse=True)
    assert max(len(translations) for translations in nbest) == 3


def test_sampling_translator_is_reproducible_from_its_seed(make_translator):
    sentences = sentences_of_shuffled_lengths()

    def sampled(seed: int) -> list[str]:
        translator = make_translator(sharpen=0.25, strategy=Strategy.sample, beam_size=1, seed=seed)
        return translator.translate(sentences)

    assert sampled(5) == sampled(5)
    assert sampled(6) != sampled(5)


def test_greedy_and_sampling_give_one_translation_whatever_nbest(make_translator):
    for strategy in (Strategy.greedy, Strategy.sample):
        translator = make_translator(strategy=strategy, beam_size=1, nbest=3)
        assert [len(t) for t in translator.translate_nbest(["the dog.", "a cat."])] == [1, 1]


def test_invalid_temperature_is_named_before_any_work(make_translator):
    with pytest.raises(ConfigError, match=r"'decode\.temperature': must be in \[1e-06"):
        make_translator(strategy=Strategy.sample, temperature=0.0)


def test_attention_kernels_the_device_lacks_are_named_when_the_translator_is_made(
    make_translator,
):
    """On the CPU [efficient] failed at the first attention call of every search (a traceback
    per request in the server); now the translator is refused where it is made."""
    with pytest.raises(ConfigError, match=r"'decode\.sdpa_backends': \[efficient\]: none"):
        make_translator(sdpa_backends=[SdpaBackend.efficient])


@pytest.mark.parametrize("decode", [{"strategy": Strategy.greedy}, {"beam_size": 3}])
def test_unseen_characters_translate_without_unknown_pieces(make_translator, decode):
    translator = make_translator(**decode)
    with torch.no_grad():  # the unknown piece's logit stands out: a search that allows it picks it
        embed = translator.backend.model.embed
        embed.weight[UNK_ID] = embed.weight[4:].sum(dim=0)
    sentences = ["the dog 😀 sees 猫.", "Łódź and Dvořák."]
    assert all(UNK_ID not in ids for ids in translator.encode(sentences))
    outputs = translator.translate(sentences)
    assert all(output and "\u2047" not in output for output in outputs)  # no ' ⁇ '


def test_nfc_translation_keeps_compatibility_characters(make_translator):
    translator = make_translator()  # data.unicode_form NFC: … and the non-breaking space stay
    sentence = "the dog\u2026 sees\u00a0a cat."
    assert translator.tokenizers.src.decode(translator.encode([sentence])) == [sentence]


def test_a_line_break_spelled_in_byte_pieces_does_not_break_the_output_line(make_translator):
    translator = make_translator(strategy=Strategy.greedy)
    byte_pieces = [
        translator.tokenizers.tgt.processor.piece_to_id(f"<0x{b:02X}>") for b in (10, 29)
    ]
    dog = translator.tokenizers.tgt.encode(["dog"])[0]
    translator.translate_ids = lambda ids, decode=None, terms=None: [
        [*dog, byte_pieces[0], *dog, byte_pieces[1]] for _ in ids
    ]
    (output,) = translator.translate(["the dog."])  # the model "wrote" a newline and a U+001D
    assert output.splitlines() == [output] and output.split() == ["dog", "dog"]


def record_logit_dtypes(model) -> list[torch.dtype]:
    """The dtype of the logits of every model.decode call from now on (bf16 under CPU autocast,
    whose linear layers compute in bf16; float32 without it)."""
    dtypes, decode = [], model.decode

    def recording(tgt_in, encoded, cache=None):
        logits = decode(tgt_in, encoded, cache)
        dtypes.append(logits.dtype)
        return logits

    model.decode = recording
    return dtypes


@pytest.mark.parametrize("strategy", [Strategy.beam, Strategy.greedy, Strategy.sample])
def test_decode_precision_bf16_searches_under_autocast_and_auto_is_fp32_on_the_cpu(
    make_translator, strategy
):
    translator = make_translator(strategy=strategy, beam_size=2 if strategy == Strategy.beam else 1)
    dtypes = record_logit_dtypes(translator.backend.model)
    sentences = sentences_of_shuffled_lengths()
    assert translator.decode.precision == Precision.auto
    translator.translate(sentences)
    assert set(dtypes) == {torch.float32}
    dtypes.clear()
    bf16 = dataclasses.replace(translator.decode, precision=Precision.bf16)
    outputs = translator.translate(sentences, decode=bf16)
    assert set(dtypes) == {torch.bfloat16}
    assert len(outputs) == len(sentences) and all(outputs)


def test_decode_precision_fp32_is_fp32_inside_an_enclosing_autocast(make_translator):
    """Training's validation translates inside the trainer's autocast: the decode setting wins."""
    translator = make_translator(beam_size=2)
    dtypes = record_logit_dtypes(translator.backend.model)
    fp32 = dataclasses.replace(translator.decode, precision=Precision.fp32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        translator.translate(["the dog sees a cat."], decode=fp32)
    assert set(dtypes) == {torch.float32}


class Echo:
    """A search backend that gives each source back, and says nothing of precision or
    quantization (SearchBackend's defaults: auto, none)."""

    name = "echo"
    strategies = (Strategy.beam,)
    max_source_tokens = None

    def search(self, sources, decode, policy):
        return [[Hypothesis(list(source), 0.0)] for source in sources]


def test_a_precision_or_quantization_a_backend_does_not_offer_is_named(tokenizers):
    translator = Translator(Echo(), tokenizers, DecodeConfig())
    assert translator.translate(["the dog."]) == ["the dog."]
    not_offered = r"'decode\.precision': bf16 is not available with a echo model \(auto\)"
    with pytest.raises(ConfigError, match=not_offered):
        translator.translate(["the dog."], decode=DecodeConfig(precision=Precision.bf16))
    with pytest.raises(ConfigError, match=r"'decode\.quantize': int8 is chosen when the model is"):
        translator.translate(["the dog."], decode=DecodeConfig(quantize=CpuLinear.int8))


class EchoOnCuda(Echo):
    """Echo, saying it runs on CUDA (as ModelSearch says its device)."""

    device = torch.device("cuda")


def test_decode_batch_tokens_null_is_the_default_of_the_backends_device(tokenizers):
    """decode.batch_tokens=null (the default) batches by the device's own budget: the CPU's
    4,000 source tokens (a backend that names no torch device too), CUDA's provisional 16,384;
    a value given is kept. The batches follow it."""
    assert DecodeConfig().batch_tokens is None
    on_cpu = Translator(Echo(), tokenizers, DecodeConfig())
    on_cuda = Translator(EchoOnCuda(), tokenizers, DecodeConfig())
    assert on_cpu.decode.batch_tokens == 4000 and on_cuda.decode.batch_tokens == 16384
    given = DecodeConfig(batch_tokens=123)
    assert on_cuda.checked(given).batch_tokens == 123
    sources = [[5] * 99] * 300  # 300 sources of 100 tokens with EOS: 30,000 tokens
    assert [len(b) for b in on_cpu.batches(sources)] == [40] * 7 + [20]
    assert [len(b) for b in on_cuda.batches(sources)] == [163, 137]
    assert [len(b) for b in on_cuda.batches(sources, given)] == [1] * 300


@pytest.mark.parametrize("strategy", [Strategy.beam, Strategy.greedy])
@pytest.mark.parametrize("fixed_shape", [False, True])
def test_translations_equal_the_masked_paths(random_model, strategy, fixed_shape):
    """Sources of several lengths decoded in batches of one source length where a length fills
    half a batch (no masks) and in batches of similar lengths (padded, masked): the same
    translations, scores within float rounding (a sharpened random model: no near-ties)."""
    model = random_model(vocab=24, seed=2, sharpen=4.0, eos_bonus=3.0)
    rng = np.random.default_rng(5)
    sources = [rng.integers(4, 24, int(n)).tolist() for n in rng.integers(2, 7, 60)]
    decode = DecodeConfig(strategy=strategy, max_len_a=1.0, max_len_b=4, batch_tokens=100)
    if fixed_shape:
        decode = dataclasses.replace(decode, batch_shape="fixed")
    translator = Translator(ModelSearch(model, torch.device("cpu")), tokenizers=None, decode=decode)
    found = {}
    for lengths in (SourceLengths.equal, SourceLengths.similar):
        call = dataclasses.replace(decode, source_lengths=lengths)
        one_length = [
            len({len(sources[i]) for i in b}) == 1 for b in translator.batches(sources, call)
        ]
        assert any(one_length) if lengths == SourceLengths.equal else not all(one_length)
        found[lengths] = translator.nbest_ids(sources, call)
    equal, masked = found[SourceLengths.equal], found[SourceLengths.similar]
    assert [h[0].tokens for h in equal] == [h[0].tokens for h in masked]
    assert [h[0].score for h in equal] == pytest.approx([h[0].score for h in masked], abs=1e-4)
