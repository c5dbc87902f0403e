"""benchmarks/measure.py, the machinery every benchmark measures with: the ABBA order, a
process's own peak RSS, a command's time limit, a function run in a fresh process."""

from __future__ import annotations

import os
import sys

import pytest

from benchmarks.measure import abba_order, in_fresh_process, peak_rss_mib, run_command


def test_abba_order_puts_each_system_first_as_often_as_last():
    orders = [abba_order("AB", turn) for turn in range(4)]
    assert orders == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]


def test_a_process_peak_rss_is_its_own_not_its_parents():
    """Read from VmHWM: getrusage's ru_maxrss in a process started by exec (a spawned worker, a
    command) is at least its parent's peak when it started, here above 400 MiB."""
    ballast = b"x" * (400 * 2**20)  # this process's peak above 400 MiB
    hold = "import time; time.sleep(0.5)"  # long enough for a few readings
    large = run_command([sys.executable, "-c", f"block = b'x' * (300 * 2**20); {hold}"])
    small = run_command([sys.executable, "-c", hold])
    assert large.status == small.status == 0 and len(ballast) > 0
    assert large.peak_rss_mib > 300 > small.peak_rss_mib > 0, (large, small)
    assert 0 < in_fresh_process(peak_rss_mib) < 400


def test_a_command_past_its_limit_is_stopped_and_said_so():
    code = "import time; print('started', flush=True); time.sleep(120)"
    done = run_command([sys.executable, "-c", code], limit=2)
    assert done.status is None, done  # None: stopped at its limit, whatever its exit status
    assert done.stdout == ["started"] and done.seconds < 60


def test_a_function_runs_in_a_fresh_process_whose_death_is_an_error():
    assert in_fresh_process(os.getpid) != os.getpid()
    with pytest.raises(RuntimeError, match="_exit died in its own process"):
        in_fresh_process(os._exit, 3)
