"""Settings chosen on the valid split: tmt-eval's decode.length_penalty=auto and tmt-average's
last=auto pick the candidate with the best valid BLEU, record the choice, and refuse what they
cannot do in one line naming the key; numbers behave as before."""

from __future__ import annotations

import json

import pytest
import torch
from toy_runs import TINY_TRAIN

from transformer_mt.commands import valid_choice
from transformer_mt.commands.average import average
from transformer_mt.commands.evaluate import evaluate
from transformer_mt.commands.serve import serve
from transformer_mt.commands.train import train
from transformer_mt.commands.translate import translate
from transformer_mt.config import DecodeConfig, compose_job
from transformer_mt.errors import ConfigError

FAST_EVAL = ["decode.beam_size=2", "decode.max_len_a=0", "decode.max_len_b=8", "valid_sentences=8"]
"""An untrained model's translations run to the maximum length: kept short."""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny run with three step checkpoints (updates 2, 4, 6), trained once for the module."""
    root = tmp_path_factory.mktemp("valid_choice")
    overrides = [f"run_dir={root / 'run'}", f"data.prepared_dir={root / 'prepared'}"]
    quick = ["trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.valid_every=0"]
    quick += ["trainer.valid_bleu_sentences=0", "trainer.checkpoint_every_minutes=0"]
    return train(compose_job("train", [*TINY_TRAIN, *overrides, *quick])).parents[1]


def scores_in_call_order(monkeypatch, scores: list[float]) -> None:
    """valid_bleu gives the n-th candidate scored the n-th of `scores` (candidates are scored in
    grid order), so that which candidate is best is known in advance."""
    given = iter(scores)
    monkeypatch.setattr(valid_choice, "valid_bleu", lambda hypotheses, references: next(given))


@pytest.mark.slow
def test_length_penalty_auto_uses_and_records_the_alpha_best_on_valid(run_dir, monkeypatch):
    grid = list(valid_choice.LENGTH_PENALTY_GRID)
    scores = [10.0 + i for i in range(len(grid))]
    scores[2] = 99.0  # the third alpha wins
    scores_in_call_order(monkeypatch, scores)
    report = evaluate(
        compose_job("eval", [f"run_dir={run_dir}", "decode.length_penalty=auto", *FAST_EVAL])
    )
    recorded = json.loads((run_dir / "scores.test.json").read_text())
    assert recorded["length_penalty_auto"] == {
        "grid": grid,
        "valid_bleu": {str(alpha): score for alpha, score in zip(grid, scores, strict=True)},
        "chosen": grid[2],
        "valid_sentences": 8,
    }
    assert recorded["decode"]["length_penalty"] == grid[2] == report.decode["length_penalty"]
    assert f"length penalty {grid[2]} (auto" in report.format()
    auto_hypotheses = (run_dir / "hypotheses.test.txt").read_text()

    monkeypatch.undo()  # the chosen alpha, given as a number, decodes the same test translations
    evaluate(
        compose_job("eval", [f"run_dir={run_dir}", f"decode.length_penalty={grid[2]}", *FAST_EVAL])
    )
    assert (run_dir / "hypotheses.test.txt").read_text() == auto_hypotheses
    assert "length_penalty_auto" not in json.loads((run_dir / "scores.test.json").read_text())


@pytest.mark.slow
def test_length_penalty_auto_on_a_real_run_picks_the_best_valid_bleu(run_dir, caplog):
    caplog.set_level("INFO", logger="transformer_mt")
    job = compose_job("eval", [f"run_dir={run_dir}", "decode.length_penalty=auto", *FAST_EVAL])
    choice = evaluate(job).length_penalty_auto
    assert choice.chosen == max(choice.grid, key=lambda alpha: choice.valid_bleu[str(alpha)])
    grid = list(valid_choice.LENGTH_PENALTY_GRID)
    assert choice.grid[: len(grid)] == grid and len(choice.valid_bleu) == len(choice.grid)
    per_alpha = [
        r for r in caplog.records if "valid BLEU" in r.getMessage() and " of " in r.getMessage()
    ]
    assert len(per_alpha) == len(choice.grid)  # one line each


@pytest.mark.slow
def test_average_auto_writes_the_average_best_on_valid(run_dir, monkeypatch):
    scores_in_call_order(monkeypatch, [10.0, 30.0, 20.0])  # N = 1, 2, 3: two wins
    paths, output = average(compose_job("average", [f"run_dir={run_dir}", "last=auto", *FAST_EVAL]))
    assert [p.name for p in paths] == ["step_4.pt", "step_6.pt"]
    written = torch.load(output, weights_only=True)
    assert written["averaged_from"] == ["step_4.pt", "step_6.pt"]
    record = written["average_auto"]
    assert {key: record[key] for key in ("grid", "valid_bleu", "chosen", "valid_sentences")} == {
        "grid": [1, 2, 3],
        "valid_bleu": {"1": 10.0, "2": 30.0, "3": 20.0},
        "chosen": 2,
        "valid_sentences": 8,
    }
    assert record["decode"]["beam_size"] == 2


@pytest.mark.slow
def test_average_auto_when_the_newest_alone_wins_writes_its_weights(run_dir, monkeypatch):
    scores_in_call_order(monkeypatch, [40.0, 30.0, 20.0])
    _, output = average(compose_job("average", [f"run_dir={run_dir}", "last=auto", *FAST_EVAL]))
    written = torch.load(output, weights_only=True)
    newest = torch.load(run_dir / "checkpoints" / "step_6.pt", weights_only=True)
    assert written["averaged_from"] == ["step_6.pt"] and written["average_auto"]["chosen"] == 1
    for name, tensor in newest["model"].items():
        assert torch.equal(written["model"][name], tensor), name
    job = compose_job(
        "eval",
        [
            f"run_dir={run_dir}",
            "checkpoint=averaged.pt",
            "decode=greedy",
            "decode.max_len_a=0",
            "decode.max_len_b=8",
        ],
    )
    assert evaluate(job).checkpoint["step"] == 6  # loads like any checkpoint


@pytest.mark.slow
def test_average_auto_on_a_real_run_and_a_number_as_before(run_dir):
    _, output = average(compose_job("average", [f"run_dir={run_dir}", "last=auto", *FAST_EVAL]))
    record = torch.load(output, weights_only=True)["average_auto"]
    assert record["chosen"] == max(record["grid"], key=lambda n: record["valid_bleu"][str(n)])
    paths, output = average(compose_job("average", [f"run_dir={run_dir}", "last=2"]))
    written = torch.load(output, weights_only=True)
    assert written["averaged_from"] == ["step_4.pt", "step_6.pt"]
    assert "average_auto" not in written


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["decode.length_penalty=abc"], "must be a number"),
        (["decode.length_penalty=true"], "must be a number"),
        (["decode.length_penalty=auto", "decode=greedy"], "does not use"),
        (["decode.length_penalty=auto", "valid_sentences=0"], "config key 'valid_sentences'"),
    ],
)
def test_eval_refuses_a_bad_length_penalty_in_one_line_naming_the_key(run_dir, overrides, said):
    with pytest.raises(ConfigError, match=said) as refused:
        evaluate(compose_job("eval", [f"run_dir={run_dir}", *overrides]))
    message = str(refused.value)
    assert "\n" not in message
    key = "valid_sentences" if "valid_sentences" in said else "decode.length_penalty"
    assert f"config key '{key}'" in message


@pytest.mark.slow
def test_eval_refuses_to_score_the_valid_split_with_an_alpha_chosen_on_it(run_dir):
    before = sorted(path.name for path in run_dir.iterdir())
    job = compose_job("eval", [f"run_dir={run_dir}", "split=valid", "decode.length_penalty=auto"])
    with pytest.raises(ConfigError) as refused:
        evaluate(job)
    message = str(refused.value)
    assert "\n" not in message
    assert "config key 'decode.length_penalty'" in message and "split=valid" in message
    assert sorted(path.name for path in run_dir.iterdir()) == before  # no scores written


def test_commands_without_a_valid_split_refuse_auto_naming_the_key(tmp_path, tiny_train_job):
    auto = ["decode.length_penalty=auto"]
    for command, name in ((translate, "translate"), (serve, "serve")):
        job = compose_job(name, [f"run_dir={tmp_path}", *auto])  # refused before any loading
        with pytest.raises(ConfigError, match="config key 'decode.length_penalty'") as refused:
            command(job)
        assert "\n" not in str(refused.value) and "tmt-eval only" in str(refused.value)
    with pytest.raises(ConfigError, match="config key 'decode.length_penalty'"):
        tiny_train_job(*auto).validate()


def test_a_numeric_length_penalty_composes_to_a_float_as_before():
    job = compose_job("eval", ["run_dir=x", "decode.length_penalty=1"])
    assert job.decode.length_penalty == 1.0 and isinstance(job.decode.length_penalty, float)
    assert compose_job("eval", ["run_dir=x"]).decode.length_penalty == 0.6
    assert DecodeConfig(length_penalty=2).length_penalty == 2.0


def test_length_penalty_auto_tries_beyond_the_grid_while_its_largest_alpha_wins(monkeypatch):
    grid, beyond = list(valid_choice.LENGTH_PENALTY_GRID), valid_choice.LENGTH_PENALTY_BEYOND
    # valid BLEU rises with alpha up to the second alpha beyond the grid, then falls
    scores = [float(i) for i in range(len(grid) + 2)] + [0.5]
    scores_in_call_order(monkeypatch, scores)
    tried = []
    choice = valid_choice.choose_on_valid(
        "decode.length_penalty",
        grid,
        lambda alpha: tried.append(alpha) or ["a hypothesis"],
        ["a reference"],
        beyond,
    )
    assert tried == choice.grid == [*grid, *beyond[:3]]
    assert choice.chosen == beyond[1]
    assert choice.valid_bleu[str(beyond[2])] == 0.5


def test_length_penalty_auto_stops_at_the_grid_when_an_inner_alpha_wins_or_ties(monkeypatch):
    grid, beyond = list(valid_choice.LENGTH_PENALTY_GRID), valid_choice.LENGTH_PENALTY_BEYOND
    for scores, chosen in (([5.0] * len(grid), grid[0]), ([*range(len(grid) - 1), 0.0], grid[-2])):
        scores_in_call_order(monkeypatch, [float(s) for s in scores])
        choice = valid_choice.choose_on_valid(
            "decode.length_penalty", grid, lambda alpha: ["a hypothesis"], ["a ref"], beyond
        )
        assert choice.grid == grid and choice.chosen == chosen


def test_length_penalty_auto_ends_after_the_last_alpha_beyond(monkeypatch):
    grid, beyond = list(valid_choice.LENGTH_PENALTY_GRID), valid_choice.LENGTH_PENALTY_BEYOND
    scores_in_call_order(monkeypatch, [float(i) for i in range(len(grid) + len(beyond))])
    choice = valid_choice.choose_on_valid(
        "decode.length_penalty", grid, lambda alpha: ["a hypothesis"], ["a ref"], beyond
    )
    assert choice.grid == [*grid, *beyond] and choice.chosen == beyond[-1]


def test_a_grid_with_a_repeated_candidate_tries_each_place_once(monkeypatch):
    scores_in_call_order(monkeypatch, [1.0, 2.0, 3.0])
    tried = []
    choice = valid_choice.choose_on_valid(
        "last", [1, 1, 2], lambda n: tried.append(n) or [str(n)], ["a ref"]
    )
    assert tried == [1, 1, 2] and choice.chosen == 2
