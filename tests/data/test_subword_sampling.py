"""Subword regularization: sampled segmentations drawn once, one picked per pair and epoch."""

from __future__ import annotations

import numpy as np
import pytest
from test_corpora import toy_data

from transformer_mt.config import compose_job
from transformer_mt.data.corpora import CorpusMix, prepare_corpora
from transformer_mt.data.store import TokenArray
from transformer_mt.data.subword_sampling import capped, sampled_folder
from transformer_mt.errors import ConfigError, DataError

SAMPLED = ["data.src_subword_alpha=0.1", "data.tgt_subword_alpha=0.1", "data.subword_samples=3"]


def test_samples_are_other_segmentations_of_the_same_text(tmp_path):
    cfg = toy_data(tmp_path, *SAMPLED)
    data = prepare_corpora(cfg)
    mix = CorpusMix.of(data, cfg)
    assert len(mix.stores) == 3 and mix.offsets.tolist() == [0, 300, 600, 900]
    tokenizers = data.tokenizers
    for side, tokenizer, best in (
        ("src", tokenizers.src, data.train.src),
        ("tgt", tokenizers.tgt, data.train.tgt),
    ):
        text = tokenizer.decode([best[i].tolist() for i in range(300)])
        differ = 0
        for store in mix.stores:
            sample = TokenArray.load(getattr(store, side))
            assert tokenizer.decode([sample[i].tolist() for i in range(300)]) == text
            differ += sum(not np.array_equal(sample[i], best[i]) for i in range(300))
        # BPE-dropout at 0.1 splits most sentences of 5-15 words somewhere
        assert differ > 3 * 300 // 2, (side, differ)
    # the samples are longer, and the mix's lengths are theirs
    assert mix.src_lengths.mean() > data.train.src.lengths.mean()


def test_each_epoch_picks_a_sample_per_pair_again_and_the_same_for_the_same_seed_and_epoch(
    tmp_path,
):
    cfg = toy_data(tmp_path, *SAMPLED)
    mix = CorpusMix.of(prepare_corpora(cfg), cfg)
    epochs = [mix.epoch_examples(seed=1, epoch=epoch) for epoch in range(3)]
    for examples in epochs:
        assert np.array_equal(np.sort(examples % 300), np.arange(300))  # each pair once
        assert len(set(examples // 300)) == 3  # from each of the samples
    assert not np.array_equal(epochs[0], epochs[1])
    assert np.array_equal(epochs[1], mix.epoch_examples(seed=1, epoch=1))
    assert not np.array_equal(epochs[1], mix.epoch_examples(seed=2, epoch=1))
    assert mix.counts(epochs[0]) == {
        "toy": {
            "pairs": 300,
            "src_tokens": int(mix.src_lengths[epochs[0]].sum()),
            "tgt_tokens": int(mix.tgt_lengths[epochs[0]].sum()),
        }
    }


def test_one_side_sampled_reads_the_other_from_the_best_segmentation(tmp_path):
    cfg = toy_data(tmp_path, "data.tgt_subword_alpha=0.1")
    data = prepare_corpora(cfg)
    mix = CorpusMix.of(data, cfg)
    assert len(mix.stores) == 4  # the default number of samples
    for store in mix.stores:
        assert store.src == data.folder / "train.src"
        assert store.tgt.parent == sampled_folder(cfg, data.folder)


def test_valid_and_the_prepared_corpus_are_never_sampled(tmp_path):
    plain = prepare_corpora(toy_data(tmp_path))
    sampled = prepare_corpora(toy_data(tmp_path, *SAMPLED))
    assert sampled.folder == plain.folder  # the same folder: nothing prepared again
    for split in ("train", "valid"):
        for side in ("src", "tgt"):
            ours, theirs = getattr(sampled, split), getattr(plain, split)
            assert np.array_equal(getattr(ours, side).tokens, getattr(theirs, side).tokens)
    text = plain.valid_text(20)[0]
    assert [plain.valid.src[i].tolist() for i in range(20)] == plain.tokenizers.src.encode(text)


def test_another_alpha_draws_new_samples_and_prepares_nothing_else(tmp_path):
    first = toy_data(tmp_path, *SAMPLED)
    data = prepare_corpora(first)
    made = {p.name: p.stat().st_ino for p in (tmp_path / "prepared").iterdir()}
    second = toy_data(tmp_path, *SAMPLED[1:], "data.src_subword_alpha=0.2")
    prepare_corpora(second)
    now = {p.name: p.stat().st_ino for p in (tmp_path / "prepared").iterdir()}
    assert {name: now[name] for name in made} == made
    assert set(now) - set(made) == {sampled_folder(second, data.folder).name}


def test_a_damaged_sample_is_one_line_naming_its_file(tmp_path):
    cfg = toy_data(tmp_path, *SAMPLED)
    data = prepare_corpora(cfg)
    damaged = sampled_folder(cfg, data.folder) / "train.1.tgt.bin"
    damaged.write_bytes(damaged.read_bytes()[:-2])
    with pytest.raises(DataError) as refused:
        prepare_corpora(cfg)
    assert str(damaged) in str(refused.value) and "\n" not in str(refused.value)


def test_a_sample_longer_than_the_limit_keeps_the_best_segmentation():
    best = TokenArray.from_lists([[5, 6], [7, 8, 9], [10]])
    samples = np.array([50, 51, 52, 70, 71, 72, 73, 100], dtype=np.int32)
    tokens, lengths, replaced = capped(samples, np.array([3, 4, 1]), best, 0, limit=3)
    assert replaced == 1 and lengths.tolist() == [3, 3, 1]
    assert tokens.tolist() == [50, 51, 52, 7, 8, 9, 100]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.src_subword_alpha=1.0"], "data.src_subword_alpha"),
        (["data.tgt_subword_alpha=-0.1"], "data.tgt_subword_alpha"),
        (["data.subword_samples=0"], "data.subword_samples"),
        (["data.src_subword_alpha=0.1", "data.subword_samples=1"], "data.subword_samples"),
    ],
)
def test_a_bad_sampling_setting_is_refused_by_its_key(overrides, key):
    job = compose_job("train", ["data=toy", *overrides])
    with pytest.raises(ConfigError) as refused:
        job.validate()
    assert f"config key '{key}'" in str(refused.value) and "\n" not in str(refused.value)
