"""tmt-score: a line of scores per pair of the source and target files; bad input refused with
nothing written."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from console_commands import run_command

from transformer_mt.commands.score import score
from transformer_mt.config import compose_job
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.scoring import score_pairs
from transformer_mt.errors import ConfigError, DataError

SHORT = ["decode.max_len_a=0", "decode.max_len_b=6", "device=cpu"]


def lines(folder: Path, name: str, texts: list[str]) -> Path:
    path = folder / name
    path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return path


def job(run: Path, source: Path, target: Path, *extra: str):
    overrides = [f"run_dir={run}", f"source={source}", f"target={target}"]
    return compose_job("score", [*overrides, *SHORT, *extra])


def test_each_pair_gets_its_scores_and_a_search_s_output_its_own_score(one_update_run, tmp_path):
    """The four fields of each line, the library's scores; the beam's best translation scores
    what the search gave it where its text encodes back to the pieces the search chose; an empty
    source is -inf."""
    decode = job(one_update_run, "s", "t").decode
    translator = load_translator(one_update_run, decode=decode, device="cpu")
    sources = [f"the dog sees {i} cats ." for i in range(9)]
    best = [nbest[0] for nbest in translator.translate_nbest(sources)]
    source = lines(tmp_path, "src.de", [*sources, ""])
    target = lines(tmp_path, "hyp.en", [*(entry.text for entry in best), "a cat"])
    output = tmp_path / "scores.tsv"
    score(job(one_update_run, source, target, f"output={output}"))
    rows = [line.split("\t") for line in output.read_text().splitlines()]
    assert len(rows) == 10 and all(len(row) == 4 for row in rows)
    assert rows[-1] == ["-inf", "-inf", "-inf", "0"]
    encoded = translator.encode_targets([entry.text for entry in best])
    library = score_pairs(translator, sources, [entry.text for entry in best])
    searched = translator.nbest_ids(translator.encode(sources))
    for row, ids, pair, hyps in zip(rows, encoded, library, searched, strict=False):
        normalised, log_prob, per_piece, pieces = (float(value) for value in row)
        assert pieces == len(ids) + 1 == pair.pieces and log_prob < 0
        assert math.isclose(log_prob, pair.log_prob, abs_tol=2e-6)  # 6 decimals written
        assert math.isclose(normalised, pair.normalised, abs_tol=2e-6)
        assert math.isclose(per_piece * pieces, log_prob, rel_tol=1e-5)
        if ids == hyps[0].tokens:  # the text spelled as the search spelled it
            assert math.isclose(normalised, hyps[0].score, rel_tol=1e-4, abs_tol=1e-4)


def test_files_of_other_line_counts_are_refused_before_anything_is_written(
    one_update_run, tmp_path
):
    source = lines(tmp_path, "src.de", ["a", "b", "c"])
    target = lines(tmp_path, "hyp.en", ["a", "b"])
    output = tmp_path / "scores.tsv"
    with pytest.raises(DataError, match=r"has 3 lines and target=.* 2"):
        score(job(one_update_run, source, target, f"output={output}"))
    with pytest.raises(ConfigError, match="config key 'target'"):
        score(job(one_update_run, source, tmp_path / "missing.en", f"output={output}"))
    with pytest.raises(ConfigError, match="config key 'output'.*same file as source"):
        score(job(one_update_run, source, target, f"output={source}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.en", "run", "src.de"]


def test_the_command_writes_scores_to_stdout_and_bad_input_exits_2(one_update_run, tmp_path):
    source = lines(tmp_path, "src.de", ["the dog sees 2 cats .", "the cat ."])
    target = lines(tmp_path, "hyp.en", ["a dog", "a cat"])
    common = [f"run_dir={one_update_run}", f"source={source}", *SHORT]
    done = run_command("tmt-score", *common, f"target={target}")
    assert done.returncode == 0, done.stderr.decode()
    assert len(done.stdout.decode().splitlines()) == 2
    short = lines(tmp_path, "short.en", ["a dog"])
    refused = run_command("tmt-score", *common, f"target={short}")
    assert refused.returncode == 2 and refused.stdout == b""
    assert "has 2 lines and target=" in refused.stderr.decode()
