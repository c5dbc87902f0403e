"""torch.compile's cache is code: never read from the run folder (a pickle planted there ran on
resume), kept where only the user can write, one folder per setting torch's keys leave out (the
attention kernels), and a cache that cannot be used is one line, not a traceback. What torch reads
is checked too: the whole tree of the folder in use, a TORCHINDUCTOR_CACHE_DIR the user sets, every
rank's cache (never torch's default in the shared temp folder) and no precompiled header from
there; empty entries are removed first, a run's own private folder when it ends, and a full disk
is one line that names the folders and the space left."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import compile_probe
import pytest
import torch
from torch._dynamo import config as dynamo_config
from torch._inductor import codecache
from torch._inductor import config as inductor_config
from torch._inductor.exc import CppCompileError, InductorError
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from toy_runs import trainer_for

from transformer_mt.commands.train import train
from transformer_mt.config import compose_job
from transformer_mt.errors import TransformerMTError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.train import compile_cache
from transformer_mt.train.compile_cache import (
    CACHE_SETTING,
    cache_root,
    named_compile_failure,
    use_compile_cache,
)
from transformer_mt.train.trainer import Trainer

CPU = torch.device("cpu")


@pytest.fixture
def user_cache(tmp_path, monkeypatch) -> Iterator[Path]:
    """The user's cache folder, a new one; no cache chosen in the environment; private folders
    for one process made in the test's own folder; torch's compiler settings restored after the
    test."""
    for name in ("_HEADER_DIR", "_HEADER_LOCK_DIR", "_precompile_header"):  # torch's, set here
        monkeypatch.setattr(codecache, name, getattr(codecache, name))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(CACHE_SETTING, "")  # so that the test's end restores it, set or not
    monkeypatch.delenv(CACHE_SETTING)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with (
        inductor_config.patch(cpp_cache_precompile_headers=True),
        dynamo_config.patch(caching_precompile=dynamo_config.caching_precompile),
    ):
        yield cache_root()


def policy_of(*overrides: str) -> ExecutionPolicy:
    trainer = compose_job("train", ["run_dir=unused", *overrides]).trainer
    return ExecutionPolicy.for_training(trainer, CPU)


def test_the_cache_is_private_and_its_folder_follows_the_attention_kernels(user_cache, caplog):
    """torch 2.13's cache keys hold no SDPA state: another trainer.sdpa_backends (or precision)
    gets a folder of its own, the same settings the same folder."""
    run = user_cache.parent / "run"
    with caplog.at_level(logging.WARNING):
        auto = use_compile_cache(policy_of(), run / "compile-cache")
        assert use_compile_cache(policy_of(), run / "compile-cache") == auto
        math = use_compile_cache(policy_of("trainer.sdpa_backends=[math]"), run / "compile-cache")
        bf16 = use_compile_cache(policy_of("trainer.precision=bf16"), run / "compile-cache")
    assert len({auto, math, bf16}) == 3
    assert {auto.parent, math.parent, bf16.parent} == {user_cache}
    assert os.environ[CACHE_SETTING] == str(bf16)
    assert stat.S_IMODE(user_cache.stat().st_mode) == 0o700  # nobody else can reach inside
    assert caplog.records == []


def test_inductor_s_precompiled_headers_are_kept_in_the_folder_in_use(user_cache, monkeypatch):
    """Torch fixes their folder in its default one, in the shared temp folder, when it is
    imported; the folder in use gets them (the slow test below plants a header there). A torch
    without the names of that folder gets them turned off."""
    used = use_compile_cache(policy_of(), user_cache / "unused")
    assert Path(codecache._HEADER_DIR) == used / "precompiled_headers"
    assert Path(codecache._HEADER_LOCK_DIR) == used / "precompiled_headers" / "locks"
    assert inductor_config.cpp_cache_precompile_headers
    monkeypatch.delattr(codecache, "_HEADER_DIR")
    use_compile_cache(policy_of(), user_cache / "unused")
    assert not inductor_config.cpp_cache_precompile_headers


def test_a_cache_folder_others_can_write_is_not_used(user_cache, caplog):
    user_cache.mkdir(parents=True)
    user_cache.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents and used.is_dir()
    assert stat.S_IMODE(used.stat().st_mode) == 0o700
    (warning,) = caplog.records
    assert "others may write to it" in warning.getMessage()
    assert str(user_cache) in warning.getMessage()


def test_a_cache_folder_of_another_user_is_not_used(user_cache, monkeypatch, caplog):
    user_cache.mkdir(parents=True)
    monkeypatch.setattr(compile_cache.os, "getuid", lambda: os.stat(user_cache).st_uid + 1)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents
    assert "is not a folder of yours" in caplog.text


def test_a_cache_that_cannot_be_written_is_one_line_and_a_private_folder(
    user_cache, monkeypatch, caplog
):
    """A read-only (or full) disk: torch failed at its first lock file with a 154-line
    traceback; now the run compiles into a folder of its own and says so."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(compile_cache.tempfile, "TemporaryFile", read_only)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents
    (warning,) = caplog.records
    assert "cannot be written (Read-only file system)" in warning.getMessage()


