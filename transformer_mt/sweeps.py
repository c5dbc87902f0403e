"""What Hydra's multirun (`-m`: a sweep, a sweeper such as Optuna, a launcher such as submitit)
needs from the commands: where each job's run folder is, and no output file shared by jobs.

An output is a file per job where its value, followed through its interpolations, reaches
Hydra's runtime for the job (${hydra:job.num}, job.id, job.override_dirname) or a key the
sweep varies (`varies_per_job`): `output=o.${decode.beam_size}.txt` under `decode.beam_size=1,4`,
not `output=${run_dir}/o.txt` with one run_dir. tmt-translate and tmt-eval keep Hydra's sweep
folder (its multirun.yaml and a folder per job, which they leave empty) in a temporary folder
removed when the process ends (`scratch_sweep_dir`), not in the working folder.

Each training job of a sweep trains in Hydra's folder for the job (hydra.sweep.dir and
hydra.sweep.subdir, set in configs/run_folder.yaml through the resolvers below):
- `<run_dir>-sweep/<job number>` by default;
- run_dir itself where the command line sets it. Written with Hydra's runtime in it
  (`runs/lr/${hydra:job.num}`, `runs/${hydra:job.override_dirname}`) that is a folder per job,
  and the sweep's own folder is the part of run_dir above the job's part (`runs/lr`), which the
  sweep needs before any job exists (Hydra creates it first; Optuna's optimization_results.yaml
  and submitit's logs go there). A fixed run_dir is one folder for every job: the second job is
  refused by the resume check, as another sweep in the same folders would be.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from transformer_mt.errors import ConfigError

JOB_PART = "${hydra:"
"""Where an interpolation of Hydra's runtime starts (job.num, job.override_dirname, job.id)."""


def raw_value(root: DictConfig, key: str) -> str:
    """The value of a top-level `key` as written, its interpolations unresolved."""
    return str(OmegaConf.to_container(OmegaConf.masked_copy(root, [key]), resolve=False)[key])


def sweep_dir(*, _root_: DictConfig) -> str:
    """The resolver ${tmt.sweep_dir:} (hydra.sweep.dir of the training commands)."""
    written = raw_value(_root_, "run_dir")
    if JOB_PART not in written:
        return f"{_root_.run_dir}-sweep"
    above = os.path.dirname(written[: written.index(JOB_PART)])
    if not above:
        return "."
    return str(OmegaConf.create({"folder": above}, parent=_root_).folder)


def sweep_subdir(job_num: int, *, _root_: DictConfig) -> str:
    """The resolver ${tmt.sweep_subdir:${hydra.job.num}} (hydra.sweep.subdir, resolved as a job
    starts): the job's number, or, where the command line sets run_dir, run_dir as seen from
    the sweep's folder."""
    overrides = OmegaConf.select(_root_, "hydra.overrides.task", default=[])
    if not any(str(override).lstrip("+~").startswith("run_dir=") for override in overrides):
        return str(job_num)
    return os.path.relpath(str(_root_.run_dir), str(_root_.hydra.sweep.dir))


