"""Hydra's own ecosystem on our commands: Optuna's sweeper optimising valid BLEU (the sweep
preset), folders per job through Hydra's runtime (${hydra:job.num}, ${hydra:job.override_dirname}),
and outputs that jobs would share refused. Slurm and submitit: tests/train/test_distributed.py,
tests/train/test_launchers.py."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from toy_runs import TINY_TRAIN, write_toy_files

from transformer_mt.config import CONFIG_DIR, compose_job
from transformer_mt.run_dir import RunDir
from transformer_mt.sweeps import swept_keys, varies_per_job

BIN = Path(sys.executable).parent


def tmt(command: str, *args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / command), *args], cwd=cwd, input=stdin, capture_output=True, text=True
    )


def start_tmt(command: str, *args: str, cwd: Path) -> subprocess.Popen:
    """tmt-COMMAND started, on one thread (conftest.py's OMP_NUM_THREADS: it runs beside another
    command on two cores)."""
    return subprocess.Popen(
        [str(BIN / command), *args], cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_the_sweep_preset_searches_real_keys_and_presets():
    preset = yaml.safe_load((CONFIG_DIR / "sweep" / "new_pair.yaml").read_text())
    params = preset["hydra"]["sweeper"]["params"]
    assert preset["hydra"]["sweeper"]["direction"] == "maximize"
    job, parser = compose_job("train", []), OverridesParser.create()
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        assert override.is_sweep_override(), key
        if key == "model":
            assert set(override.sweep_string_iterator()) <= {
                path.stem for path in (CONFIG_DIR / "model").glob("*.yaml")
            }
        else:
            functools.reduce(getattr, key.split("."), job)  # AttributeError: no such key


@pytest.mark.slow
def test_an_optuna_sweep_of_two_trials_reports_the_best_trials_valid_bleu(tmp_path):
    """Two trials of Hydra's Optuna sweeper (the sweep preset, the learning rate its one free
    setting), each in run_dir='trials/${hydra:job.num}': a folder per job. The sweeper reports
    the best trial's valid BLEU, which is the best score recorded in that trial's folder
    (best.pt's, and its log's)."""
    data = write_toy_files(tmp_path / "data", sizes=(4000, 16, 16), seed=1, words=(3, 6))
    fixed = [  # toy_runs.LEARNING, for 80 updates, validated once at the end
        *(o for o in TINY_TRAIN if o.split("=")[0] not in ("data", "optim.lr_scale")),
        "data=files",
        f"data.dir={data}",
        "data.src_lang=en",
        "data.tgt_lang=de",
        "optim.warmup_steps=40",
        "optim.clip_norm=1.0",
        "model.dropout=0.1",
        "optim.label_smoothing=0.1",
        "trainer.batch_tokens=3000",
        "trainer.global_batch_tokens=2400",
        "trainer.max_steps=80",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=16",
        "trainer.num_threads=1",  # steady on shared cores (two threads wait on each other)
        "trainer.checkpoint_every=0",
        "decode.max_len_b=5",  # validation's greedy search: short toy sentences
        f"data.prepared_dir={tmp_path / 'prepared'}",
    ]
    command = [
        "-m",
        "+sweep=new_pair",
        *fixed,
        "hydra.sweeper.n_trials=2",
        "optim.lr_scale=choice(0.2,0.35,0.5)",
        "run_dir=trials/${hydra:job.num}",
    ]
    done = tmt("tmt-train", *command, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = yaml.safe_load((tmp_path / "trials" / "optimization_results.yaml").read_text())
    folders = sorted(p for p in (tmp_path / "trials").iterdir() if p.is_dir())
    assert [p.name for p in folders] == ["0", "1"]
    scores = {}
    for folder in folders:
        start, end = RunDir(folder).history()
        scale = next(o for o in start["overrides"] if o.startswith("optim.lr_scale="))
        scores[scale.split("=")[1]] = end["best"]["score"]
        assert end["best"]["metric"] == "valid BLEU"
    best_scale = str(results["best_params"]["optim.lr_scale"])
    assert results["best_value"] == scores[best_scale] == max(scores.values()) > 0
    best_folder = next(
        f for f in folders if f"optim.lr_scale={best_scale}" in RunDir(f).history()[0]["overrides"]
    )
    best = torch.load(best_folder / "checkpoints" / "best.pt", weights_only=True)
    assert best["progress"]["best_score"] == results["best_value"]
    assert f"BLEU {results['best_value']:.2f}" in (best_folder / "train.log").read_text()
    assert f"Best value: {results['best_value']}" in done.stderr


# A short command line: ${hydra:job.override_dirname} names a folder after it.
SMALL = [
    "data=toy",
    "data.toy_sizes=[400,20,20]",
    "data.vocab_size=400",
    "model=tiny",
    "trainer.batch_tokens=1024",
    "trainer.global_batch_tokens=900",
    "trainer.num_threads=1",
    "trainer.valid_every=0",
    "trainer.valid_bleu_sentences=0",
]


@pytest.mark.slow
def test_hydra_runtime_in_paths_names_a_folder_or_file_per_job_and_a_rerun_resumes(tmp_path):
    """Issue 59, finding 13: run_dir='runs/${hydra:job.override_dirname}'
    crashed with and without -m, and every job of `tmt-translate -m ... output=o.txt` wrote the
    same file. Now: one folder without -m, one per job with -m (a sweep stopped by a signal is
    resumed by the same command), and an output every job would share refused before anything
    is written."""
    prepared = f"data.prepared_dir={tmp_path / 'prepared'}"
    one = ["trainer.max_steps=1", "run_dir=one/${hydra:job.override_dirname}"]
    done = tmt("tmt-train", *SMALL, prepared, *one, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (single,) = (tmp_path / "one").iterdir()  # the overrides, the folders' own left out
    assert single.name.startswith("data.toy_sizes=[400,20,20],data.vocab_size=400,data=toy,")
    assert "run_dir" not in single.name and "prepared_dir" not in single.name
    assert RunDir(single).history()[-1]["how"] == "finished"

    # tmt-translate -m from that folder, beside the sweep below: an output every job would write
    # refused, and one per job.
    (tmp_path / "in.txt").write_text("a b c\nd e\n")
    translate = [
        "-m",
        f"run_dir='{single}'",
        "decode=greedy",
        "decode.beam_size=1,2",
        "input=in.txt",
    ]
    refused = start_tmt("tmt-translate", *translate, "output=o.txt", cwd=tmp_path)
    translated = start_tmt(
        "tmt-translate", *translate, "output=o.${decode.beam_size}.txt", cwd=tmp_path
    )

    # A sweep of two jobs, stopped by SIGTERM in job 0's training: the checkpoint is written,
    # the sweep ends there with exit 0; the same command again resumes job 0, then runs job 1.
    sweep = ["-m", *SMALL, prepared, "trainer.max_steps=6", "trainer.log_every=1"]
    sweep += ["trainer.seed=1,2", "run_dir=many/${hydra:job.override_dirname}"]
    stopped = subprocess.Popen(
        [str(BIN / "tmt-train"), *sweep], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    for line in stopped.stderr:
        if " - update 1 epoch" in line:  # inside the loop: the stop signals are installed
            stopped.send_signal(signal.SIGTERM)
            break
    said = stopped.stderr.read()
    assert stopped.wait(timeout=120) == 0, said[-3000:]
    assert "the sweep ends at job 0" in said
    (folder0,) = (p for p in (tmp_path / "many").iterdir() if p.is_dir())  # job 1 never began
    assert RunDir(folder0).history()[-1]["how"] == "stop signal"
    done = tmt("tmt-train", *sweep, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    folders = sorted(p for p in (tmp_path / "many").iterdir() if p.is_dir())
    assert folders[0] == folder0
    assert [f"trainer.seed={seed}," in f.name for seed, f in enumerate(folders, 1)] == [True] * 2
    histories = [
        [(r["event"], r.get("kind") or r["how"]) for r in RunDir(f).history()] for f in folders
    ]
    assert histories == [
        [("start", "new"), ("end", "stop signal"), ("start", "resume"), ("end", "finished")],
        [("start", "new"), ("end", "finished")],
    ]

    refused, done = finished(refused), finished(translated)
    lines = [line for line in refused.stderr.splitlines() if "][ERROR]" in line]  # not Hydra's
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr  # launcher's INFO lines
    assert "Traceback" not in refused.stderr
    assert "config key 'output': under -m every job would write o.txt" in lines[0]
    assert not (tmp_path / "o.txt").exists()
    assert done.returncode == 0, done.stderr[-3000:]
    for beam in (1, 2):
        assert len((tmp_path / f"o.{beam}.txt").read_text().splitlines()) == 2


def test_an_output_names_a_file_per_job_only_through_what_the_sweep_varies():
    """Issue 66: `output=${run_dir}/o.txt` passed the check as an interpolation, although
    run_dir is the same for every job. Now a value names a file per job where it reaches,
    through its interpolations, Hydra's runtime for the job or a key the sweep varies."""
    cfg = OmegaConf.create(
        {
            "run_dir": "runs/x",
            "per_beam": "runs/${decode.beam_size}",
            "decode": {"beam_size": 4},
            "output": None,
        }
    )
    swept = swept_keys(["run_dir=runs/x", "decode.beam_size=1,4", "output=o.txt"])
    assert swept == {"decode.beam_size"}
    assert swept_keys(["a=1"], {"b": "choice(1,2)", "c": "3"}) == {"b"}  # a sweeper's params
    cases = {
        "o.txt": False,
        "${run_dir}/o.txt": False,
        "${oc.env:HOME}/o.txt": False,
        "o.${decode.beam_size}.txt": True,
        "${per_beam}/o.txt": True,  # through another key
        "o.${hydra:job.num}.txt": True,
        "out/${hydra:job.override_dirname}.txt": True,
    }
    for written, per_job in cases.items():
        cfg.output = written
        assert varies_per_job(cfg, "output", swept) is per_job, written
    assert varies_per_job(cfg, "output", {"output"})  # output=a.txt,b.txt: swept itself