def test_a_run_folder_s_old_cache_is_named_and_not_read(user_cache, caplog):
    old = user_cache.parent / "run" / "compile-cache"
    old.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), old)
    assert old not in [used, *used.parents]
    assert f"{old} is not read: a compile cache is code" in caplog.text


def test_a_failure_of_torch_compile_is_one_line_naming_its_cache(tiny_train_job, monkeypatch):
    """A full disk while Inductor writes (its OSError wrapped: it slipped past the CLI's
    full-disk line), a damaged cache: one line, what to do, the checkpoints intact."""
    cache = Path("/some/cache")
    full = named_compile_failure(InductorError(OSError(errno.ENOSPC, "No space left"), None), cache)
    assert "torch.compile ran out of disk space (OSError:" in str(full)
    assert "its cache /some/cache: unreadable" in str(full)  # no such folder here
    assert "rerun, or train without it (trainer.compile=false)" in str(full)
    damaged = InductorError(RuntimeError("C++ compile error\n" + "line\n" * 200), None)
    said = str(named_compile_failure(damaged, cache))
    assert "RuntimeError: C++ compile error; delete /some/cache to compile afresh" in said
    assert "\n" not in said
    assert named_compile_failure(ValueError("not torch.compile's"), cache) is None

    trainer = trainer_for(tiny_train_job("trainer.max_steps=1"))

    def compiling_fails():
        raise InductorError(OSError(errno.ENOSPC, "No space left on device"), None)

    monkeypatch.setattr(trainer, "run_updates", compiling_fails)
    with pytest.raises(TransformerMTError, match="torch.compile ran out of disk space"):
        trainer.fit()


# ---- what is read: every folder in the tree, TORCHINDUCTOR_CACHE_DIR, empty entries -----------
def test_a_key_folder_that_others_may_write_or_own_is_not_used(user_cache, caplog):
    """The review's S3: the root was checked, the key folder below it not, so a key folder at
    mode 0777 (or another user's, once the root was tightened with chmod) was read. Any user can
    run the mode's case; as root, the test gives an entry deep inside to uid 65534 too."""
    key = compile_cache.cache_key(policy_of())
    folder = user_cache / key / "fxgraph" / "ab"
    folder.mkdir(parents=True)
    (user_cache / key).chmod(0o777)
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents
    (warning,) = caplog.records
    assert f"anyone may write to {user_cache / key}" in warning.getMessage()
    if os.getuid() != 0:
        return
    (user_cache / key).chmod(0o755)
    entry = folder / "planted"
    entry.write_bytes(b"")
    os.chown(entry, 65534, 65534)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert user_cache not in used.parents
    assert f"{entry} is not yours (owner uid 65534)" in caplog.text


