"""Running the console commands (tmt-train, tmt-translate, ...) as a user does: in processes of
their own, from the virtual environment's bin folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def run_command(
    command: str, *args: str, stdin: bytes = b"", timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / command), *args], input=stdin, capture_output=True, timeout=timeout
    )


def run_commands_together(
    commands: list[list[str]], timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Each of `commands` ([command, *args]) started at once, the results in their order.

    For a test's independent commands: a console command spends most of its ~2 seconds starting
    (importing torch), on one core, so on two cores they take about half the time together. Each
    one's standard input is empty."""
    processes = [
        subprocess.Popen(
            [str(BIN / command), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for command, *args in commands
    ]
    results = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout)
            results.append(
                subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
            )
    finally:
        for process in processes:
            process.kill()
            process.wait()
    return results
