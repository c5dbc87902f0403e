"""The shared SentencePiece model: trained on both sides, ids fixed, bad sizes named."""

import pytest

from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Reservoir,
    Tokenizer,
    train_tokenizer,
)
from transformer_mt.data.toy import toy_pairs
from transformer_mt.errors import ConfigError, DataError


def test_train_encode_decode_round_trip(tmp_path):
    pairs = toy_pairs(500, seed=3)
    sentences = [s for pair in pairs for s in pair]
    tokenizer = train_tokenizer(sentences, tmp_path / "spm.model", vocab_size=400)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (
        PAD_ID,
        UNK_ID,
        BOS_ID,
        EOS_ID,
    )
    assert tokenizer.vocab_size == 400
    sentences = [pairs[0][0], pairs[0][1], "Ein großes Haus."]
    assert tokenizer.decode(tokenizer.encode(sentences)) == sentences


def test_a_vocabulary_too_large_or_too_small_says_which(tmp_path):
    with pytest.raises(ConfigError, match="'data.vocab_size': 5000 is too large"):
        train_tokenizer(["a b c", "d e f"], tmp_path / "spm.model", vocab_size=5000)
    many_characters = ["".join(chr(0x4E00 + i + j) for j in range(5)) for i in range(0, 400, 5)]
    with pytest.raises(ConfigError, match="'data.vocab_size': 300 is too small"):
        train_tokenizer(many_characters, tmp_path / "spm.model", vocab_size=300)


def test_reservoir_sample_is_bounded_and_uniform_enough():
    reservoir = Reservoir(100, seed=1)
    for i in range(10_000):
        reservoir.add(str(i))
    sample = reservoir.items
    assert len(sample) == 100 and len(set(sample)) == 100
    assert sum(int(s) >= 5000 for s in sample) > 30  # not just the first lines


@pytest.fixture(scope="module")
def toy_tokenizer(tmp_path_factory):
    sentences = [s for pair in toy_pairs(500, seed=3) for s in pair]
    return train_tokenizer(sentences, tmp_path_factory.mktemp("spm") / "spm.model", vocab_size=400)


def test_characters_never_seen_in_training_come_back_from_byte_pieces(toy_tokenizer):
    sentences = ["Der Hund 😀 sieht 猫 und Ærø.", "Łódź, Dvořák, ǅ"]  # none in the toy corpus
    ids = toy_tokenizer.encode(sentences)
    assert all(UNK_ID not in row for row in ids)
    assert toy_tokenizer.decode(ids) == sentences


def test_the_tokenizer_adds_no_normalisation_of_its_own(toy_tokenizer):
    """data.unicode_form is the only normalisation: compatibility characters that SentencePiece's
    default NFKC rule would rewrite (… to ..., a non-breaking space to a space, ﬁ to fi, ½ to 1/2)
    come back as they were."""
    sentences = ["Warte\u2026 ein\u00a0Hund", "\ufb01ne \u00bd"]
    assert toy_tokenizer.decode(toy_tokenizer.encode(sentences)) == sentences


@pytest.mark.parametrize("keep", [0, 100], ids=["empty", "truncated"])
def test_a_damaged_model_file_is_named_with_how_to_restore_it(toy_tokenizer, tmp_path, keep):
    damaged = tmp_path / "spm.model"
    damaged.write_bytes(toy_tokenizer.path.read_bytes()[:keep])
    with pytest.raises(DataError) as raised:
        Tokenizer(damaged)
    message = str(raised.value)
    assert (
        message.startswith(f"{damaged}: not a readable SentencePiece model") and "\n" not in message
    )
    assert "the prepared folder its prepared.json names" in message


def test_the_sha256_is_of_the_pieces_not_of_the_files_bytes(toy_tokenizer, tmp_path):
    """A tokenizer trained again elsewhere (a prepared folder built again) holds the same pieces
    in a file of other bytes (SentencePiece records where it was trained): the same sha256.
    Another corpus's tokenizer of the same size: another."""
    sentences = [s for pair in toy_pairs(500, seed=3) for s in pair]
    again = train_tokenizer(sentences, tmp_path / "elsewhere" / "spm.model", vocab_size=400)
    assert again.path.read_bytes() != toy_tokenizer.path.read_bytes()
    assert again.sha256 == toy_tokenizer.sha256
    others = [s for pair in toy_pairs(500, seed=4) for s in pair]
    other = train_tokenizer(others, tmp_path / "other" / "spm.model", vocab_size=400)
    assert other.vocab_size == 400 and other.sha256 != toy_tokenizer.sha256
