"""Run by test_prepare.py as a script in its own process (so a hang cannot take the test run
with it): prepare a corpus with two encoding workers, one of which SIGKILLs itself on its
second chunk, as the OOM killer would; print, as JSON, the error prepare raised and what it
left in the prepared folder."""

import functools
import json
import os
import signal
import sys

from transformer_mt.config import DataConfig, SourceKind
from transformer_mt.data import binarize, prepare
from transformer_mt.errors import DataError


def set_up_then_die_on_second_chunk(src_model: str, tgt_model: str) -> None:
    """A worker's setup. It runs in the spawned worker, which the parent's patches never reach:
    the usual tokenizers, and an encode_chunk that kills its process on its second chunk (the
    parent submits encode_chunk by name, and the worker looks the name up here)."""
    binarize.load_worker_tokenizers(src_model, tgt_model)
    encode, seen = binarize.encode_chunk, []

    def encode_or_die(chunk):
        seen.append(len(chunk[0]))
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(chunk)

    binarize.encode_chunk = encode_or_die


def main(corpus: str, prepared: str) -> None:
    # 360 pairs in chunks of 50: not "small" (over 4 chunks), so with 2 workers at least one
    # worker gets a second chunk
    prepare.CHUNK_LINES = 50
    prepare.binarize = functools.partial(
        binarize.binarize, worker_setup=set_up_then_die_on_second_chunk
    )
    cfg = DataConfig(
        name="c",
        source=SourceKind.files,
        dir=corpus,
        src_lang="en",
        tgt_lang="de",
        vocab_size=400,
        prepared_dir=prepared,
        num_workers=2,
    )
    try:
        prepare.prepare(cfg)
        error = None
    except DataError as raised:
        error = str(raised)
    print(json.dumps({"error": error, "left": sorted(os.listdir(prepared))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
