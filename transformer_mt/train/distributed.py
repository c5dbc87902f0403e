"""Ranks: process groups, each rank's device, and small host-side agreements.

`torchrun` (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT),
Slurm's `srun` or submitit (their variables read by launch.py) starts one process per device; a
plain `tmt-train` is one rank of a world of one. Gradients are
averaged by DistributedDataParallel over the main group (NCCL on GPUs, gloo on CPUs). Decisions the
ranks must share (a stop signal, the time limit, a time-based checkpoint: agreed every
trainer.agree_every updates) go over a second, gloo group on CPU tensors, so agreeing on them
never waits for the GPU. What every rank can work out alone is not sent: an update's target
tokens on all ranks come from the epoch's batches, which every rank computes whole
(data/batching.epoch_batches).

Gloo (the control group, and on CPUs the main group too) binds the address that this machine's
host name resolves to. Debian and Ubuntu map the host name to 127.0.1.1 in /etc/hosts (so do some
container setups), and every rank then tells the others to connect to a loopback address of its
own machine: across machines `Gloo connectFullMesh failed ... Connection refused`. NCCL picks its
interface by itself and is not affected. So where GLOO_SOCKET_IFNAME is unset, `start_ranks` sets
it to the interface holding the address this machine uses to reach MASTER_ADDR (the kernel's
routing table, asked by connecting a UDP socket, which sends nothing): the network the ranks
already reach each other's store through, `lo` on a single machine. If MASTER_ADDR is this machine
through loopback in a job of several machines (torchrun's c10d rendezvous passes node 0's host
name), the default route's interface is taken instead. A user's GLOO_SOCKET_IFNAME is never
changed. Carrying the agreements on torchrun's TCP store instead was not chosen: on CPUs the
gradients go over gloo too, which the store cannot replace, and a store round trip per rank and
agreement would be slower than one all-reduce.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import ipaddress
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from transformer_mt.data.batching import BatchPlan
from transformer_mt.device import prepare_process, resolve_device
from transformer_mt.errors import ConfigError, TransformerMTError
from transformer_mt.launch import rank_variables, unused_slurm_tasks

log = logging.getLogger(__name__)

GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
OUTSIDE_ADDRESS = "8.8.8.8"  # any address beyond this machine's networks: its route is the default
SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's (first) IPv4 address


@dataclass
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    control: dist.ProcessGroup | None = None  # gloo group for host-side agreements

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of `values` over all ranks (a CPU all-reduce; no GPU sync)."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, group=self.control)
        return tensor.tolist()

    def broadcast(self, values: list[float]) -> list[float]:
        """Rank 0's `values` on every rank."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.broadcast(tensor, src=0, group=self.control)
        return tensor.tolist()

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's CPU `tensor` (same shape on all ranks), in rank order."""
        if not self.distributed:
            return [tensor]
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor, group=self.control)
        return gathered

    def gather_text(self, text: str) -> list[str]:
        """Every rank's `text`, in rank order (UTF-8 bytes over the control group; no pickle)."""
        if not self.distributed:
            return [text]
        encoded = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)
        lengths = [int(n) for n in self.gather(torch.tensor([len(encoded)]))]
        padded = torch.zeros(max(lengths), dtype=torch.uint8)
        padded[: len(encoded)] = encoded
        gathered = self.gather(padded)
        return [
            bytes(t[:n].tolist()).decode("utf-8") for t, n in zip(gathered, lengths, strict=True)
        ]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control)


