"""Ensembles: the mean of the members' probabilities at every step, each member with its own KV
cache; one model is the ensemble of one; checkpoints of another vocabulary are refused."""

import copy
import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from transformer_mt.checkpoint import save_checkpoint
from transformer_mt.commands.evaluate import evaluate
from transformer_mt.config import DecodeConfig, Strategy, compose_job
from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.sampling import sample_search
from transformer_mt.decode.search import Ensemble, beam_search, combined_log_probs, greedy_search
from transformer_mt.decode.translator import ModelSearch
from transformer_mt.errors import CheckpointError, ConfigError

VOCAB = 400
IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID, "max_len_a": 1.0, "max_len_b": 6}


def sources(count: int = 12, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    lines = [rng.integers(4, VOCAB, size=rng.integers(1, 15)) for _ in range(count)]
    return pad_sequences(lines, PAD_ID, suffix=EOS_ID)


def tokens(nbest) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in nbest]


def scores(nbest) -> list[float]:
    return [h.score for hyps in nbest for h in hyps]


def test_one_member_is_the_model_bitwise(random_model):
    model = random_model(VOCAB, 0, eos_bonus=4.0)
    src = sources()
    assert greedy_search(Ensemble([model]), src, **IDS) == greedy_search(model, src, **IDS)
    one = beam_search(Ensemble([model]), src, beam_size=3, **IDS)
    assert one == beam_search(model, src, beam_size=3, **IDS)  # tokens and scores


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_model_with_itself_gives_the_models_outputs(random_model, beam_size):
    """Two copies, each with its own KV cache: the same tokens (every n-best entry); scores equal
    to float32 rounding (log of the mean of two equal probabilities: lp + log 2 - log 2)."""
    model = random_model(VOCAB, 1, eos_bonus=4.0)
    twins = Ensemble([model, copy.deepcopy(model)])
    src = sources(seed=1)
    if beam_size == 1:
        alone = [[h] for h in greedy_search(model, src, **IDS)]
        together = [[h] for h in greedy_search(twins, src, **IDS)]
    else:
        alone = beam_search(model, src, beam_size=beam_size, **IDS)
        together = beam_search(twins, src, beam_size=beam_size, **IDS)
    assert tokens(together) == tokens(alone)
    assert len({len(t) for hyps in tokens(alone) for t in hyps}) > 3  # outputs of many lengths
    assert np.allclose(scores(together), scores(alone), rtol=1e-5, atol=1e-5)


def test_the_ensemble_distribution_is_the_mean_of_the_members_probabilities():
    torch.manual_seed(0)
    a, b = torch.randn(3, 7) * 3, torch.randn(3, 7) * 3
    expected = ((a.softmax(-1) + b.softmax(-1)) / 2).log()
    assert torch.allclose(combined_log_probs([a, b]), expected, atol=1e-6)
    assert torch.allclose(combined_log_probs([a]), a.softmax(-1).log(), atol=1e-6)


def test_two_different_models_sample_and_average_their_attention(random_model):
    first, second = random_model(VOCAB, 2), random_model(VOCAB, 3)
    pair = Ensemble([first, second])
    src = sources(seed=2)
    draws = sample_search(pair, src, generator=torch.Generator().manual_seed(0), **IDS)
    again = sample_search(pair, src, generator=torch.Generator().manual_seed(0), **IDS)
    assert draws == again and len(draws) == src.shape[0]
    assert tokens([[h] for h in greedy_search(pair, src, **IDS)]) != tokens(
        [[h] for h in greedy_search(first, src, **IDS)]
    )
    search = ModelSearch(pair, torch.device("cpu"))
    source, target = [[5, 6, 7]], [[8, 9]]
    mean = (
        np.asarray(ModelSearch(first, torch.device("cpu")).cross_attention(source, target, -1))
        + np.asarray(ModelSearch(second, torch.device("cpu")).cross_attention(source, target, -1))
    ) / 2
    assert np.allclose(search.cross_attention(source, target, -1), mean, atol=1e-6)


