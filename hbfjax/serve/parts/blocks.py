"""The ``blocks`` part: the HBF KV of each session in erase blocks, invalidated by eviction and reclaimed by
GC (HBFlex §3.3, §5.4; ``hbfjax.serve.kv_blocks``).

The KV bytes each session puts in HBF — per pass (``Writes.hbf_new_tokens`` of the tiers part) and when
a finished request's HBM-resident KV is retained (``Admission.retired_hbm_tokens``) — accumulate per
session and are appended once a chunk to a scaled block store (pages owned by the session, classed by
its root's lifetime label when ``policy.lifetime_aware``); the sessions the sessions part evicted
(``Chunk.evicted``) go stale; GC above ``policy.gc_trigger`` migrates valid pages of greedy victims,
and the migration's programs and reads (bytes over the program bandwidth, then over the HBF read cut)
are exposed in the next iteration (``Chunk.exposed_us``: not overlapped with compute).

Knobs read: ``policy.lifetime_aware``, ``policy.gc_trigger``, ``label_interval_us``, the room
(``RunView``: one scaled page stands for the room's share), ``org`` (program bandwidth, read cut).
"""

from __future__ import annotations

import numpy as np
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax import clock
from hbfjax.clock import Clock
from hbfjax.memory import delivery
from hbfjax.serve import kv_blocks
from hbfjax.serve.part import Part, RunView
from hbfjax.validate import require_int


@dataclass(frozen=True)
class BlocksConfig:
    """Static shape of the scaled block store: blocks × pages stand for the HBF KV room."""

    blocks: int = 1024
    pages_per_block: int = 32
    n_labels: int = 8
    block_writes_per_chunk: int = 1024  # scaled pages a chunk appends at most (the rest waits, kept per session)
    gc_rounds: int = 8  # GC rounds of kv_blocks.victims_per_gc victims each, once per scan chunk

    def __post_init__(self):
        c = type(self).__name__
        for name in ("blocks", "pages_per_block", "n_labels", "block_writes_per_chunk", "gc_rounds"):
            require_int(c, name, getattr(self, name), 1)

    def store(self, sessions: int) -> kv_blocks.KvBlocksConfig:
        """The block store of a stream of ``sessions`` requests: a chunk's KV appended at once, then GC."""
        return kv_blocks.KvBlocksConfig(n_blocks=self.blocks, pages_per_block=self.pages_per_block, sessions=sessions,
                                        n_labels=self.n_labels, max_writes=self.block_writes_per_chunk,
                                        gc_rounds=self.gc_rounds, collect_every=1)


class BlocksState(NamedTuple):
    blocks: kv_blocks.KvBlocks
    new_bytes: jax.Array  # float32[R] KV bytes each session put in HBF since the last chunk
    root_start: Clock  # Clock[R] each session root's arrival, the lifetime label's time (a closed loop
    #   records it as the root is admitted: its arrival is issued by the loop, not known ahead)


def store_knobs(knobs, room_tokens, model, bc: kv_blocks.KvBlocksConfig) -> kv_blocks.KvBlocksKnobs:
    """The block store's knobs: the policy's lifetime packing and GC trigger (GC reclaims back to just
    below it, ``KvBlocksKnobs.make``'s default), one scaled page standing for the KV room's share."""
    room_bytes = room_tokens.astype(jnp.float32) * float(model.kv_bytes_per_token)
    return kv_blocks.KvBlocksKnobs(
        lifetime_aware=knobs.policy.lifetime_aware, label_interval_us=knobs.label_interval_us,
        gc_trigger=knobs.policy.gc_trigger, gc_target=knobs.policy.gc_trigger,
        bytes_per_page=room_bytes / bc.physical_pages)


def _add_bytes(per_session, session, tokens, per_token: float):
    """float32[R] ``per_session`` plus each slot's ``tokens`` of KV at its session."""
    return per_session.at[session].add(jnp.asarray(tokens * per_token, jnp.float32))


def part(knobs, config, run: RunView) -> Part:
    org, model, reqs = knobs.org, config.model, run.requests
    sessions = config.requests.requests
    bc = config.blocks.store(sessions)
    bk = store_knobs(knobs, run.room_tokens, model, bc)
    per_token = float(model.kv_bytes_per_token)
    closed = config.batcher.tasks > 0
    # a migrated byte is read over the HBF read cut and programmed at the program bandwidth (µs per kB)
    per_gb_s = (1.0 / jnp.maximum(org.hbf_stacks * org.hbf_write_gbps, 1e-9)
                + 1.0 / jnp.maximum(delivery.read_cuts(org).hbf_gbps, 1e-9))

    def init():
        return BlocksState(blocks=kv_blocks.init(bc), new_bytes=jnp.zeros(sessions, jnp.float32),
                           root_start=reqs.root_start)

    def admit(s: BlocksState, view, record):
        session = reqs.session[jnp.maximum(view.finished_request, 0)]
        s = s._replace(new_bytes=_add_bytes(s.new_bytes, session, record.retired_hbm_tokens, per_token))
        if closed:
            req = jnp.maximum(view.state.slots.request, 0)
            root = view.new & (reqs.session[req] == req)
            at = clock.take(view.state.arrival, req)
            index = jnp.where(root, req, sessions)
            s = s._replace(root_start=clock.Clock(s.root_start.s.at[index].set(at.s, mode="drop"),
                                                  s.root_start.us.at[index].set(at.us, mode="drop")))
        return s, record, None

    def writes(s: BlocksState, view, reads, times, record):
        session = reqs.session[jnp.maximum(view.request, 0)]
        return s._replace(new_bytes=_add_bytes(s.new_bytes, session, record.hbf_new_tokens, per_token)), record, None

    def every_chunk(s: BlocksState, record):
        ids = jnp.arange(sessions, dtype=jnp.int32)
        blocks, _ = kv_blocks.write(s.blocks, ids, s.new_bytes, s.root_start, bk, bc)
        blocks = kv_blocks.invalidate(blocks, record.evicted, bc)
        blocks, moved = kv_blocks.collect(run.words, blocks, bk, bc)
        gc_us = moved.astype(jnp.float32) * bk.bytes_per_page * 1e-3 * per_gb_s
        return (s._replace(blocks=blocks, new_bytes=jnp.zeros_like(s.new_bytes)),
                record._replace(exposed_us=record.exposed_us + gc_us))

    return Part(init=init, admit=admit, writes=writes, every_chunk=every_chunk,
                finish=lambda s: (s.blocks, s.blocks.overflow))


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream: the block store's write amplification (HBFlex §5.4, Fig. 19;
    NaN for a stream that wrote no page: WAF is measured from host writes) with its host page writes
    (scaled pages), and the GC migrations' exposed time per iteration."""
    b = own.final
    host = np.asarray(b.host_pages, np.float64)
    gc_pages = np.asarray(b.gc_pages, np.float64)
    iterations = np.maximum(np.asarray(out.iterations, np.float64), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        waf = np.where(host > 0, (host + gc_pages) / host, np.nan)
    return {"waf": waf, "host_writes": host,
            "gc_ms_per_iteration": np.asarray(out.totals.chunk_stall_us, np.float64) * 1e-3 / iterations}