def test_a_torchinductor_cache_dir_that_others_may_write_is_not_used(
    user_cache, monkeypatch, caplog
):
    """The review's S4: a TORCHINDUCTOR_CACHE_DIR that anyone may write to was used without a
    word. It is checked as the user's own cache is: one line naming it, and a private folder;
    a folder only the user can write is used as given."""
    shared = user_cache.parent / "shared"
    shared.mkdir(mode=0o1777, parents=True)
    shared.chmod(0o1777)
    monkeypatch.setenv(CACHE_SETTING, str(shared))
    with caplog.at_level(logging.WARNING):
        used = use_compile_cache(policy_of(), user_cache / "unused")
    assert shared not in [used, *used.parents] and os.environ[CACHE_SETTING] == str(used)
    (warning,) = caplog.records
    assert warning.getMessage().startswith(f"{CACHE_SETTING}={shared} is not used: others may")

    own = user_cache.parent / "own"
    monkeypatch.setenv(CACHE_SETTING, str(own))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert use_compile_cache(policy_of(), user_cache / "unused") == own
    assert caplog.records == [] and os.environ[CACHE_SETTING] == str(own)


def test_a_private_folder_for_one_run_is_removed_when_the_run_ends(
    user_cache, tiny_train_job, monkeypatch
):
    """The review's C9: the folder a run compiles into when the user's cache is not usable was
    left in the temp folder (3 MB for the tiny model, one per run). It goes when the run ends,
    failed or not, and torch is no longer pointed at it."""
    user_cache.mkdir(parents=True)
    user_cache.chmod(0o777)
    job = tiny_train_job("trainer.compile=true", "trainer.valid_bleu_sentences=0")
    for ending in ("finished", "failed"):
        trainer = trainer_for(job)
        private = trainer.compile_cache
        assert private.is_dir() and user_cache not in private.parents
        assert os.environ[CACHE_SETTING] == str(private)

        def updates(ending=ending):
            if ending == "failed":
                raise RuntimeError("the run fails")
            return ending

        monkeypatch.setattr(trainer, "run_updates", updates)
        monkeypatch.setattr(trainer, "finish", lambda: None)
        with contextlib.suppress(RuntimeError):
            trainer.fit()
        assert not private.exists(), ending
        assert os.environ.get(CACHE_SETTING) != str(private)


# ---- a full disk: one line, the folders and their free space ---------------------------------
def test_a_full_temp_folder_is_named_with_the_space_left_not_the_cache_to_delete(tmp_path):
    """The review's C8: with the temp folder full, the compiler's error blamed the cache ("delete
    it"). A compiler that ran out of space (its message, not an OSError) is named as a full
    disk: the cache and the temp folder with the space left in each, and no deletion."""
    output = "cc1plus: fatal error: error writing to /tmp/ccX.s: No space left on device"
    compiler = CppCompileError(["g++", "kernel.cpp"], output)
    said = str(named_compile_failure(InductorError(compiler, None), tmp_path))
    assert said.startswith("torch.compile ran out of disk space (CppCompileError: C++ compile")
    assert f"its cache {tmp_path}: " in said and "MiB free" in said
    assert f"the temp folder {tempfile.gettempdir()}: " in said
    assert "delete" not in said and "\n" not in said


def test_torch_s_warnings_of_a_full_disk_are_one_line(user_cache, caplog):
    """t5 #11: a full cache disk gave 1,190 lines of torch's warnings (a traceback each) before
    the line that says what to do. Torch's warnings of a full disk are left out, said once in a
    line of ours; its other warnings pass."""
    in_use = use_compile_cache(policy_of(), user_cache / "unused")
    inductor = logging.getLogger("torch._inductor.codecache")  # as Inductor warns
    with caplog.at_level(logging.WARNING, logger=compile_cache.__name__), torch_prints() as shown:
        for _ in range(3):
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                inductor.warning("fx graph unable to write to cache", exc_info=True)
        aot = logging.getLogger("torch._functorch._aot_autograd.autograd_cache")
        aot.warning("AOTAutograd cache unable to serialize: [Errno 28] No space left on device")
        inductor.warning("another warning of torch's")
    printed = shown.getvalue()
    assert "unable to" not in printed and "Traceback" not in printed
    assert "another warning of torch's" in printed
    (ours,) = [r.getMessage() for r in caplog.records if r.name == compile_cache.__name__]
    assert ours.startswith(f"torch.compile is short of disk space: its cache {in_use}: ")


