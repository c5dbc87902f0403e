"""The shared SentencePiece model: trained on both sides, ids fixed, bad sizes named."""

import pytest

from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Reservoir,
    train_tokenizer,
)
from transformer_mt.data.toy import toy_pairs
from transformer_mt.errors import ConfigError


def test_train_encode_decode_round_trip(tmp_path):
    pairs = toy_pairs(500, seed=3)
    sentences = [s for pair in pairs for s in pair]
    tokenizer = train_tokenizer(sentences, tmp_path / "spm.model", vocab_size=300)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (
        PAD_ID,
        UNK_ID,
        BOS_ID,
        EOS_ID,
    )
    assert tokenizer.vocab_size == 300
    sentences = [pairs[0][0], pairs[0][1], "Ein großes Haus."]
    assert tokenizer.decode(tokenizer.encode(sentences)) == sentences


def test_too_large_vocabulary_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="data.vocab_size"):
        train_tokenizer(["a b c", "d e f"], tmp_path / "spm.model", vocab_size=5000)


def test_reservoir_sample_is_bounded_and_uniform_enough():
    reservoir = Reservoir(100, seed=1)
    for i in range(10_000):
        reservoir.add(str(i))
    sample = reservoir.items
    assert len(sample) == 100 and len(set(sample)) == 100
    assert sum(int(s) >= 5000 for s in sample) > 30  # not just the first lines
