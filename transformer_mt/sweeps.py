"""What Hydra's multirun (`-m`: a sweep, a sweeper such as Optuna, a launcher such as submitit)
needs from the commands: where each job's run folder is, and no output file shared by jobs.

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

import os

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


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("tmt.sweep_dir", sweep_dir, replace=True)
    OmegaConf.register_new_resolver("tmt.sweep_subdir", sweep_subdir, replace=True)


SWEEP_ONLY = ("${hydra:job.num}", "${hydra:job.id}")
"""Hydra's runtime values that exist only under -m (outside a sweep they resolve to None)."""


def check_job_paths(cfg: DictConfig, *, multirun: bool, outputs: tuple[str, ...] = ()) -> None:
    """Outside a sweep, no value may use a job's number (`runs/None` is no folder anyone
    meant); under -m, each of `outputs` (output files) that is set must name a file per job:
    written as an interpolation (of the job's number or of a swept key), not one path every job
    would write in turn, the last one winning."""
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
        if cfg.get(key) is not None and not OmegaConf.is_interpolation(cfg, key):
            stem, suffix = os.path.splitext(str(cfg[key]))
            raise ConfigError(
                f"config key '{key}': under -m every job would write {cfg[key]} and the last one "
                f"would win; name a file per job, e.g. '{key}={stem}.${{hydra:job.num}}{suffix}' "
                f"or '{key}=${{run_dir}}/{os.path.basename(str(cfg[key]))}'"
            )


def written_values(tree, prefix: str = ""):
    """(dotted key, value) for every string value of a config as written."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for name, value in items:
        key = f"{prefix}{name}" if isinstance(tree, dict) else f"{prefix[:-1]}[{name}]"
        if isinstance(value, (dict, list)):
            yield from written_values(value, f"{key}.")
        elif isinstance(value, str):
            yield key, value
