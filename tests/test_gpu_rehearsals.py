"""What a GPU user runs, prepared for `make gpu-check` and rehearsed here on the CPU: the Multi30k
recipe for one GPU end to end (benchmarks/gpu_recipe.py: train, average, alpha, test BLEU, and
its sweep on valid BLEU) and WMT's first hour on generated data with the paper run's projection
(benchmarks/wmt_first_hour.py). The rehearsals check the code path and what each prints, never
a speed: the figures come from a GPU."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from benchmarks.wmt_first_hour import seconds_per_update, validation_seconds

ROOT = Path(__file__).resolve().parents[1]


def rehearse(module: str, workdir: Path, *options: str) -> str:
    """The module's --rehearse-on-cpu output (stdout); it must end with status 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--rehearse-on-cpu", "--workdir", str(workdir),
         "--limit", "600", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_multi30k_gpu_recipe_rehearses_end_to_end_on_the_cpu(tmp_path):
    """From a fresh run folder on a corpus in Multi30k's layout: tmt-train --config-name
    multi30k_gpu, tmt-average last=auto, tmt-eval with averaged.pt and alpha=auto, the test BLEU
    and the wall time; then the sweep's one change, by valid BLEU."""
    out = rehearse("benchmarks.gpu_recipe", tmp_path, "--sweep")
    for step in (
        "tmt-train --config-name multi30k_gpu: ok",
        "tmt-average last=auto: ok",
        "tmt-eval checkpoint=averaged.pt decode.length_penalty=auto: ok",
    ):
        assert step in out, out
    assert re.search(r"^recipe: test BLEU [\d.]+ in \d+ s of wall time", out, re.M), out
    assert re.search(r"^sweep 0: model\.dropout=0\.1: \d+ updates, valid BLEU [\d.]+$", out, re.M)
    run = tmp_path / "run"
    assert (run / "checkpoints" / "averaged.pt").is_file()
    assert (run / "scores.test.json").is_file()
    assert len(list((run / "checkpoints").glob("step_*.pt"))) > 1  # written by time, averaged


@pytest.mark.slow
def test_wmt_first_hour_rehearses_on_the_cpu(tmp_path):
    """Each of its five steps prints its figures: preparation and its projection to 4.5M pairs;
    the first updates (distinct shapes, the first update, speed over time, a checkpoint's write
    time); the validation pass; one rank's share; 100k updates projected on 1 and 8 devices."""
    out = rehearse("benchmarks.wmt_first_hour", tmp_path)
    expected = [
        r"^   preparation: 20,000 pairs in \d+ s = [\d,]+ pairs/s .* 4\.5M pairs projected",
        r"epoch 0: \d+ micro-batches in \d+ distinct shapes",
        r"the first update took [\d.]+ s",
        r"update 12 epoch 0 .* tok/s=\d+",
        r"^   one checkpoint: step_12\.pt, \d+ MB, written in [\d.]+ s$",
        r"^3\. validation: [\d.]+ s for the loss on the valid split and greedy BLEU on 40 ",
        r"^   [\d.]+ ms an update \(the second half of 6\)$",
        r"^5\. projection of 100,000 updates of model=tiny on one cpu device: [\d.]+ s an update",
        r"^   on 8: one rank's share [\d.]+ ms \+ the all-reduce of [\d,]+ float32 gradients, "
        r"modelled as a ring at 360 GB/s",
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.M), (pattern, out)


LOG = [
    "[2026-12-04 17:40:00,000][transformer_mt.train.metrics][INFO] - update 50 epoch 0 loss=9.1 "
    "nll=9.0 ppl=8100.00 lr=1.0e-04 gnorm=1.0 tok/s=100000 elapsed=0.2min",
    "[2026-12-04 17:41:00,000][transformer_mt.train.metrics][INFO] - update 100 epoch 0 loss=8.0 "
    "nll=7.9 ppl=2700.00 lr=2.0e-04 gnorm=1.0 tok/s=250000 mfu=0.1 mfu_padded=0.1 elapsed=0.3min",
    "[2026-12-04 17:41:00,500][transformer_mt.train.trainer][INFO] - stopped: reached "
    "trainer.max_steps=100 after 100 updates, 0.3 min of training",
    "[2026-12-04 17:41:42,750][transformer_mt.train.metrics][INFO] - update 100: valid loss 7.5, "
    "nll 7.4, ppl 1600.00, BLEU 0.50",
]


def test_the_projection_reads_the_late_windows_and_the_validation_from_the_log():
    """Seconds an update from the windows after the first half only (the first is the warm-up);
    the validation from 'stopped' to its result."""
    assert seconds_per_update(LOG, 25_000, after=50) == pytest.approx(0.1)
    assert seconds_per_update(LOG, 25_000, after=0) == pytest.approx((0.25 + 0.1) / 2)
    assert validation_seconds(LOG) == pytest.approx(42.25)


@pytest.mark.parametrize(
    "group,name,limit",
    [
        ("multi30k", "multi30k gpu recipe", 360),
        ("multi30k-sweep", "multi30k sweep", 540),
        ("wmt-hour", "wmt first hour", 540),
    ],
)
def test_make_gpu_check_has_a_run_for_each(group, name, limit, tmp_path):
    """Each is a run of its own (a lent machine's 10 minutes a command), limited as sized."""
    report = gpu_check.Report(tmp_path / "gpu.txt", tmp_path / "gpu.log")
    args = argparse.Namespace(parts=[group], multi30k_dir=str(tmp_path / "multi30k"))
    (part,) = gpu_check.chosen_parts(args, gpu_check.GPU, report, tmp_path)
    assert (part.name, part.limit) == (name, limit)
