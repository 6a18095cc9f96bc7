"""One process of the two-process job in ``tests/test_cluster.py``; prints one JSON line on stdout.

``python tests/_cluster_child.py job N_ITEMS [cluster options]`` computes ``item_value`` for its
share of the items, broadcasts process 0's settings, then gathers three rounds of different sizes
per process. ``python tests/_cluster_child.py late`` checks that connecting after a JAX
computation is refused; ``python tests/_cluster_child.py auto`` checks ``--coordinator auto``
outside SLURM / Open MPI.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from hbfjax import cluster
from hbfjax.validate import ConfigError



LAUNCHER_ENV = ("JAX_", "SLURM_", "OMPI_", "PMIX_", "PMI_", "KUBERNETES_")


def child_env(**extra: str) -> dict[str, str]:
    """The parent's environment without launcher or proxy settings, importing this checkout's hbfjax."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_ENV) and not k.lower().endswith("_proxy")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", ""))
    env.update(extra)
    return env

def item_value(i: int) -> int:
    """The tiny deterministic JAX result for work item ``i``: Σ_{k<i+3} k²."""
    import jax.numpy as jnp

    return int(jnp.sum(jnp.arange(i + 3) ** 2))


def job(c: cluster.Cluster, n_items: int) -> dict:
    """Everything one process of the job sees: the broadcast value, and on the leader the gathers."""
    sent = cluster.broadcast(c, {"from": c.process_id, "done": [[1, "a"], [2, "b"]]})
    mine = [[i, item_value(i)] for i in cluster.share(c, n_items)]
    rounds = [cluster.gather(c, mine),
              cluster.gather(c, "x" * (300 if c.process_id == 1 else 1)),  # sizes 3 and 302 bytes
              cluster.gather(c, {"process": c.process_id, "empty": []})]
    return {"process_id": c.process_id, "process_count": c.process_count, "broadcast": sent,
            "rounds": rounds}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refusal(argv: list[str]) -> str:
    """The error ``connect`` raises for ``argv`` (cluster options), as ``Type: message``."""
    parser = argparse.ArgumentParser()
    cluster.add_cluster_args(parser)
    try:
        cluster.connect(parser.parse_args(argv))
    except (ConfigError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    return "connected"


def main(argv: list[str]) -> dict:
    mode = argv[0]
    if mode == "auto":
        return {"error": refusal(["--coordinator", "auto", "--num-processes", "2"])}
    if mode == "late":
        item_value(0)  # the backend is up now
        return {"error": refusal(["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "2",
                                  "--process-id", "1"])}
    parser = argparse.ArgumentParser()
    parser.add_argument("n_items", type=int)
    cluster.add_cluster_args(parser)
    args = parser.parse_args(argv[1:])
    c = cluster.connect(args)
    out = job(c, args.n_items)
    cluster.close(c)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
