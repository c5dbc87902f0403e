"""Exceptions with messages a user can act on; only the CLI turns them into exit codes."""

import signal


class TransformerMTError(Exception):
    """Base class: a user-facing problem (bad input, bad config, missing file)."""


class ConfigError(TransformerMTError):
    """A configuration value is impossible; the message names the key."""


class DataError(TransformerMTError):
    """Input text is unusable; the message names the file and line."""


class CheckpointError(TransformerMTError):
    """A checkpoint is missing, corrupt, or not one of ours; the message names the path."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint file whose content is not a checkpoint of ours (truncated, corrupt, foreign):
    reading it again gives the same. A read that failed (an OSError, memory) is a plain
    CheckpointError: the file may be whole."""


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGINT, SIGHUP) ended a command that has nothing to save, raised
    where its work was so that what it was writing is cleaned up on the way out. Not an
    Exception, as KeyboardInterrupt is not: no `except Exception` holds it up. The CLI ends with
    128 + the signal's number, as a shell reports a process the signal ended."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


class OutOfMemory(TransformerMTError):
    """The device's memory did not hold a training micro-batch; the message names the
    micro-batch, the key to lower (trainer.batch_tokens) and the checkpoint a rerun resumes."""