def start_ranks(
    device_name: str, timeout_minutes: float = 30.0, threads: int = 0
) -> tuple[Ranks, torch.device]:
    """This process's rank and device, the process set up for it (device.prepare_process:
    `threads`, a GPU made the current one, TF32, malloc); joins the process group when launched
    as one of several ranks, by torchrun, Slurm's srun or submitit (launch.py: their variables
    become torchrun's). A collective that waits longer than `timeout_minutes` for another rank
    fails the job."""
    variables, launcher = rank_variables(os.environ)
    os.environ.update(variables)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if unused_slurm_tasks(os.environ):
        log.warning(
            "this Slurm job has SLURM_NTASKS=%s tasks, but this process was not started by srun: "
            "it trains alone; start it with `srun tmt-train ...` for one rank per task",
            os.environ["SLURM_NTASKS"],
        )
    if world_size == 1:
        device = resolve_device(device_name)
        prepare_process(device, threads)
        return Ranks(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if variables and rank == 0:
        log.info(
            "%d ranks from %s; rank 0's store at %s:%s",
            world_size,
            launcher,
            os.environ["MASTER_ADDR"],
            os.environ["MASTER_PORT"],
        )
    device = resolve_device(device_name)
    if device.type == "cuda":
        if device_name not in ("auto", "cuda"):
            raise ConfigError(
                f"trainer.device: with several ranks each uses cuda:LOCAL_RANK; "
                f"use auto or cuda, got {device_name}"
            )
        index = cuda_index(rank, local_rank, torch.cuda.device_count(), launcher)
        device = torch.device("cuda", index)
    prepare_process(device, threads)  # its GPU current before NCCL starts
    backend = "nccl" if device.type == "cuda" else "gloo"
    check_master_address(os.environ, launcher)
    use_gloo_interface(os.environ, log_it=local_rank == 0)
    timeout = datetime.timedelta(minutes=timeout_minutes)
    try:
        dist.init_process_group(backend, timeout=timeout)
    except dist.DistError as error:  # DistStoreError (a timeout), DistNetworkError
        raise TransformerMTError(
            f"rank {rank} of {world_size} did not meet the others at rank 0's store "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} ({launcher}) within "
            f"trainer.rank_timeout_minutes={timeout_minutes:g} ({one_line(error)}): every rank "
            "must start, with the same MASTER_ADDR and MASTER_PORT, and reach rank 0's machine"
        ) from error
    control = (
        dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    )
    return Ranks(rank, world_size, local_rank, control), device


