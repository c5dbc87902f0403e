"""Imported by the fork server that starts the training DataLoader's workers
(train/loader_workers.py) and by nothing else: importing it makes the importing process ignore
the stop signals, first of all (the trainer started the server with them held back,
signals.held_for_children, so one sent to the process group while the server started is
dropped here, not fatal). Every worker the server forks ignores them too, before its own
worker_init_fn runs; and the code the workers run (torch, the batching) is imported once, in the
server."""

from transformer_mt.train.signals import release_ignored

release_ignored()

from transformer_mt.data import batching  # noqa: E402, F401  (imported for the workers)
