"""Exceptions with messages a user can act on; only the CLI turns them into exit codes."""


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


class OutOfMemory(TransformerMTError):
    """The device's memory did not hold a training micro-batch; the message names the
    micro-batch, the key to lower (trainer.batch_tokens) and the checkpoint a rerun resumes."""
