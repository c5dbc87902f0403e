"""Word alignments from cross-attention (decode/alignment.py): pieces grouped into the text's
words, each target word aligned at the step where it is the decoder's input, one source word
each; through the Translator and tmt-translate's alignment= file."""

import random

import pytest
import torch

from transformer_mt.commands.translate import translate
from transformer_mt.config import DecodeConfig, compose_job
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode.alignment import pharaoh, piece_words, word_alignment
from transformer_mt.decode.translator import AttentionMap, Translator
from transformer_mt.errors import ConfigError

VOCAB = 400


def test_pieces_are_grouped_into_the_words_of_the_text():
    pieces = ["▁Der", "▁Hund", "e", "▁", ",", "▁schläft", "<0xE2>", "▁", "▁.", "▁"]
    assert piece_words(pieces) == [0, 1, 1, None, 2, 3, 3, None, 4, None]
    assert "".join(pieces).replace("<0xE2>", "").replace("▁", " ").split() == [
        "Der",
        "Hunde",
        ",",
        "schläft",
        ".",
    ]
    assert piece_words([]) == [] and piece_words(["a", "b"]) == [0, 0]
    assert piece_words(["▁", "▁"]) == [None, None]


def one_hot(rows: list[int], columns: int) -> list[list[float]]:
    return [[1.0 if column == hot else 0.0 for column in range(columns)] for hot in rows]


def test_a_target_word_is_aligned_at_the_step_that_predicts_it():
    """Rows: the target pieces' steps then EOS's; row i is read for target piece i. Source
    columns: one tag, three pieces of two words, EOS."""
    attention = AttentionMap(
        source_pieces=["<2en>", "▁the", "▁do", "g", "</s>"],
        target_pieces=["▁der", "▁Hund", "</s>"],
        # row 0 (predicts 'der') looks at 'the'; row 1 (predicts 'Hund') at 'g'; row 2 at 'dog'
        weights=one_hot([1, 3, 2], 5),
        layer=0,
    )
    assert word_alignment(attention, tags=1) == [(0, 0), (1, 1)]
    assert pharaoh(word_alignment(attention, tags=1)) == "0-0 1-1"
    # Tags are not words: without skipping it, the tag's column would be word 0.
    assert word_alignment(attention, tags=0) == [(1, 0), (2, 1)]


def test_a_word_of_several_pieces_sums_its_pieces_weights():
    attention = AttentionMap(
        source_pieces=["▁a", "▁b", "c", "</s>"],
        target_pieces=["▁x", "</s>"],
        weights=[[0.4, 0.3, 0.3, 0.0], [1, 0, 0, 0]],  # 'b'+'c' = 0.6 > 'a' = 0.4
        layer=0,
    )
    assert word_alignment(attention) == [(1, 0)]
    empty = AttentionMap(["▁a", "</s>"], ["</s>"], [[0.5, 0.5]], 0)
    assert word_alignment(empty) == []


def test_every_word_of_a_translation_gets_one_source_word(random_model, tokenizers):
    model = random_model(VOCAB, 3, eos_bonus=4.0)
    translator = Translator.for_model(
        model, tokenizers, DecodeConfig(max_len_b=4), torch.device("cpu")
    )
    sentences = [src for src, _ in toy_pairs(12, seed=8)] + [""]
    random.Random(1).shuffle(sentences)
    layer = translator.alignment_layer(None)
    assert layer == 1  # the last of 2 decoder layers
    found = translator.translate_nbest(sentences, alignment=0, attention=-1)
    for sentence, (best, *_) in zip(sentences, found, strict=True):
        if not sentence:
            assert best.alignment is None
            continue
        words, source_words = best.text.split(), sentence.split()
        assert sorted(target for _, target in best.alignment) == list(range(len(words)))
        assert all(0 <= source < len(source_words) for source, _ in best.alignment)
        assert best.attention.layer == 1  # the attention asked for, another layer
    same_layer = translator.translate_nbest(sentences, alignment=1, attention=1)
    alone = translator.translate_nbest(sentences, alignment=1)
    assert [n[0].alignment for n in same_layer] == [n[0].alignment for n in alone]
    with pytest.raises(ConfigError, match="'alignment_layer': layer 2, but the decoder has 2"):
        translator.alignment_layer(2)


def test_tmt_translate_writes_a_line_of_pairs_per_input_line(one_update_run, tmp_path):
    source = tmp_path / "in.en"
    source.write_text("the dog sees two cats .\n\nthe cat sleeps .\n", encoding="utf-8")
    output, alignment = tmp_path / "out.de", tmp_path / "out.align"
    job = compose_job(
        "translate",
        [f"run_dir={one_update_run}", f"input={source}", f"output={output}"]
        + [f"alignment={alignment}", "decode.max_len_a=0", "decode.max_len_b=5", "device=cpu"],
    )
    translate(job)
    outputs = output.read_text(encoding="utf-8").splitlines()
    lines = alignment.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and lines[1] == ""
    for text, line, sentence in zip(outputs, lines, source.read_text().splitlines(), strict=True):
        pairs = [tuple(map(int, pair.split("-"))) for pair in line.split()]
        assert sorted(target for _, target in pairs) == list(range(len(text.split())))
        assert all(source_word < len(sentence.split()) for source_word, _ in pairs)
    refused = compose_job(
        "translate",
        [f"run_dir={one_update_run}", f"input={source}", f"alignment={source}", "device=cpu"],
    )
    with pytest.raises(ConfigError, match="config key 'alignment'.*same file as input"):
        translate(refused)