def test_members_of_different_vocabulary_sizes_are_refused(random_model):
    with pytest.raises(ValueError, match="vocabulary size"):
        Ensemble([random_model(VOCAB, 0), random_model(VOCAB + 8, 0)])


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """Two SentencePiece models of the same size trained on different toy sentences."""
    made = []
    for seed in (3, 4):
        sentences = [s for pair in toy_pairs(500, seed=seed) for s in pair]
        path = tmp_path_factory.mktemp(f"spm{seed}") / "spm.model"
        train_tokenizer(sentences, path, vocab_size=VOCAB)
        made.append(path)
    return made


def make_run(folder, tokenizer, random_model, seeds) -> None:
    """A run folder as tmt-train leaves it, with random models' checkpoints step_<seed>.pt."""
    (folder / "checkpoints").mkdir(parents=True)
    shutil.copy(tokenizer, folder / "spm.model")
    # The toy corpus, small: eval translates its test split (20 sentences).
    data = {"unicode_form": "NFC", "toy_sizes": [10, 10, 20]}
    OmegaConf.save({"data": data}, folder / "config.yaml")
    for seed in seeds:
        model = random_model(VOCAB, seed, sharpen=1.0)
        state = {
            "model": model.state_dict(),
            "model_config": dataclasses.asdict(model.cfg),
            "vocab_size": VOCAB,
            "step": seed,
        }
        save_checkpoint(state, folder / "checkpoints" / f"step_{seed}.pt")


def test_eval_with_two_checkpoints_of_two_runs(tmp_path, tokenizer_files, random_model):
    run, other = tmp_path / "run", tmp_path / "other"
    make_run(run, tokenizer_files[0], random_model, [1])
    make_run(other, tokenizer_files[0], random_model, [2])
    second = str(other / "checkpoints" / "step_2.pt")
    job = compose_job(
        "eval",
        [f"run_dir={run}", f"checkpoint=[step_1.pt,{second}]", "device=cpu", "decode=greedy"],
    )
    evaluate(job)
    scores = json.loads((run / "scores.test.json").read_text())
    assert scores["checkpoint"]["step"] == [1, 2]
    assert scores["checkpoint"]["checkpoint"] == [str(run / "checkpoints" / "step_1.pt"), second]
    hypotheses = (run / "hypotheses.test.txt").read_text().splitlines()
    assert len(hypotheses) == scores["sentences"] > 0
    # Translated by the ensemble of both, not by one of them.
    pair = load_translator(run, ["step_1.pt", second], decode=job.decode, device="cpu")
    assert len(pair.backend.ensemble.models) == 2
    assert len(load_translator(run, "step_1.pt", device="cpu").backend.ensemble.models) == 1


def test_a_checkpoint_of_another_vocabulary_is_refused_naming_both_files(
    tmp_path, tokenizer_files, random_model
):
    run, other = tmp_path / "run", tmp_path / "other"
    make_run(run, tokenizer_files[0], random_model, [1])
    make_run(other, tokenizer_files[1], random_model, [2])
    member = other / "checkpoints" / "step_2.pt"
    with pytest.raises(CheckpointError) as refused:
        load_translator(run, ["step_1.pt", str(member)], device="cpu")
    message = str(refused.value)
    assert "\n" not in message
    assert (
        f"{member} was trained with {other / 'spm.model'}, another SentencePiece model than "
        f"{run / 'spm.model'}" in message
    )


def test_an_export_or_an_empty_list_cannot_be_an_ensemble(tmp_path, tokenizer_files, random_model):
    run = tmp_path / "run"
    make_run(run, tokenizer_files[0], random_model, [1])
    (run / "checkpoints" / "ctranslate2").mkdir()
    with pytest.raises(ConfigError, match="an ensemble takes checkpoints only"):
        load_translator(run, ["step_1.pt", "ctranslate2"], device="cpu")
    with pytest.raises(ConfigError, match="config key 'checkpoint'"):
        load_translator(run, [], device="cpu")


