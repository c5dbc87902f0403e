"""Several training corpora (data.corpora): weights, tags, the prepared cache, bad input."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from console_commands import run_commands_together

from transformer_mt.config import DataConfig, compose_job
from transformer_mt.data.batching import BatchDataset, epoch_batches
from transformer_mt.data.corpora import CorpusMix, MixPart, prepare_corpora
from transformer_mt.data.store import ParallelTokens, StoredSplit, TokenArray
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.errors import ConfigError, DataError


def stored(folder: Path, size: int, seed: int) -> ParallelTokens:
    """A store of `size` pairs of 3-12 ids (the same length distribution for every seed)."""
    rng = np.random.default_rng(seed)
    sides = [
        TokenArray.from_lists(
            [list(rng.integers(10, 99, rng.integers(3, 13))) for _ in range(size)]
        )
        for _ in range(2)
    ]
    data = ParallelTokens(*sides)
    data.save(folder, "train")
    return ParallelTokens.load(folder, "train")


def mix_of(tmp_path: Path, sizes_weights: list[tuple[int, float]]) -> CorpusMix:
    parts, tokens = [], []
    for index, (size, weight) in enumerate(sizes_weights):
        folder = tmp_path / f"corpus{index}"
        tokens.append(stored(folder, size, seed=index))
        parts.append(MixPart(f"c{index}", (StoredSplit.of(folder, "train"),), weight, size))
    return CorpusMix(parts, tokens)


def test_an_epoch_holds_each_corpus_as_often_as_its_weight_says(tmp_path):
    mix = mix_of(tmp_path, [(3000, 1.0), (2000, 0.5), (500, 2.0), (100, 1.25)])
    counts = [mix.counts(mix.epoch_examples(seed=1, epoch=epoch)) for epoch in range(3)]
    for epoch in counts:
        assert [epoch[f"c{i}"]["pairs"] for i in range(4)] == [3000, 1000, 1000, 125]
    halves = [set(mix.epoch_examples(seed=1, epoch=epoch)) for epoch in range(2)]
    corpus1 = set(range(3000, 5000))
    assert halves[0] & corpus1 != halves[1] & corpus1  # another half each epoch
    again = mix.epoch_examples(seed=1, epoch=1)  # but the same half for the same (seed, epoch)
    assert np.array_equal(again, mix.epoch_examples(seed=1, epoch=1))
    weight_two = mix.epoch_examples(seed=1, epoch=0)
    assert np.array_equal(
        np.bincount(weight_two[(weight_two >= 5000) & (weight_two < 5500)])[5000:], [2] * 500
    )


def test_batches_follow_the_weights_within_binomial_bounds(tmp_path):
    """Corpora of one length distribution: the share of each in a run of batches is a draw of
    its share of the epoch. Over 60 batches of an epoch (about 2,100 examples) each corpus's
    count stays within 5 standard deviations of the binomial's mean (a 6e-7 chance each to fail
    by chance; the seeds are fixed, so the test is deterministic, but not tuned: any seed
    passes unless the mixing is wrong)."""
    mix = mix_of(tmp_path, [(4000, 1.0), (4000, 0.25), (1000, 3.0)])
    shares = np.array([4000, 1000, 3000]) / 8000
    for epoch in range(3):
        examples = mix.epoch_examples(seed=7, epoch=epoch)
        batches = epoch_batches(
            mix.src_lengths[examples], mix.tgt_lengths[examples], 500, seed=7, epoch=epoch
        )
        drawn = np.concatenate([examples[batch] for batch in batches[:60]])
        part = np.searchsorted(mix.offsets, drawn, side="right") - 1
        observed = np.bincount(part, minlength=3)
        n = len(drawn)
        for count, share in zip(observed, shares, strict=True):
            assert abs(count - n * share) <= 5 * math.sqrt(n * share * (1 - share)), (
                epoch,
                observed,
            )


def test_one_corpus_of_weight_one_is_the_corpus_in_order(tmp_path):
    """What keeps a run of one corpus the same as before data.corpora existed."""
    mix = mix_of(tmp_path, [(500, 1.0)])
    assert np.array_equal(mix.epoch_examples(seed=3, epoch=2), np.arange(500))


def test_a_batch_reads_each_corpus_from_its_store_with_its_tag_first(tmp_path):
    mix = mix_of(tmp_path, [(50, 1.0), (40, 1.0)])
    tagged = [
        MixPart(
            p.name, (dataclasses.replace(p.stores[0], src_prefix=(7,) if i else ()),), 1.0, p.size
        )
        for i, p in enumerate(mix.parts)
    ]
    dataset = BatchDataset(
        [part.stores[0] for part in tagged],
        [np.array([3, 50, 89])],
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )
    batch = dataset[0]
    first, second = (ParallelTokens.load(tmp_path / f"corpus{i}", "train") for i in range(2))
    expected = [first.src[3], [7, *second.src[0]], [7, *second.src[39]]]
    for row, tokens in zip(batch.src.tolist(), expected, strict=True):
        assert row[: len(tokens) + 1] == [*map(int, tokens), EOS_ID]
    targets = [first.tgt[3], second.tgt[0], second.tgt[39]]
    for row, tokens in zip(batch.tgt_out.tolist(), targets, strict=True):
        assert row[: len(tokens) + 1] == [*map(int, tokens), EOS_ID] and 7 not in row


def toy_data(tmp_path: Path, *overrides: str) -> DataConfig:
    job = compose_job(
        "train",
        [
            "data=toy",
            "data.toy_sizes=[300,20,20]",
            "data.vocab_size=400",
            f"data.prepared_dir={tmp_path / 'prepared'}",
            *overrides,
        ],
    )
    job.data.validate()
    return job.data


BT = ['+data.corpora.bt={toy_seed:2,toy_sizes:[200,1,1],tag:"<BT>"}']


def test_tags_are_pieces_of_their_own_only_where_they_belong(tmp_path):
    data = prepare_corpora(toy_data(tmp_path, *BT, 'data.tag="<main>"'))
    tokenizer = data.tokenizers.src
    processor = tokenizer.processor
    ids = {tag: processor.piece_to_id(tag) for tag in ("<BT>", "<main>")}
    assert all(processor.is_control(i) for i in ids.values())
    # Text never encodes to a tag, even text that spells one.
    spelled = tokenizer.encode(["<BT> ein Haus <main>"])[0]
    assert not set(spelled) & set(ids.values())
    for store in (data.train, data.extra[0].train):  # the stores hold no tags: batches add them
        assert not np.isin(store.src.tokens, list(ids.values())).any()
    mix = CorpusMix.of(data, toy_data(tmp_path, *BT, 'data.tag="<main>"'))
    assert [p.stores[0].src_prefix for p in mix.parts] == [(ids["<main>"],), (ids["<BT>"],)]


def test_adding_a_corpus_or_changing_a_weight_prepares_nothing_again(tmp_path):
    """Under one tokenizer (data.spm_model): a tokenizer trained on every corpus changes when a
    corpus is added, and with it every corpus's encoding."""
    first = prepare_corpora(toy_data(tmp_path))
    pinned = f"data.spm_model={first.folder / 'spm.model'}"
    one = prepare_corpora(toy_data(tmp_path, pinned, "+data.corpora.a={toy_seed:3}"))
    made = {p: p.stat().st_ino for p in (tmp_path / "prepared").iterdir()}
    two = prepare_corpora(
        toy_data(
            tmp_path,
            pinned,
            "+data.corpora.a={toy_seed:3,weight:2.5}",
            "+data.corpora.b={toy_seed:4}",
        )
    )
    assert one.extra[0].folder == two.extra[0].folder and one.folder == two.folder
    after = {p: p.stat().st_ino for p in (tmp_path / "prepared").iterdir()}
    assert {p: after[p] for p in made} == made  # nothing rebuilt
    assert len(after) == len(made) + 1  # corpus b's folder only


