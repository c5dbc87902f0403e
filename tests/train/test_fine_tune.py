"""Fine-tuning (trainer.init_from): a parent's weights on new data, with the parent's tokenizer,
a fresh optimizer and schedule; and data.spm_model, an existing tokenizer for any run."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from toy_runs import LEARNING, split_bleu, trainer_for, write_toy_files

from transformer_mt.checkpoint import model_from_checkpoint
from transformer_mt.commands.train import train
from transformer_mt.config import DecodeConfig, Strategy
from transformer_mt.data.prepare import open_prepared, prepared_folder
from transformer_mt.data.tokenizer import PAD_ID, train_tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import CheckpointError, ConfigError
from transformer_mt.run_dir import RunDir
from transformer_mt.train.loss import label_smoothed_loss

QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0"]
GREEDY = DecodeConfig(strategy=Strategy.greedy, beam_size=1)


def first_logged_loss(run_dir) -> float:
    events = EventAccumulator(str(RunDir(run_dir).tensorboard))
    events.Reload()
    first = events.Scalars("train/loss")[0]
    assert first.step == 1
    return first.value


@pytest.mark.slow
def test_fine_tuning_starts_from_the_parent_and_beats_it_and_a_model_from_scratch(
    tiny_train_job, tmp_path, learned_run
):
    # The parent: the session's learned toy run (short sentences of 3 to 8 words, 400 updates).
    # The new corpus: other sentences (another seed), other sizes, longer sentences.
    new_data = write_toy_files(tmp_path / "new", seed=2, sizes=(2000, 40, 60), words=(5, 11))
    parent_run = learned_run
    parent_last = parent_run / "checkpoints" / "last.pt"
    updates = 150
    child_run, scratch_run = tmp_path / "child", tmp_path / "scratch"
    new = [f"trainer.max_steps={updates}", f"data.dir={new_data}", *LEARNING, *QUICK]
    # No dropout in the child, so that its first loss is a deterministic function of the weights.
    child_job = tiny_train_job(
        *new,
        f"trainer.init_from={parent_run}",
        f"run_dir={child_run}",
        "model.dropout=0",
        "trainer.log_every=1",
    )
    child_last = train(child_job)

    history = RunDir(child_run).history()
    assert history[0]["kind"] == "fine-tune" and history[0]["step"] == 0
    assert history[0]["parent"] == str(parent_run / "checkpoints" / "last.pt")
    child_state = torch.load(child_last, weights_only=True)
    assert child_state["step"] == updates
    assert child_state["scheduler"]["last_epoch"] == updates  # a fresh schedule
    # The parent's tokenizer encodes the new data.
    assert (child_run / "spm.model").read_bytes() == (parent_run / "spm.model").read_bytes()

    # Its first logged loss is the parent model's loss on the first update's batch of new data.
    data = open_prepared(prepared_folder(child_job.data))
    probe_job = dataclasses.replace(child_job, run_dir=str(tmp_path / "probe"))
    probe = trainer_for(probe_job, data)
    probe.metrics.close()
    probe_updates = probe.batches.updates()
    batches, _ = next(probe_updates)  # the first update's micro-batches, all ranks' tokens
    probe_updates.close()
    parent_state = torch.load(parent_last, weights_only=True)
    parent = model_from_checkpoint(parent_state, parent_last, RunDir(parent_run).tokenizers())
    parent.eval()
    smoothing = child_job.optim.label_smoothing
    with torch.no_grad():
        total = sum(
            label_smoothed_loss(
                parent(b.src, b.tgt_in), b.tgt_out, epsilon=smoothing, pad_id=PAD_ID
            ).loss
            for b in batches
        )
    tokens = sum(b.n_tgt_tokens for b in batches)
    assert first_logged_loss(child_run) == pytest.approx(float(total) / tokens, abs=1e-5)

    train(tiny_train_job(*new, f"run_dir={scratch_run}"))
    parent_translator = Translator.for_model(
        parent, RunDir(parent_run).tokenizers(), GREEDY, torch.device("cpu")
    )
    bleu = {
        "parent": split_bleu(parent_translator, child_run)[0],
        "fine-tuned": split_bleu(load_translator(child_run, decode=GREEDY), child_run)[0],
        "scratch": split_bleu(load_translator(scratch_run, decode=GREEDY), scratch_run)[0],
    }
    print(f"BLEU on the new data's test split after {updates} updates: {bleu}")
    assert bleu["fine-tuned"] > bleu["parent"] and bleu["fine-tuned"] > bleu["scratch"], bleu


def test_data_spm_model_encodes_with_a_given_tokenizer(tiny_train_job, tmp_path):
    sentences = [s for pair in toy_pairs(400, seed=3) for s in pair]
    given = train_tokenizer(sentences, tmp_path / "given.model", vocab_size=500)
    run_dir = train(
        tiny_train_job("trainer.max_steps=1", f"data.spm_model={tmp_path / 'given.model'}", *QUICK)
    ).parents[1]
    assert (run_dir / "spm.model").read_bytes() == (tmp_path / "given.model").read_bytes()
    assert RunDir(run_dir).tokenizers().tgt.vocab_size == given.vocab_size == 500


def test_a_tokenizer_that_does_not_fit_the_parent_is_refused_with_both_sizes(
    tiny_train_job, tmp_path, learned_run
):
    parent_run = learned_run  # a tokenizer of 400 pieces
    sentences = [s for pair in toy_pairs(400, seed=3) for s in pair]
    train_tokenizer(sentences, tmp_path / "other.model", vocab_size=500)
    child = tiny_train_job(
        "trainer.max_steps=1",
        f"trainer.init_from={parent_run}",
        f"data.spm_model={tmp_path / 'other.model'}",
        f"run_dir={tmp_path / 'child'}",
        *QUICK,
    )
    with pytest.raises(CheckpointError, match=r"embedding has 400 target pieces.* has 500"):
        train(child)
    with pytest.raises(ConfigError, match=r"trainer.init_from=.*nowhere: no such run folder"):
        train(tiny_train_job(f"trainer.init_from={tmp_path / 'nowhere'}", *QUICK))