def test_the_server_names_every_member():
    model_record = pytest.importorskip("transformer_mt.serve.app").model_record
    record = model_record({"checkpoint": ["/x/a/step_1.pt", "/y/last.pt"], "step": [1, 9]})
    assert record == {"checkpoint": ["step_1.pt", "last.pt"], "step": [1, 9]}


def test_sampling_through_the_translator_with_an_ensemble(tmp_path, tokenizer_files, random_model):
    run = tmp_path / "run"
    make_run(run, tokenizer_files[0], random_model, [1, 2])
    decode = DecodeConfig(strategy=Strategy.sample, max_len_b=5)
    pair = load_translator(run, ["step_1.pt", "step_2.pt"], decode=decode, device="cpu")
    assert len(pair.translate(["the dog sees the cat.", ""])) == 2


def one_update_run_of_seed(folder, toy_seed: int):
    """A run folder trained for one update by tmt-train on the toy corpus drawn with `toy_seed`
    (another seed: another tokenizer of the same size)."""
    from transformer_mt.commands.train import train

    overrides = [
        "data=toy",
        "data.toy_sizes=[300,20,20]",
        f"data.toy_seed={toy_seed}",
        "data.vocab_size=400",
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.batch_tokens=1000",
        "trainer.valid_bleu_sentences=0",
        "trainer.progress_bar=false",
        "trainer.loader_workers=0",
        f"run_dir={folder / 'run'}",
        f"data.prepared_dir={folder / 'prepared'}",
    ]
    return train(compose_job("train", overrides)).parents[1]


def test_a_checkpoint_of_another_tokenizer_of_the_same_size_is_refused_naming_both_files(
    tmp_path, one_update_run
):
    """A checkpoint copied out of another run translates garbage with this run's tokenizer,
    though the sizes agree: the tokenizer's sha256 recorded by tmt-train tells them apart, alone
    and as a member of an ensemble. A checkpoint written before the hash was recorded loads as
    it did (sizes compared)."""
    from transformer_mt.data.tokenizer import load_tokenizers, vocabulary

    run, other = one_update_run, one_update_run_of_seed(tmp_path / "b", 2)  # toy seeds 1 and 2
    ours, theirs = load_tokenizers(run).src, load_tokenizers(other).src
    assert ours.vocab_size == theirs.vocab_size and vocabulary(ours) != vocabulary(theirs)
    state = torch.load(other / "checkpoints" / "last.pt", weights_only=True)
    copied = tmp_path / "copied.pt"  # outside any run folder
    save_checkpoint(state, copied)
    for checkpoint in (str(copied), ["last.pt", str(copied)]):
        with pytest.raises(CheckpointError) as refused:
            load_translator(run, checkpoint, device="cpu")
        message = str(refused.value)
        assert "\n" not in message
        assert (
            f"{copied} was trained with another SentencePiece model than {run / 'spm.model'}"
            in message
        )
    assert state["tokenizer_sha256"] == [theirs.sha256]
    del state["tokenizer_sha256"]  # as checkpoints were written before
    save_checkpoint(state, copied)
    assert load_translator(run, str(copied), device="cpu").origin["step"] == 1


def test_average_refuses_checkpoints_of_another_tokenizer_before_writing(
    tmp_path, tokenizer_files, random_model
):
    """Checkpoints copied in from a run with another tokenizer of the same size: eval refuses
    their average, so tmt-average refuses to write it (it wrote averaged.pt, exit 0)."""
    from transformer_mt.commands.average import average
    from transformer_mt.config import AverageJob
    from transformer_mt.data.tokenizer import load_tokenizers

    run = tmp_path / "run"
    make_run(run, tokenizer_files[0], random_model, [1, 2])
    theirs = load_tokenizers(tokenizer_files[1].parent).src.sha256
    for step in (1, 2):
        path = run / "checkpoints" / f"step_{step}.pt"
        save_checkpoint({**torch.load(path, weights_only=True), "tokenizer_sha256": [theirs]}, path)
    with pytest.raises(CheckpointError, match="another SentencePiece model than"):
        average(AverageJob(run_dir=str(run), last=2, decode=DecodeConfig()))
    assert not (run / "checkpoints" / "averaged.pt").exists()