def check_master_address(environ: Mapping[str, str], launcher: str) -> None:
    """Rank 0's address resolves, before any rank waits on it: one that does not (a node name
    from a host list that no name server knows) fails only after torch's retries, in a long
    traceback."""
    master = environ["MASTER_ADDR"]
    try:
        socket.getaddrinfo(master, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        cause = getattr(error, "strerror", None) or str(error)
        raise TransformerMTError(
            f"MASTER_ADDR={master}, rank 0's address ({launcher}; under Slurm the first node of "
            f"SLURM_STEP_NODELIST unless MASTER_ADDR is set), does not resolve ({cause}): every "
            "rank must reach rank 0's machine by this name"
        ) from error


def cuda_index(rank: int, local_rank: int, visible: int, launcher: str) -> int:
    """The GPU of a rank: cuda:LOCAL_RANK among the node's GPUs, or the one GPU a Slurm or
    submitit task sees when each task is given its own (--gpus-per-task=1)."""
    if local_rank < visible:
        return local_rank
    if visible == 1 and launcher != "torchrun":
        return 0
    raise ConfigError(
        f"rank {rank} has no GPU: {launcher} started at least {local_rank + 1} processes on "
        f"this machine, which has {visible} GPU(s) visible to it (make train NPROC={visible}, "
        "torchrun --nproc-per-node, or as many Slurm tasks per node as GPUs)"
    )


def use_gloo_interface(environ: MutableMapping[str, str], *, log_it: bool) -> None:
    """Set GLOO_SOCKET_IFNAME in `environ` to `choose_gloo_interface`'s choice, if it makes one.
    `log_it`: say which and why where it matters (several machines), else only at debug level."""
    if environ.get(GLOO_SOCKET_IFNAME):
        return
    loud = log_it and several_machines(environ)
    choice = choose_gloo_interface(environ)
    if choice is None:
        log.log(
            logging.WARNING if loud else logging.DEBUG,
            "found no network interface towards MASTER_ADDR=%s: gloo binds the address of the "
            "host name; set GLOO_SOCKET_IFNAME if the ranks cannot connect",
            environ.get("MASTER_ADDR"),
        )
        return
    interface, why = choice
    environ[GLOO_SOCKET_IFNAME] = interface
    log.log(
        logging.INFO if loud else logging.DEBUG,
        "gloo: %s=%s, which %s (set it to choose another)",
        GLOO_SOCKET_IFNAME,
        interface,
        why,
    )


def several_machines(environ: Mapping[str, str]) -> bool:
    """Whether the job spans machines, as torchrun tells its ranks (False where not told)."""
    local = environ.get("LOCAL_WORLD_SIZE")
    return local is not None and int(local) < int(environ.get("WORLD_SIZE", "1"))


def choose_gloo_interface(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(interface, why) for gloo's sockets: the one holding this machine's address towards
    MASTER_ADDR (see the module's docstring). None where the user chose (GLOO_SOCKET_IFNAME) or
    no interface is found (no route, an address on no interface)."""
    if environ.get(GLOO_SOCKET_IFNAME):
        return None
    master, port = environ.get("MASTER_ADDR", "127.0.0.1"), int(environ.get("MASTER_PORT", "29500"))
    try:
        address = local_address_towards(master, port)
        why = f"holds {address}, the address this machine reaches MASTER_ADDR={master} from"
        if ipaddress.ip_address(address).is_loopback and several_machines(environ):
            address = local_address_towards(OUTSIDE_ADDRESS, port)
            why = (
                f"holds {address}, the default route's address (MASTER_ADDR={master} is this "
                f"machine through loopback, which other machines cannot reach)"
            )
        interface = interface_holding(address)
    except (OSError, ValueError):  # no route, a name that does not resolve, no /proc
        return None
    return None if interface is None else (interface, why)


def local_address_towards(host: str, port: int) -> str:
    """The source address the routing table gives packets to `host` (a UDP connect sends none)."""
    family, kind, _, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as probe:
        probe.connect(target)
        return probe.getsockname()[0]


def interface_holding(address: str) -> str | None:
    """The name of the network interface that has `address`; None where none has it."""
    parsed = ipaddress.ip_address(address.split("%")[0])
    if parsed.version == 6:  # /proc/net/if_inet6: address (32 hex digits) index ... name
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
        return next((f[-1] for f in map(str.split, lines) if f[0] == parsed.packed.hex()), None)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address
                continue
            if reply[20:24] == parsed.packed:  # struct ifreq: name[16], sockaddr_in (addr at 4)
                return name
    return None


# Padded tokens per micro-batch below which a GPU waits on the host (an estimate from reading,
# not a measurement): an eager micro-batch launches about 1,100 kernels, 11-17 ms of host time,
# while 3,500 tokens are 6-8 ms of an H200's work for the base model; the work grows with the
# tokens and outlasts the launches from about 8,000 on. Compiling launches 3-5x fewer kernels.
LAUNCH_BOUND_TOKENS = 8_000


def small_micro_batch_warning(plan: BatchPlan, device: torch.device) -> str | None:
    """What to say when several GPUs share an update so small that each rank's micro-batch is
    below LAUNCH_BOUND_TOKENS; None otherwise (one rank, a CPU, or large enough)."""
    if plan.world_size == 1 or device.type != "cuda":
        return None
    if plan.micro_batch_tokens >= LAUNCH_BOUND_TOKENS:
        return None
    return (
        f"each of the {plan.world_size} ranks gets micro-batches of "
        f"{plan.micro_batch_tokens:,} padded tokens, below {LAUNCH_BOUND_TOKENS:,}: a GPU then "
        "finishes its kernels faster than the host launches them (launch-bound), and more GPUs "
        "add little speed. Give each GPU more tokens: trainer=scaled (the global batch and the "
        "learning rate grown with the number of GPUs), or a larger trainer.global_batch_tokens "
        "(and trainer.batch_tokens where it caps the micro-batch), or fewer GPUs"
    )


def stop_ranks(ranks: Ranks) -> None:
    if ranks.distributed and dist.is_initialized():
        dist.destroy_process_group()


# ---- a rank that fails ---------------------------------------------------------------------
FAILURE_KEY = "transformer_mt/failure"  # in the rendezvous store: the first failure, as JSON
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # where torchrun reads a worker's error, which it prints
STORE_TIMEOUT = datetime.timedelta(seconds=10)  # a store that answers at all answers at once


class RankFailed(TransformerMTError):
    """This rank stopped because another rank failed first; the message is that rank's cause."""


@dataclass(frozen=True)
class Failure:
    """The first failure of a job: which rank, its one-line cause, when (seconds since 1970)."""

    rank: int
    cause: str
    time: int

    def line(self) -> str:
        return f"rank {self.rank} failed: {self.cause}"


@contextlib.contextmanager
def ending_together(ranks: Ranks) -> Iterator[None]:
    """Around a command's work on every rank; the process group is ended however it ends.

    On an exception in a rank of several, the rank aborts its process groups, so that it never
    waits for the others, and the others' collectives fail within seconds (on gloo, once the
    failing process's connections close) instead of after trainer.rank_timeout_minutes. The
    first rank to fail records its one-line cause in the rendezvous store; a rank whose
    collective broke after that raises RankFailed, whose message starts with that cause (a
    rank's own TransformerMTError, a refusal every rank agreed on, stands). Under torchrun each
    failing rank also writes the cause into its error file, which torchrun prints last, as the
    job's "Root Cause"."""
    try:
        yield
    except BaseException as error:
        if not ranks.distributed or not dist.is_initialized():
            raise
        first = first_failure(ranks.rank, error)
        abort_ranks()
        if first is not None:
            write_error_file(first)
            if first.rank != ranks.rank and not isinstance(error, TransformerMTError):
                raise RankFailed(first.line()) from error
        raise
    finally:
        stop_ranks(ranks)


def first_failure(rank: int, error: BaseException) -> Failure | None:
    """The job's first failure as the rendezvous store holds it, else this rank's `error`
    (recorded there for the others), unless `error` only says that another rank went away (a
    rank killed without a word: no cause is known). Where the store cannot be reached (a job
    launched without torchrun, whose rank 0 held it and has ended; under torchrun its agent
    holds it) each rank says its own."""
    mine = None if broken_collective(error) else Failure(rank, one_line(error), int(time.time()))
    try:
        store = dist.distributed_c10d._get_default_store()  # the rendezvous's (no public API)
        store.set_timeout(STORE_TIMEOUT)
        if store.check([FAILURE_KEY]):
            return Failure(**json.loads(store.get(FAILURE_KEY)))
        if mine is not None:
            store.set(FAILURE_KEY, json.dumps(dataclasses.asdict(mine)))
    except (RuntimeError, ValueError) as unreachable:  # DistNetworkError, DistStoreError
        log.warning("the ranks' store cannot be read (%s): each rank says its own", unreachable)
    return mine


BROKEN = ("Connection closed by peer", "Connection reset by peer")
"""What gloo says when another rank's process has gone (as a RuntimeError through autograd)."""


def broken_collective(error: BaseException) -> bool:
    """Whether `error` only says that a collective broke because another rank went away."""
    return isinstance(error, dist.DistError) or any(text in str(error) for text in BROKEN)


def one_line(error: BaseException) -> str:
    """The error's first line: its message for our errors, else 'Type: message'."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, TransformerMTError):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def abort_ranks() -> None:
    """End this rank's process groups without waiting for the others (NCCL's communicators are
    aborted; gloo's connections close when the process ends)."""
    dist.distributed_c10d._abort_process_group()


def write_error_file(failure: Failure) -> None:
    """The failure in torchrun's error file of this worker (where it is set), in the format that
    torchrun prints as the worker's error: its summary, the job's last lines, names it."""
    path = os.environ.get(ERROR_FILE)
    if not path:
        return
    line = failure.line()
    record = {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(failure.time)}}
    with contextlib.suppress(OSError):  # the job's own error matters more than this file
        Path(path).write_text(json.dumps({"message": record}), encoding="utf-8")