@contextlib.contextmanager
def torch_prints():
    """What torch's log handlers print (its loggers log through their own), into a buffer."""
    torch_loggers = [logging.getLogger("torch"), logging.getLogger("torch._inductor")]
    handlers = {
        handler
        for logger in torch_loggers
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
    }  # one handler may serve several loggers
    assert handlers
    shown = io.StringIO()
    streams = {handler: handler.setStream(shown) for handler in handlers}
    try:
        yield shown
    finally:
        for handler, stream in streams.items():
            handler.setStream(stream)


# ---- compiled in processes of their own: what torch reads -------------------------------------
PROBE = Path(__file__).resolve().parents[1] / "compile_probe.py"
DEFAULT_CACHE = Path(default_cache_dir()).name
"""torch's default cache, as a folder of the temp folder (torchinductor_<user>)."""
PLANTED_HEADER = """#include <torch/csrc/inductor/cpp_prefix.h>
#include <cstdio>
__attribute__((constructor)) static void planted() {{
    if (FILE* marker = std::fopen("{marker}", "w")) std::fclose(marker);
}}
"""
"""The review's header: what torch writes (the include), and code that runs when a kernel that
was compiled with it is loaded."""


def probe(variables: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """tests/compile_probe.py in a process of its own with these environment variables (TMPDIR:
    the temp folder, which holds torch's default cache), one compile thread (no pool of compile
    workers to start), TORCHINDUCTOR_CACHE_DIR unset."""
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", **variables}
    env.pop(CACHE_SETTING, None)
    command = [sys.executable, str(PROBE), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def default_header_names(temp: Path) -> set[str]:
    """The names torch gives its precompiled headers on this machine (from the compiler, its
    flags and torch's headers, not from the folder): those of a compile with torch's own settings
    whose header folder has a file where its lock folder goes, so that it stops once it has written
    the header, before compiling it (a minute's work and 155 MB)."""
    headers = temp / DEFAULT_CACHE / "precompiled_headers"
    headers.mkdir(parents=True)
    (headers / "locks").touch()
    probe({"TMPDIR": str(temp)}, "--as-torch")  # fails at the lock folder
    names = {path.name for path in headers.glob("*.h")}
    assert names, f"torch wrote no precompiled header into {headers}"
    return names


@pytest.fixture(scope="module")
def planted_header(tmp_path_factory) -> SimpleNamespace:
    """The review's S2: a compile set up as a training run's, in a process whose temp folder
    holds, where torch keeps its precompiled headers by default, a header of the name torch
    gives it that creates a marker file when a kernel compiled with it is loaded. The compile's
    cache (the user's, new) is what the later tests read."""
    folder = tmp_path_factory.mktemp("planted_header")
    names = default_header_names(folder / "reference")
    marker = folder / "the planted header ran"
    default = folder / "temp" / DEFAULT_CACHE
    (default / "precompiled_headers").mkdir(parents=True)
    for name in names:
        (default / "precompiled_headers" / name).write_text(PLANTED_HEADER.format(marker=marker))
    planted = set(default.rglob("*"))
    xdg = folder / "xdg"
    result = probe({"TMPDIR": str(folder / "temp"), "XDG_CACHE_HOME": str(xdg)})
    assert result.returncode == 0, result.stderr[-3000:]
    (in_use,) = (xdg / "transformer_mt" / "compile").iterdir()
    return SimpleNamespace(marker=marker, default=default, planted=planted, in_use=in_use)


@pytest.mark.slow
def test_a_header_planted_where_torch_keeps_its_precompiled_headers_is_not_compiled_in(
    planted_header,
):
    """Inductor kept its precompiled headers in torch's default folder in the shared temp folder
    whatever TORCHINDUCTOR_CACHE_DIR said, and compiled in a header it found there; the
    planted code ran. Nothing is read or written there now: the header (155 MB) is made in the
    private cache in use (docs/run-folder.md)."""
    assert not planted_header.marker.exists(), "the planted header ran"
    assert set(planted_header.default.rglob("*")) == planted_header.planted
    assert list(planted_header.in_use.glob("precompiled_headers/*.h.gch"))


class Planted:
    """A pickle that, when loaded, creates the file `marker` (the payload of a planted cache)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def plant_pickles(cache: Path, where: Path, marker: Path) -> set[Path]:
    """The review's `plant`: a pickle in `where` for each entry's folder of `cache` (its
    pickled graphs'), at the same place; the files planted."""
    planted = set()
    for folder in [*cache.glob("fxgraph/*/*"), *cache.glob("aotautograd/*")]:
        target = where / folder.relative_to(cache)
        target.mkdir(parents=True)
        (target / "00_planted").write_bytes(pickle.dumps(Planted(marker)))
        planted.add(target / "00_planted")
    return planted


def rank_compiling(rank: int, port: int, overrides: list[str], folder: Path) -> None:
    """One of two gloo ranks, in a spawned process: a compiled training run whose fit compiles
    the probe's step in place of the updates (the first update's compile, smaller), and writes
    Inductor's counters to folder/rankN.json."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )

    def compile_in_place_of_training(trainer: Trainer) -> str:
        counters = compile_probe.compile_small_step()
        (folder / f"rank{rank}.json").write_text(json.dumps(counters))
        return "the probe's step compiled"

    Trainer.fit = compile_in_place_of_training
    train(compose_job("train", overrides))


@pytest.mark.slow
def test_every_rank_reads_the_private_cache_never_torch_s_default(
    planted_header, tiny_overrides, tmp_path, monkeypatch
):
    """The review's S1: only rank 0 chose the private cache; rank 1 read torch's default cache in
    the shared temp folder, where a pickle planted in each entry's folder ran. Two gloo ranks of
    a compiled run, with a pickle planted there at the keys of the probe's step: each rank finds
    the step in the private cache the probe filled, and writes nothing to the default one."""
    marker = tmp_path / "the planted pickle ran"
    default = tmp_path / "temp" / DEFAULT_CACHE
    planted = plant_pickles(planted_header.in_use, default, marker)
    assert planted
    monkeypatch.setenv("TMPDIR", str(tmp_path / "temp"))  # the ranks' temp folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(planted_header.in_use.parents[2]))
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # as the probe compiled
    monkeypatch.setenv(CACHE_SETTING, "")  # so that the test's end restores it, set or not
    monkeypatch.delenv(CACHE_SETTING)
    overrides = [
        *tiny_overrides,
        f"run_dir={tmp_path / 'run'}",
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "trainer.compile=true",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
    ]
    context = multiprocessing.get_context("spawn")
    port = free_port()
    ranks = [
        context.Process(target=rank_compiling, args=(rank, port, overrides, tmp_path))
        for rank in range(2)
    ]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout=300)
    assert not marker.exists(), "the planted pickle ran"
    assert [rank.exitcode for rank in ranks] == [0, 0]
    for rank in range(2):
        counters = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert counters.get("fxgraph_cache_hit", 0) > 0, (rank, counters)
        assert counters.get("fxgraph_cache_miss", 0) == 0, (rank, counters)
    assert {path for path in default.rglob("*") if path.is_file()} == planted


@pytest.mark.slow
def test_empty_entries_in_the_cache_are_removed_before_torch_reads_them(planted_header, tmp_path):
    """The review's C10 (t5 #9): empty files among the cache's entries (a full disk, a crash)
    made torch print a warning with a traceback for each (8 for the tiny model), though the run
    went on. They are removed before torch reads the cache: no traceback; the step is compiled
    again and saved whole."""
    source = planted_header.in_use
    copy = tmp_path / "xdg" / "transformer_mt" / "compile" / source.name
    shutil.copytree(source, copy)
    emptied = entries(copy)
    assert emptied
    for path in emptied:
        path.write_bytes(b"")
    (tmp_path / "temp").mkdir()
    result = probe({"TMPDIR": str(tmp_path / "temp"), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    counters = json.loads(result.stdout.splitlines()[-1])
    assert counters["fxgraph_cache_miss"] == 1, counters
    assert entries(copy) and all(path.stat().st_size > 0 for path in entries(copy))


def entries(cache: Path) -> list[Path]:
    """The files of a cache's pickled entries (its graphs', AOTAutograd's)."""
    return [
        path
        for kind in ("fxgraph", "aotautograd")
        for path in (cache / kind).rglob("*")
        if path.is_file()
    ]


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]