def sweep_commands(run: Path, tmp_path: Path, *commands: list[str]) -> list:
    """Each of `commands` (`tmt-eval ...`, `tmt-translate ...`) with -m and run_dir=run, started
    at once (each spends most of its time starting, on one core) in a working folder of their
    own, which holds in.txt; their results, and the folder."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("a b c\nd e\n")
    started = [
        start_tmt(command, "-m", f"run_dir={run}", *args, cwd=work) for command, *args in commands
    ]
    return [finished(process) for process in started], work


# An untrained model's greedy search, cut short.
SHORT = ["decode=greedy", "decode.max_len_a=0", "decode.max_len_b=5"]


def test_eval_and_translate_sweeps_refuse_a_file_every_job_would_write(one_update_run, tmp_path):
    """Issue 66: `tmt-eval -m run_dir=R decode.beam_size=1,4` had both jobs write
    R/scores.test.json (the last one won), and `tmt-translate -m ... output=${run_dir}/o.txt`
    both write R/o.txt; each left multirun/DATE/TIME in the working folder. Now both are refused
    in one line before anything is written, and no sweep folder is left."""
    beams = "decode.beam_size=1,2"
    (refused_eval, refused_translate), work = sweep_commands(
        one_update_run,
        tmp_path,
        ["tmt-eval", beams],
        ["tmt-translate", "input=in.txt", beams, "output=${run_dir}/o.txt"],
    )
    shared = f"config key 'output': under -m every job would write {one_update_run}/o.txt"
    for refused, said in (
        (refused_eval, "tmt-eval -m: every job would write"),
        (refused_translate, shared),
    ):
        lines = [line for line in refused.stderr.splitlines() if "][ERROR]" in line]
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert said in lines[0] and "the sweep varies decode.beam_size" in lines[0]
        assert "Traceback" not in refused.stderr
    assert not (one_update_run / "o.txt").exists()
    assert not list(one_update_run.glob("scores.*")) and not list(one_update_run.glob("hypo*"))
    assert sorted(p.name for p in work.iterdir()) == ["in.txt"]


def test_eval_and_translate_sweeps_of_a_file_per_job_run(one_update_run, tmp_path):
    """A sweep of split (or run_dir) evaluates, a sweep of the output itself translates, and
    no sweep folder is left in the working folder."""
    done, work = sweep_commands(
        one_update_run,
        tmp_path,
        ["tmt-eval", "split=valid,test", *SHORT],
        ["tmt-translate", "input=in.txt", *SHORT, "output=a.txt,b.txt"],
    )
    for result in done:
        assert result.returncode == 0, result.stderr[-3000:]
    assert (one_update_run / "scores.valid.json").is_file()
    assert (one_update_run / "scores.test.json").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["a.txt", "b.txt", "in.txt"]


@pytest.mark.slow
def test_an_optuna_trial_refused_or_diverged_is_a_failed_trial_and_the_sweep_goes_on(tmp_path):
    """Review t6, C4 and C12. Three Optuna trials over the learning rate, drawn by the seeded
    sampler as -1.0, 1e9, then 1.0 (Optuna's TPE start-up draws; its grid sampler fails the
    sweep when the grid's last trial fails, a bug of hydra-optuna-sweeper 1.3). 1.0 trains;
    -1.0 is refused (one line, which used to end the whole sweep with exit 2,
    leaving an empty folder and no results); 1e9 diverges (stopped by
    trainer.max_nonfinite_updates=2 within a few updates of the limit, not at the end's log
    line, and recorded as diverged, where it used to end "finished" and return its score
    from before, which Optuna could call the best). The sweep ends with the one real result."""
    prepared = f"data.prepared_dir={tmp_path / 'prepared'}"
    command = [
        "-m",
        *SMALL,
        prepared,
        "trainer.max_steps=8",
        "trainer.max_nonfinite_updates=2",
        "hydra/sweeper=optuna",
        "hydra.sweeper.sampler.seed=9",
        "hydra.sweeper.direction=maximize",
        "hydra.sweeper.n_jobs=1",
        "hydra.sweeper.n_trials=3",
        "optim.lr_scale=choice(1.0,-1.0,1e9)",
        "run_dir=trials/${hydra:job.num}",
    ]
    done = tmt("tmt-train", *command, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    results = yaml.safe_load((tmp_path / "trials" / "optimization_results.yaml").read_text())
    assert results["best_params"]["optim.lr_scale"] == 1.0
    refused = [line for line in done.stderr.splitlines() if "][ERROR] - sweep job" in line]
    assert len(refused) == 1 and "failed, the sweep goes on: " in refused[0]
    assert "optim.lr_scale" in refused[0]
    ends = {}
    for folder in (p for p in (tmp_path / "trials").iterdir() if p.is_dir()):
        start, end = RunDir(folder).history()
        scale = next(o for o in start["overrides"] if o.startswith("optim.lr_scale="))
        ends[float(scale.split("=")[1])] = end
    assert set(ends) == {1.0, 1e9}  # the refused trial left no folder
    assert ends[1.0]["how"] == "finished" and ends[1.0]["step"] == 8
    diverged = ends[1e9]
    assert diverged["how"] == "diverged", diverged
    assert "updates in a row had a non-finite gradient" in diverged["reason"]
    assert diverged["step"] < 8
