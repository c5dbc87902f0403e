"""Two nodes for real, on one machine: two network namespaces joined by a veth pair (10.77.0.1 and
10.77.0.2), each running torchrun with one CPU rank, where the hostname resolves to 127.0.1.1 as
Debian's /etc/hosts has it (a bind mount in a mount namespace of the test's own). Gloo, left to
itself, binds the address of the hostname, so each rank would tell the other to connect to a
loopback address of its own node; the ranks must find each other through the route to
MASTER_ADDR instead. Also: the choice of gloo's interface without namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent

# Inside node 0's namespaces: the link, the hosts file (which node 1 shares: it gets a network
# namespace of its own, not a mount namespace), node 1 started, its end of the link moved into
# its namespace once it exists, then torchrun on both nodes. Each torchrun is bounded by
# `timeout`, since ranks that cannot connect wait for the process group's timeout.
SCRIPT = r"""
set -u
ip link set lo up
ip link add node0 type veth peer name node1 || exit 11
ip addr add 10.77.0.1/24 dev node0 && ip link set node0 up || exit 12
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" > "$OUT/hosts"
mount --bind "$OUT/hosts" /etc/hosts || exit 13
getent hosts "$(hostname)" > "$OUT/hostname_resolves_to"
run_node() {
    timeout 300 "$BIN/python" -m torch.distributed.run --nnodes=2 --nproc_per_node=1 \
        --node_rank="$1" --master_addr=10.77.0.1 --master_port=29500 \
        --no-python "$BIN/tmt-train" "${@:2}" > "$OUT/node$1.log" 2>&1
    echo $? > "$OUT/node$1.rc"
}
NODE1_UP='touch "$OUT/node1.ready"
until ip link show node1 > /dev/null 2>&1; do sleep 0.1; done
ip link set lo up && ip addr add 10.77.0.2/24 dev node1 && ip link set node1 up || exit 14'
unshare -n bash -c "$NODE1_UP; $(declare -f run_node); run_node 1 \"\$@\"" node1 "$@" &
node1=$!
until test -e "$OUT/node1.ready"; do sleep 0.1; done
ip link set node1 netns "$node1" || exit 15
run_node 0 "$@"
wait "$node1"
"""


def namespace_command() -> list[str] | None:
    """How to run a script in network and mount namespaces of its own where it may create a veth
    pair: as root, or as a user through a user namespace; None where neither works."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    probe = "ip link add probe0 type veth peer name probe1 && mount -t tmpfs -o size=1m tmpfs /mnt"
    for command in (["unshare", "-nm"], ["unshare", "-Urnm"]):
        done = subprocess.run([*command, "sh", "-c", probe], capture_output=True, timeout=30)
        if done.returncode == 0:
            return command
    return None


@pytest.mark.slow
def test_two_nodes_whose_hostname_resolves_to_loopback_train(tmp_path, tiny_overrides):
    command = namespace_command()
    if command is None:
        pytest.skip("needs network and mount namespaces (unshare -nm as root, or -Urnm)")
    out = tmp_path / "out"
    out.mkdir()
    overrides = [
        *tiny_overrides,
        f"run_dir={tmp_path / 'run'}",
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "trainer.max_steps=5",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        "trainer.num_threads=1",
        "trainer.rank_timeout_minutes=1",  # ranks that cannot connect give up within a minute
    ]
    environment = {**os.environ, "OUT": str(out), "BIN": str(BIN)}
    done = subprocess.run(
        [*command, "bash", "-c", SCRIPT, "script", *overrides],
        env=environment,
        capture_output=True,
        text=True,
        timeout=700,
    )
    whole = {path.name: path.read_text() for path in sorted(out.glob("node*"))}
    logs = {name: text[-3000:] for name, text in whole.items()}  # for the failure messages
    assert done.returncode == 0, (done.stdout, done.stderr, logs)
    assert (out / "hostname_resolves_to").read_text().split()[0] == "127.0.1.1"
    for node in (0, 1):
        assert (out / f"node{node}.rc").read_text().strip() == "0", logs
        # Each node says which interface it chose for gloo and why.
        lines = whole[f"node{node}.log"].splitlines()  # c10d's retries can push it far up
        chosen = [line for line in lines if "GLOO_SOCKET_IFNAME=" in line]
        assert len(chosen) == 1 and f"GLOO_SOCKET_IFNAME=node{node}," in chosen[0], logs
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 5 and state["progress"]["layout"][0] == 2


def default_route_interface() -> str | None:
    """The interface of this machine's route to an address outside its networks, from `ip`."""
    if shutil.which("ip") is None:
        return None
    route = subprocess.run(["ip", "-4", "route", "get", "8.8.8.8"], capture_output=True, text=True)
    words = route.stdout.split()
    return words[words.index("dev") + 1] if "dev" in words else None


def test_gloo_follows_the_route_to_master_addr_unless_the_user_chose():
    from transformer_mt.train.distributed import GLOO_SOCKET_IFNAME, choose_gloo_interface

    one_node = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2"}
    assert choose_gloo_interface(one_node)[0] == "lo"
    assert choose_gloo_interface({**one_node, "MASTER_ADDR": "localhost"})[0] == "lo"
    assert choose_gloo_interface({**one_node, GLOO_SOCKET_IFNAME: "eth7"}) is None
    # Several machines and a MASTER_ADDR that is this one through loopback (torchrun's c10d
    # rendezvous passes node 0's host name): loopback cannot be right, the default route may be.
    several = {**one_node, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    if (expected := default_route_interface()) is None:
        pytest.skip("this machine has no default route")
    assert choose_gloo_interface(several)[0] == expected