def test_the_tokenizer_is_trained_on_every_corpus(tmp_path):
    alone = prepare_corpora(toy_data(tmp_path))
    both = prepare_corpora(toy_data(tmp_path, "+data.corpora.a={toy_seed:3,toy_sizes:[3000,1,1]}"))
    assert alone.folder != both.folder
    assert alone.tokenizers.src.sha256 != both.tokenizers.src.sha256


def write_pair(folder: Path, name: str, src: list[str], tgt: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.en").write_text("".join(line + "\n" for line in src), encoding="utf-8")
    (folder / f"{name}.de").write_text("".join(line + "\n" for line in tgt), encoding="utf-8")


@pytest.fixture
def files_data(tmp_path):
    main = tmp_path / "main"
    lines = [f"sentence number {i} here" for i in range(60)]
    write_pair(main, "train", lines, [line.upper() for line in lines])
    write_pair(main, "valid", lines[:5], lines[:5])

    def make(*overrides: str) -> DataConfig:
        return toy_data(
            tmp_path, "data.source=files", f"data.dir={main}", "data.name=main", *overrides
        )

    return make


@pytest.mark.parametrize(
    ("corpus", "problem"),
    [
        ("missing", "no such file"),
        ("uneven", "parallel files differ in length"),
        ("tagged", "the tag <BT> occurs in the text"),
    ],
)
def test_a_corpus_that_cannot_be_read_as_configured_is_refused_preparing_nothing(
    tmp_path, files_data, corpus, problem
):
    bad = tmp_path / corpus
    if corpus == "uneven":
        write_pair(bad, "train", ["a", "b"], ["a"])
    if corpus == "tagged":
        write_pair(bad, "train", ["a clean line", "a <BT> line"], ["x", "y"])
    cfg = files_data(f'+data.corpora.{corpus}={{dir:"{bad}",tag:"<BT>"}}')
    with pytest.raises(DataError) as refused:
        prepare_corpora(cfg)
    message = str(refused.value)
    assert problem in message and "\n" not in message
    if corpus == "tagged":
        assert f"{bad / 'train.en'}:2" in message and "data.corpora.tagged.tag" in message
    prepared = tmp_path / "prepared"
    assert not prepared.exists() or list(prepared.iterdir()) == []


def test_a_tag_that_an_already_prepared_corpus_holds_is_refused(tmp_path, files_data):
    """The folders record the strings of a tag's form: refused without reading the text again."""
    first = prepare_corpora(files_data('data.tag="<news>"'))  # a tokenizer with the tag
    pinned = f"data.spm_model={first.folder / 'spm.model'}"
    marked = tmp_path / "marked"
    write_pair(marked, "train", ["one <news> line"], ["eine Zeile"])
    prepare_corpora(files_data(pinned, f'+data.corpora.marked={{dir:"{marked}"}}'))
    with pytest.raises(DataError) as refused:
        prepare_corpora(
            files_data(pinned, 'data.tag="<news>"', f'+data.corpora.marked={{dir:"{marked}"}}')
        )
    assert f"{marked / 'train.en'}:1" in str(refused.value) and "'data.tag'" in str(refused.value)
    with pytest.raises(ConfigError, match="no piece of the given SentencePiece model"):
        prepare_corpora(files_data(pinned, 'data.tag="<other>"'))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("+data.corpora.b.weight=0", "data.corpora.b.weight"),
        ("+data.corpora.b.weight=-2", "data.corpora.b.weight"),
        ("+data.corpora.b.weight=nan", "data.corpora.b.weight"),
        ("+data.corpora.b.weight=heavy", "data.corpora.b.weight"),
        ('+data.corpora.b.tag=""', "data.corpora.b.tag"),
        ('+data.corpora.b.tag="<B T>"', "data.corpora.b.tag"),
        ("+data.corpora.b.wieght=1", "data.corpora.b.wieght"),
        ("+data.corpora.toy.weight=2", "data.corpora.toy"),  # the main corpus's name
        ("data.weight=0", "data.weight"),
    ],
)
def test_a_bad_weight_tag_or_name_is_refused_by_its_key(tmp_path, override, key):
    job = compose_job("train", ["data=toy", override])
    with pytest.raises(ConfigError) as refused:
        job.validate()
    assert f"config key '{key}'" in str(refused.value) and "\n" not in str(refused.value)


