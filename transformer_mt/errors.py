"""Exceptions with messages a user can act on; only the CLI turns them into exit codes."""


class TransformerMTError(Exception):
    """Base class: a user-facing problem (bad input, bad config, missing file)."""


class ConfigError(TransformerMTError):
    """A configuration value is impossible; the message names the key."""


class DataError(TransformerMTError):
    """Input text is unusable; the message names the file and line."""


class CheckpointError(TransformerMTError):
    """A checkpoint is missing, corrupt, or not one of ours; the message names the path."""
