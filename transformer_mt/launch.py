"""Which rank this process is, as the launcher that started it says.

torchrun (and anyone who sets its variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) is read as it is. Without them, two other launchers start the ranks of one training:
- Slurm's `srun`, in an sbatch script or under Hydra's submitit_slurm launcher (which runs srun):
  every task of the job step is a rank (SLURM_PROCID of SLURM_STEP_NUM_TASKS, SLURM_LOCALID on
  its node), and rank 0 listens on the first node of SLURM_STEP_NODELIST. The batch script itself
  (SLURM_NTASKS set, but no job step: a command run without srun) is one process, not one rank of
  SLURM_NTASKS that would wait for the others forever.
- submitit's local executor (Hydra's submitit_local launcher): SUBMITIT_LOCAL_GLOBALID of
  SUBMITIT_LOCAL_NTASKS, on this machine.
A MASTER_ADDR or MASTER_PORT of the user's is kept; without one the port is derived from the
job's id, the same on every task of the job. The result is torchrun's variables, which
train/distributed.py hands to torch.distributed (env://) as under torchrun.

The launcher's variables are checked before any rank waits for another: present, whole numbers,
a task number below the count of tasks. A set that is not what the launcher gives (hand-set,
or copied from another job's environment) is one line naming the variable, where it would
otherwise wait out trainer.rank_timeout_minutes for ranks that never come, or fail with a
traceback.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

from transformer_mt.errors import TransformerMTError

TORCHRUN = "WORLD_SIZE"
PORTS = (20_000, 60_000)  # where a derived MASTER_PORT falls (submitit's own choice of range)
# What to do about a Slurm or submitit variable that is missing or wrong.
SLURM = (
    "srun sets it for each task: start the ranks with srun, or unset SLURM_STEP_NUM_TASKS to "
    "train as one process"
)
SUBMITIT = (
    "submitit's local executor sets it for each task; unset SUBMITIT_EXECUTOR to train as one "
    "process"
)


def rank_variables(environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """(torchrun's variables for this process, the launcher they come from): empty where
    torchrun's are set already or no launcher of several tasks started this process."""
    if TORCHRUN in environ:
        return {}, "torchrun"
    if task_number(environ, "SLURM_STEP_NUM_TASKS", SLURM, default=1) > 1:
        return slurm_ranks(environ), "Slurm (srun)"
    if (
        environ.get("SUBMITIT_EXECUTOR") == "local"
        and task_number(environ, "SUBMITIT_LOCAL_NTASKS", SUBMITIT, default=1) > 1
    ):
        return submitit_local_ranks(environ), "submitit's local executor"
    return {}, "none"


def task_number(
    environ: Mapping[str, str],
    name: str,
    hint: str,
    *,
    default: int | None = None,
    below: str | None = None,
) -> int:
    """The launcher's variable `name`, a whole number; `default` where it is not set (None: it
    must be); below the number that the variable `below` holds, where one is named. A
    TransformerMTError naming the variable, with `hint` (what to do), otherwise."""
    value = environ.get(name)
    if value is None:
        if default is None:
            raise TransformerMTError(f"{name} is not set: {hint}")
        return default
    if not re.fullmatch(r"\s*[0-9]+\s*", value):
        raise TransformerMTError(f"{name}={value!r} is not a whole number: {hint}")
    number = int(value)
    if below is not None and number >= int(environ[below]):
        raise TransformerMTError(
            f"{name}={number} is not below {below}={environ[below]} (tasks are numbered from 0): "
            f"{hint}"
        )
    return number


def world_size(environ: Mapping[str, str]) -> int:
    """How many ranks this process's launcher started (1 without one)."""
    variables, _ = rank_variables(environ)
    return int(variables.get(TORCHRUN, environ.get(TORCHRUN, "1")))


def unused_slurm_tasks(environ: Mapping[str, str]) -> int:
    """SLURM_NTASKS where this process runs in a Slurm job of several tasks without srun (the
    batch script itself: one process); 0 otherwise."""
    tasks = task_number(environ, "SLURM_NTASKS", "Slurm sets it for a job", default=1)
    inside_step = "SLURM_STEP_NUM_TASKS" in environ or TORCHRUN in environ
    return tasks if tasks > 1 and not inside_step else 0


def slurm_ranks(environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables of a task of an srun step of several tasks (SLURM_STEP_NUM_TASKS
    above 1, checked by the caller): rank 0's address from the step's first node, unless the
    user set MASTER_ADDR, and its port from the job's id, unless the user set MASTER_PORT."""
    world = task_number(environ, "SLURM_STEP_NUM_TASKS", SLURM)
    rank = task_number(environ, "SLURM_PROCID", SLURM, below="SLURM_STEP_NUM_TASKS")
    local = task_number(environ, "SLURM_LOCALID", SLURM, default=0)
    node = task_number(environ, "SLURM_NODEID", SLURM, default=0)
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    master = environ.get("MASTER_ADDR") or first_host(nodes)
    if not master:
        raise TransformerMTError(
            f"SLURM_STEP_NODELIST={nodes!r}: no node to find rank 0 on (nor SLURM_JOB_NODELIST, "
            f"nor MASTER_ADDR): {SLURM}"
        )
    if not (environ.get("MASTER_PORT") or environ.get("SLURM_JOB_ID")):
        raise TransformerMTError(
            f"SLURM_JOB_ID is not set (rank 0's port is derived from it; or set MASTER_PORT): "
            f"{SLURM}"
        )
    per_node = tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", str(world)))
    job = f"{environ.get('SLURM_JOB_ID', '0')}.{environ.get('SLURM_STEP_ID', '0')}"
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(per_node[node] if node < len(per_node) else per_node[0]),
        "MASTER_ADDR": master,
        "MASTER_PORT": environ.get("MASTER_PORT") or str(port_of(job)),
    }


def submitit_local_ranks(environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables of a task of submitit's local executor with several tasks
    (SUBMITIT_LOCAL_NTASKS above 1, checked by the caller), all on this machine."""
    tasks = task_number(environ, "SUBMITIT_LOCAL_NTASKS", SUBMITIT)
    rank = task_number(environ, "SUBMITIT_LOCAL_GLOBALID", SUBMITIT, below="SUBMITIT_LOCAL_NTASKS")
    local = task_number(environ, "SUBMITIT_LOCAL_LOCALID", SUBMITIT, default=rank)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(tasks),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(tasks),
        "MASTER_ADDR": environ.get("MASTER_ADDR") or "127.0.0.1",
        "MASTER_PORT": environ.get("MASTER_PORT")
        or str(port_of(environ.get("SUBMITIT_LOCAL_JOB_ID", "0"))),
    }


def port_of(job: str) -> int:
    """A port for rank 0's store, the same on every task of the job and different for most
    other jobs."""
    low, high = PORTS
    return low + zlib.crc32(job.encode()) % (high - low)


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's SLURM_STEP_TASKS_PER_NODE, e.g. '2(x3),1', as [2, 2, 2, 1]."""
    counts = []
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found:
            counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts or [1]


def first_host(nodelist: str) -> str | None:
    """The first host of a Slurm host list: 'gpu[003-004,010],cpu1' -> 'gpu003',
    'r[1-2]n[07-08]' -> 'r1n07'."""
    first = re.match(r"(?:[^,\[]+|\[[^\]]*\])+", nodelist.strip())
    if first is None:
        return None
    return re.sub(r"\[([^\],\-]*)[^\]]*\]", r"\1", first.group(0))
