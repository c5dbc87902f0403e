"""benchmarks/measure.py, the machinery every benchmark measures with: the ABBA order, a
command's own peak RSS and time limit, a function run in a fresh process."""

from __future__ import annotations

import os
import sys

import pytest

from benchmarks.measure import abba_order, in_fresh_process, run_command


def test_abba_order_puts_each_system_first_as_often_as_last():
    orders = [abba_order("AB", turn) for turn in range(4)]
    assert orders == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]


def test_each_command_reports_its_own_peak_rss():
    """os.wait4's figure is the command's alone: a small command after a large one is not given
    the large one's peak (getrusage's RUSAGE_CHILDREN is the largest child's so far)."""
    large = run_command([sys.executable, "-c", "block = b'x' * (300 * 2**20)"])
    small = run_command([sys.executable, "-c", "pass"])
    assert large.status == small.status == 0
    assert large.peak_rss_mib > 300 > small.peak_rss_mib


def test_a_command_past_its_limit_is_stopped_and_said_so():
    code = "import time; print('started', flush=True); time.sleep(120)"
    done = run_command([sys.executable, "-c", code], limit=2)
    assert done.status is None, done  # None: stopped at its limit, whatever its exit status
    assert done.stdout == ["started"] and done.seconds < 60


def test_a_function_runs_in_a_fresh_process_whose_death_is_an_error():
    assert in_fresh_process(os.getpid) != os.getpid()
    with pytest.raises(RuntimeError, match="_exit died in its own process"):
        in_fresh_process(os._exit, 3)