@functools.cache  # one folder a process: Hydra resolves it for the sweep and for each job
def scratch_sweep_dir() -> str:
    """The resolver ${tmt.scratch_sweep_dir:}: hydra.sweep.dir of tmt-translate and tmt-eval,
    whose jobs write only the files they name. A temporary folder, removed when the process
    ends."""
    folder = tempfile.mkdtemp(prefix="tmt-sweep-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("tmt.sweep_dir", sweep_dir, replace=True)
    OmegaConf.register_new_resolver("tmt.sweep_subdir", sweep_subdir, replace=True)
    OmegaConf.register_new_resolver("tmt.scratch_sweep_dir", scratch_sweep_dir, replace=True)


SWEEP_ONLY = ("${hydra:job.num}", "${hydra:job.id}")
"""Hydra's runtime values that exist only under -m (outside a sweep they resolve to None)."""


PER_JOB = ("hydra:job.num", "hydra:job.id", "hydra:job.override_dirname")
"""Hydra's runtime values that differ from job to job of a sweep."""
INTERPOLATION = re.compile(r"\$\{([^${}]+)\}")


def swept_keys(overrides: Iterable[str], params: dict | None = None) -> set[str]:
    """The keys a sweep gives each job a value of its own: those of its sweep overrides
    (`decode.beam_size=1,4`, `range(...)`, `choice(...)`) among `overrides` (the command
    line's) and `params` (hydra.sweeper.params: the basic sweeper's, Optuna's)."""
    written = [*overrides, *(f"{key}={value}" for key, value in (params or {}).items())]
    parsed = OverridesParser.create().parse_overrides(written)
    return {override.key_or_group for override in parsed if override.is_sweep_override()}


def varies_per_job(cfg: DictConfig, key: str, swept: set[str], depth: int = 0) -> bool:
    """Whether `key`'s value differs from job to job: it is swept, or its value as written
    reaches, through its interpolations, Hydra's runtime for the job or a swept key."""
    if key in swept:
        return True
    written = written_value(OmegaConf.to_container(cfg, resolve=False), key)
    for reference in INTERPOLATION.findall(written if isinstance(written, str) else ""):
        reference = reference.strip()
        if reference in PER_JOB:
            return True
        is_key = ":" not in reference  # another resolver gives every job the same value
        if is_key and depth < 16 and varies_per_job(cfg, reference, swept, depth + 1):
            return True
    return False


def written_value(tree: dict, key: str):
    """The value of a dotted `key` in a config container, as written (None: no such key)."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def check_job_paths(
    cfg: DictConfig,
    *,
    multirun: bool,
    outputs: tuple[str, ...] = (),
    swept: set[str] = frozenset(),
) -> None:
    """Outside a sweep, no value may use a job's number (`runs/None` is no folder anyone
    meant); under -m, each of `outputs` (output files) that is set must name a file per job
    (`varies_per_job`, `swept` the sweep's keys), not one path every job would write in turn,
    the last one winning."""
    if not multirun:
        for key, value in written_values(OmegaConf.to_container(cfg, resolve=False)):
            for part in SWEEP_ONLY:
                if part in value:
                    raise ConfigError(
                        f"config key '{key}': {part} has a value only in a sweep (-m); "
                        f"without -m write the name itself, e.g. {value.replace(part, '1')}"
                    )
        return
    for key in outputs:
        if cfg.get(key) is not None and not varies_per_job(cfg, key, swept):
            stem, suffix = os.path.splitext(os.path.basename(str(cfg[key])))
            raise ConfigError(
                f"config key '{key}': under -m every job would write {cfg[key]} and the last one "
                f"would win ({sweeping(swept)}); name a file per job, e.g. "
                f"'{key}={stem}.${{hydra:job.num}}{suffix}' or "
                f"'{key}=${{hydra:job.override_dirname}}{suffix}'"
            )


def check_evaluation_paths(cfg: DictConfig, swept: set[str]) -> None:
    """Under -m, tmt-eval's jobs write scores.SPLIT.json and hypotheses.SPLIT.txt into run_dir:
    a file per job only where run_dir or split varies from job to job."""
    if varies_per_job(cfg, "run_dir", swept) or varies_per_job(cfg, "split", swept):
        return
    raise ConfigError(
        f"tmt-eval -m: every job would write {cfg.run_dir}/scores.{cfg.split}.json and "
        f"hypotheses.{cfg.split}.txt and the last one would win ({sweeping(swept)}); sweep "
        "run_dir or split, or run one tmt-eval for each setting"
    )


def sweeping(swept: set[str]) -> str:
    return f"the sweep varies {', '.join(sorted(swept))}" if swept else "the sweep varies no key"


def written_values(tree, prefix: str = ""):
    """(dotted key, value) for every string value of a config as written."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for name, value in items:
        key = f"{prefix}{name}" if isinstance(tree, dict) else f"{prefix[:-1]}[{name}]"
        if isinstance(value, (dict, list)):
            yield from written_values(value, f"{key}.")
        elif isinstance(value, str):
            yield key, value
