"""Imported by the fork server that starts the training DataLoader's workers
(train/loader_workers.py) and by nothing else: importing it makes the importing process ignore
the stop signals. The server then ignores them from its start, and so does every worker it forks
before its own worker_init_fn runs; and the code the workers run (torch, the batching) is
imported once, in the server."""

from transformer_mt.data import batching  # noqa: F401  (imported for the workers)
from transformer_mt.train.signals import ignore_stop_signals

ignore_stop_signals()
