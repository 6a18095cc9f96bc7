"""One job as several processes (one per host) with ``jax.distributed`` (DESIGN.md §6 "Scale-out").

Each process computes its :func:`share` of the work items; process 0 (the leader) receives every
process's results with :func:`gather` and writes the output; :func:`broadcast` sends the leader's
values (e.g. the rows a resumed run already has) to everyone. With one process every function is a
cheap local no-op: no ``jax.distributed``, no collectives.

Launching on a cluster: run the same command line once per host (one process per host, which then
uses all of that host's devices) and let only process 0 write the output file.

* Under SLURM or Open MPI, ``jax.distributed`` reads the job's settings itself::

      srun --nodes=4 --ntasks-per-node=1 hbfjax sweep ... --coordinator auto

  (on GPUs JAX then gives each process only one device, its local rank's; with one process per
  host set ``JAX_LOCAL_DEVICE_IDS=0,1,...`` to use them all).
* Anywhere else give the coordinator (process 0's host and a free port) and each process's rank::

      hbfjax sweep ... --coordinator host0:1234 --num-processes 4 --process-id $RANK

  or set ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` instead.

Values travel as JSON text through JAX's public array collectives
(``jax.experimental.multihost_utils``; gloo on CPU): the byte lengths first, then the bytes padded
to a power of two, so rounds of different sizes reuse a handful of compilations. The lengths'
collective always has the same shape, so processes that arrive at different times (uneven work)
wait in one that :func:`connect` already set up.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys


from hbfjax.validate import ConfigError, number, require, require_int

# NumPy and JAX are imported inside the functions that use them: the CLI builds its parsers (with the
# cluster options) without them, so that --help answers at once

ENV = {"coordinator": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
       "process_id": "JAX_PROCESS_ID"}
AUTO = "auto"
NEEDS_COORDINATOR = "several processes need --coordinator HOST:PORT (or auto under SLURM / Open MPI)"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """This process's place in the job: ``process_id`` in 0 … ``process_count`` − 1."""

    process_id: int
    process_count: int
    coordinator: str | None  # "host:port", "auto", or None for one process

    def __post_init__(self):
        count = require_int("Cluster", "process_count", self.process_count, 1)
        require_int("Cluster", "process_id", self.process_id, 0, count - 1)
        require(self.coordinator is not None or count == 1, "Cluster", "coordinator", self.coordinator,
                NEEDS_COORDINATOR)

    @property
    def is_leader(self) -> bool:
        return self.process_id == 0


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """--coordinator, --num-processes, --process-id (group "many hosts"), defaults from the environment."""
    g = parser.add_argument_group(
        "many hosts", "run one job as several processes, one per host, each with the same command line; "
        "process 0 writes the output. Under SLURM / Open MPI, --coordinator auto lets jax.distributed "
        "read the job's process count and ids itself.")
    g.add_argument("--coordinator", metavar="HOST:PORT", default=None,
                   help=f"process 0's host and a free port, or auto (default: ${ENV['coordinator']}; "
                        "none: one process)")
    g.add_argument("--num-processes", metavar="N", type=number(int, 1), default=None,
                   help=f"processes in the job (default: ${ENV['num_processes']}, else 1)")
    g.add_argument("--process-id", metavar="I", type=number(int, 0), default=None,
                   help=f"this process's rank in 0 … N-1 (default: ${ENV['process_id']})")


def _setting(args, dest: str):
    """``(label, value)``: the option if given, else its environment variable, else ``(option, None)``."""
    option = "--" + dest.replace("_", "-")
    value = getattr(args, dest, None)
    if value is not None:
        return option, value
    text = os.environ.get(ENV[dest], "").strip()
    if not text:
        return option, None
    if dest == "coordinator":
        return ENV[dest], text
    try:
        value = int(text)
    except ValueError:
        value = text
    return ENV[dest], require_int("", ENV[dest], value, 0 if dest == "process_id" else 1)


def _check_address(label: str, address: str) -> None:
    host, _, port = address.rpartition(":")
    ok = bool(host) and port.isdigit() and 1 <= int(port) <= 65535
    require(ok, "", label, address, "must be HOST:PORT with a port in [1, 65535], or auto")


