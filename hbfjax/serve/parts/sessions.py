"""The ``sessions`` part: KV retained after a request ends, reused by its session's later turns, evicted
least recently used (HBFlex §3.1, §4.2, §5.2, §5.4; ``hbfjax.serve.kv_cache``).

At each boundary a finished request's whole KV becomes its session's entry (``kv_cache.retain``; its
HBM-resident part, ``Admission.retired_hbm_tokens`` of the tiers part, moves to HBF and is counted in
``retention_write_bytes``), and an admitted request whose prefix that entry holds reuses it
(``kv_cache.take``). A turn admitted while an earlier turn of its session still runs shares that
turn's KV so far (its prefix pages are in HBF already, HBFlex §5.2: shared prefixes; the open-loop
replay lets a turn arrive before its parent has finished, which a closed-loop agent would not do).
Reuse is in whole logical pages (HBFlex §3.1, Fig. 7b: ``policy.logical_page_tokens``). Once a chunk,
whole sessions are evicted, least recently used first, while running plus retained KV exceeds
``policy.evict_threshold`` of the HBF KV room (``Chunk.evicted``: their pages die in the blocks part).
A request that takes its session's entry keeps of it only what it reuses (``Admission.kept_tokens``):
the entry's tail past the reused pages, where the new turn diverges, dies in the blocks part (on
SWE-bench agents these tails are 49 % of the KV tokens the turns write: a turn's next prompt rarely
repeats its output verbatim).

H3 (``policy.hbf_request_kv`` = 0: request KV lives in HBM only, HBFlex §2.3) retains nothing: a
finished request's KV is dropped with its HBM (nothing moves to HBF), so a later turn recomputes its
whole prompt; the paper's admission constraint (running KV within the 36 GB of HBM) is the tiers part's.

Knobs read: ``policy.logical_page_tokens``, ``policy.evict_threshold``, ``policy.hbf_request_kv`` and the
room (``RunView``).
"""

from __future__ import annotations

import numpy as np
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.serve import kv_cache
from hbfjax.serve.part import Part, RunView


class SessionsState(NamedTuple):
    cache: kv_cache.SessionCache
    running_kv_tokens: jax.Array  # int32[] whole KV (prompt + output) of the requests in slots at the boundary


class SessionTotals(NamedTuple):
    """Per-run sums of the sessions part (float32[] each)."""

    retention_write_bytes: jax.Array  # HBM-resident KV moved to HBF when its request is retained
    shared_hit_tokens: jax.Array  # prompt tokens reused from a running turn of the same session (before page rounding)
    hit_tokens: jax.Array  # prompt tokens reused in all (whole logical pages), not prefilled


def shared_with_running_turns(slots, new, reqs, reused) -> jax.Array:
    """int32[B] prompt tokens a new request takes from a running turn of its session (beyond ``reused``):
    its reusable prefix, at most that turn's KV so far and its prompt − 1."""
    req = jnp.maximum(slots.request, 0)
    sess = jnp.where(slots.request >= 0, reqs.session[req], -1)
    same = (sess[:, None] == sess[None, :]) & (sess[:, None] >= 0) & ~new[None, :]  # [b, j]: j runs b's session
    running = jnp.where(same, slots.kv_tokens[None, :], 0).max(axis=1)
    shared = jnp.where(new, jnp.minimum(jnp.minimum(reqs.prefix_tokens[req], running), reqs.prompt_tokens[req] - 1), 0)
    return jnp.maximum(shared - reused, 0)


def part(knobs, config, run: RunView) -> Part:
    reqs, policy = run.requests, knobs.policy
    per_token = float(config.model.kv_bytes_per_token)
    tokens_per_page = jnp.maximum(policy.logical_page_tokens, 1.0).astype(jnp.int32)

    def init():
        return SessionsState(cache=kv_cache.init(config.requests.requests), running_kv_tokens=jnp.int32(0))

    retains = policy.hbf_request_kv > 0.5  # H3 keeps request KV out of HBF: nothing retained

    def admit(s: SessionsState, view, record):
        st = view.state
        idx = jnp.maximum(view.finished_request, 0)
        finished = view.finished & retains
        context = jnp.where(finished, reqs.prompt_tokens[idx] + reqs.output_tokens[idx], 0)
        cache = kv_cache.retain(s.cache, reqs.session[idx], finished, context, st.now)
        reused, held, cache = kv_cache.take(cache, st.slots.request, view.new, reqs)
        shared = jnp.where(retains, shared_with_running_turns(st.slots, view.new, reqs, reused), 0)
        reused = (reused + shared) // tokens_per_page * tokens_per_page
        # the entry's KV past the (page-rounded) reuse diverges from the new turn: it dies (blocks part)
        record = record._replace(kept_tokens=jnp.where(held > 0, jnp.minimum(reused, held), -1))
        record = record._replace(retired_hbm_tokens=jnp.where(retains, record.retired_hbm_tokens, 0))
        add = SessionTotals(retention_write_bytes=record.retired_hbm_tokens.sum().astype(jnp.float32) * per_token,
                            shared_hit_tokens=shared.sum().astype(jnp.float32),
                            hit_tokens=reused.sum().astype(jnp.float32))
        state = SessionsState(cache=cache, running_kv_tokens=kv_cache.running_kv_tokens(st.slots.request, reqs))
        return state, record._replace(reused=reused), add

    def every_chunk(s: SessionsState, record):
        cache, evicted = kv_cache.evict(s.cache, s.running_kv_tokens, run.room_tokens, policy.evict_threshold)
        return s._replace(cache=cache), record._replace(evicted=record.evicted | evicted)

    return Part(init=init, admit=admit, every_chunk=every_chunk, finish=lambda s: (s.cache, jnp.bool_(False)),
                totals=SessionTotals)


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream: the share of admitted prompt tokens served from retained KV,
    sessions evicted, and KV moved from HBM to HBF at retention."""
    cache, t = own.final, own.totals
    prompt = kv_cache.tally_value(cache.prompt_tokens).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit = np.where(prompt > 0, np.asarray(t.hit_tokens, np.float64) / prompt, np.nan)
    return {"prefix_hit_tokens_fraction": hit, "evicted_sessions": np.asarray(cache.evicted, np.float64),
            "retention_write_gb": np.asarray(t.retention_write_bytes, np.float64) * 1e-9}