def test_corpora_into_several_languages_put_their_language_tag_first(tmp_path, files_data):
    cfg = files_data('+data.corpora.back={src_lang:de,tgt_lang:en,tag:"<BT>"}')
    assert cfg.target_languages == ["de", "en"]
    assert cfg.language_tags == {"de": "<2de>", "en": "<2en>"}
    data = prepare_corpora(cfg)
    processor = data.tokenizers.src.processor
    ids = {tag: processor.piece_to_id(tag) for tag in ("<2de>", "<2en>", "<BT>")}
    assert all(processor.is_control(i) for i in ids.values())
    mix = CorpusMix.of(data, cfg)
    prefixes = [p.stores[0].src_prefix for p in mix.parts]
    assert prefixes == [(ids["<2de>"],), (ids["<2en>"], ids["<BT>"])]
    # the reversed corpus reads the main files the other way round
    assert np.array_equal(data.extra[0].train.src[0], data.train.tgt[0])


def test_one_target_language_has_no_language_tag(tmp_path, files_data):
    cfg = files_data('+data.corpora.more={tag:"<BT>"}')
    assert cfg.language_tags == {} and cfg.tags == ["<BT>"]


def test_bad_corpora_on_the_command_line_are_one_line_and_exit_2(tmp_path, files_data):
    """Through tmt-train as a user runs it: two corpora of one name (a preset's duplicate key,
    an override given twice), a weight that is no number, a corpus whose files are missing;
    each one error line, exit 2, no run folder and nothing prepared."""
    preset = tmp_path / "twice.yaml"
    preset.write_text(
        "defaults:\n  - demo\n  - _self_\ndata:\n  corpora:\n"
        "    bt:\n      toy_seed: 2\n    bt:\n      toy_seed: 3\n",
        encoding="utf-8",
    )
    run = [f"run_dir={tmp_path / 'run'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    commands = [
        ["tmt-train", "--config-dir", str(tmp_path), "--config-name", "twice", *run],
        ["tmt-train", "--config-name", "demo", *run, "+data.corpora.bt.toy_seed=2"]
        + ["+data.corpora.bt.toy_seed=3"],
        ["tmt-train", "--config-name", "demo", *run, "+data.corpora.bt.weight=heavy"],
        ["tmt-train", "--config-name", "demo", *run, f"+data.corpora.bt.dir={tmp_path}/none"]
        + ["+data.corpora.bt.source=files"],
    ]
    said = [
        "twice.yaml:8: found duplicate key bt",
        "An item is already at 'data.corpora.bt.toy_seed'",
        "config key 'data.corpora.bt.weight'",
        f"{tmp_path}/none/train.en: no such file",
    ]
    for result, expected in zip(run_commands_together(commands), said, strict=True):
        said_wrong = [
            line
            for line in result.stderr.decode().splitlines()
            if "][ERROR]" in line or "Traceback" in line
        ]  # the info lines of a start come first where the data is read
        assert result.returncode == 2 and len(said_wrong) == 1, result.stderr.decode()
        assert expected in said_wrong[0], said_wrong
    assert not (tmp_path / "run").exists() and not (tmp_path / "prepared").exists()


def test_a_hugging_face_corpus_without_a_valid_split_is_read_whole(tmp_path, files_data):
    """data.carve_valid carves the main corpus's valid split alone: a corpus beside it gives all
    its pairs to training (before, 2,000 of them would have been carved out and never read)."""
    import datasets

    rows = {"en": [f"a saved line {i}" for i in range(30)], "de": [f"Zeile {i}" for i in range(30)]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(
        str(tmp_path / "saved")
    )
    cfg = files_data(
        f'+data.corpora.saved={{source:hf,hf_path:"{tmp_path / "saved"}",hf_config:null}}',
        "data.carve_valid=10",
    )
    assert len(prepare_corpora(cfg).extra[0].train) == 30
