"""transformer_mt: the Transformer of "Attention Is All You Need", paper-exact and fast."""

__version__ = "0.1.0"