def connect(args) -> Cluster:
    """Join the job ``args`` (from :func:`add_cluster_args`) describes and return this process's place.

    One process, ``Cluster(0, 1, None)``, unless a coordinator is given with more than one process
    (or ``auto``); then ``jax.distributed.initialize``. Call it before any JAX computation:
    ``jax.distributed`` refuses (``RuntimeError``) once the backend is up. Inconsistent settings are
    a ``ConfigError`` naming the option (or environment variable) and the rule.
    """
    coord_label, coordinator = _setting(args, "coordinator")
    count_label, count = _setting(args, "num_processes")
    id_label, process_id = _setting(args, "process_id")
    if coordinator is None:
        require(count in (None, 1), "", count_label, count, NEEDS_COORDINATOR)
        require(process_id in (None, 0), "", id_label, process_id,
                "a process id other than 0 needs --coordinator and --num-processes")
        return Cluster(0, 1, None)
    if coordinator != AUTO:
        _check_address(coord_label, coordinator)
        require(count is not None, "", coord_label, coordinator, "needs --num-processes N")
        require(process_id is not None or count == 1, "", coord_label, coordinator, "needs --process-id I")
    if count is not None and process_id is not None:
        require(process_id < count, "", id_label, process_id,
                f"must be in [0, {count - 1}] ({count_label} = {count})")
    if count == 1:  # nothing to coordinate: the coordinator is not contacted
        return Cluster(0, 1, None)
    return _initialize(coord_label, coordinator, count, process_id)


def _initialize(label: str, coordinator: str, count: int | None, process_id: int | None) -> Cluster:
    import jax

    if coordinator == AUTO:
        try:
            jax.distributed.initialize(num_processes=count, process_id=process_id)
        except ValueError as err:  # jax.distributed found no SLURM / Open MPI job to read settings from
            raise ConfigError(f"{label} = 'auto': {err} No SLURM or Open MPI job detected; give "
                              "--coordinator HOST:PORT, --num-processes N and --process-id I") from None
    else:
        jax.distributed.initialize(coordinator, count, process_id, cluster_detection_method="deactivate")
    joined = Cluster(jax.process_index(), jax.process_count(), coordinator)  # starts the backend: a rendezvous
    # Gloo connects the processes at their first collective and gives up if they arrive more than 30 s
    # apart (measured, JAX 0.10.2); connect them now, while they are in step, not after uneven work.
    broadcast(joined, None)
    gather(joined, None)
    return joined


def share(cluster: Cluster, n_items: int) -> list[int]:
    """The work items (of 0 … ``n_items`` − 1) this process computes: item i goes to process i % count."""
    n_items = require_int("share", "n_items", n_items, 0)
    return list(range(cluster.process_id, n_items, cluster.process_count))


def _encode(value) -> np.ndarray:
    """uint8[L]: ``value`` as compact JSON text."""
    import numpy as np
    return np.frombuffer(json.dumps(value, separators=(",", ":")).encode(), np.uint8)


def _decode(data: np.ndarray):
    return json.loads(data.tobytes().decode())


def _padded(data: np.ndarray, size: int) -> np.ndarray:
    """uint8[B]: ``data`` then zeros, B the power of two ≥ max(``size``, 1) (few distinct shapes to compile)."""
    import numpy as np
    out = np.zeros(1 << max(int(size) - 1, 0).bit_length(), np.uint8)
    out[:data.size] = data
    return out


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send file descriptor 1 to stderr for the block: gloo prints "[Gloo] Rank 0 is connected to 1
    peer ranks ..." on stdout whenever a collective connects, and stdout is the command's output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _broadcast_array(data: np.ndarray) -> np.ndarray:
    import numpy as np
    from jax.experimental import multihost_utils

    with _stdout_to_stderr():
        return np.asarray(multihost_utils.broadcast_one_to_all(data))


def _allgather_array(data: np.ndarray) -> np.ndarray:
    """[P, *data.shape]: every process's ``data`` (same shape everywhere), in process order."""
    import numpy as np
    from jax.experimental import multihost_utils

    with _stdout_to_stderr():
        return np.asarray(multihost_utils.process_allgather(data))


def broadcast(cluster: Cluster, value):
    """Process 0's JSON-able ``value`` on every process (the others' ``value`` is ignored).

    Collective: every process calls it, the same number of times. Values round-trip through JSON
    with one process too, so a value that would not survive several processes fails on one.
    """
    import numpy as np
    data = _encode(value) if cluster.is_leader else np.zeros(0, np.uint8)
    if cluster.process_count == 1:
        return _decode(data)
    size = int(_broadcast_array(np.array([data.size], np.int32))[0])
    return _decode(_broadcast_array(_padded(data, size))[:size])


def gather(cluster: Cluster, value) -> list | None:
    """Every process's JSON-able ``value`` (sizes may differ), in process order, on the leader; None
    elsewhere. Collective: every process calls it, the same number of times."""
    import numpy as np
    data = _encode(value)
    if cluster.process_count == 1:
        return [_decode(data)]
    sizes = _allgather_array(np.array([data.size], np.int32))[:, 0]  # int32[P] bytes per process
    rows = _allgather_array(_padded(data, sizes.max()))  # uint8[P, B]
    if not cluster.is_leader:
        return None
    return [_decode(row[:size]) for row, size in zip(rows, sizes)]


def close(cluster: Cluster) -> None:
    """Wait for every process, then leave the job (``jax.distributed.shutdown``); nothing for one process."""
    if cluster.process_count == 1:
        return
    import jax

    gather(cluster, None)  # the barrier: collectives connect() compiled and connected already
    jax.distributed.shutdown()
