"""KV residency by hand (hbfjax.serve.kv_tiers): capacities from the organisation and the model, new tokens
placed by kind, oldest-first writeback in page-wave units, read shares."""

import jax.numpy as jnp
import numpy as np

from hbfjax.memory import organisations as orgs
from hbfjax.serve import kv_tiers
from hbfjax.workload import models
from hbfjax.workload.timing import Batch


def test_dash_capacity_for_llama4_maverick_by_hand():
    m = models.preset("llama4-maverick")
    cap = kv_tiers.capacity_tokens(orgs.dash(), m)
    per_token = 48 * 8 * 128 * 2 * 2  # layers × KV heads × head dim × (K, V) × bf16
    assert m.kv_bytes_per_token == per_token == 196_608
    hbm_left = 2 * 24e9 - m.non_expert_weight_bytes  # the replicated dense weights sit in HBM too
    hbf_left = 2 * 511_101_108_224 - m.weight_bytes  # experts and the dense copy in HBF
    assert int(cap.hbm_budget_tokens) == int(np.floor(np.float32(hbm_left) / per_token))
    assert abs(int(cap.hbf_tokens) - hbf_left / per_token) <= 1 + hbf_left * 1e-7 / per_token
    assert int(cap.writeback_unit_tokens) == 16 * 2**20 // per_token == 85  # one 16 MiB page wave
    stated = kv_tiers.capacity_tokens(orgs.dash(), m, 24.46e9)  # DASH §VI-F's stated budget, passed in
    assert int(stated.hbm_budget_tokens) == int(np.float32(24.46e9) // per_token)


def _batch(decode, chunk, prefix=(0, 0, 0)):
    d = np.asarray(decode, bool)
    c = np.asarray(chunk, np.int32)
    return Batch(decode_context=jnp.zeros(3, jnp.int32), decode_mask=jnp.asarray(d), chunk_tokens=jnp.asarray(c),
                 chunk_prefix=jnp.asarray(prefix, jnp.int32), chunk_mask=jnp.asarray(c > 0),
                 chunk_emits=jnp.zeros(3, bool))


def test_new_tokens_follow_the_placement_and_writeback_takes_the_oldest_first():
    org = orgs.dash()
    cap = kv_tiers.Capacity(hbm_budget_tokens=jnp.int32(5), hbf_tokens=jnp.int32(10**6),
                            writeback_unit_tokens=jnp.int32(2))
    # slots hold requests 7, 3, 5 with 4, 2, 0 HBM tokens; request 5 is prefilling a 6-token chunk
    kv = kv_tiers.KvTiers(request=jnp.asarray([7, 3, 5], jnp.int32), hbm_tokens=jnp.asarray([4, 2, 0], jnp.int32))
    kv_tokens = jnp.asarray([10, 6, 0], jnp.int32)
    new, moves = kv_tiers.book(kv, kv_tokens, _batch([1, 1, 0], [0, 0, 6]), org, cap)
    # decode tokens to HBM: 5 + 3 = 8 > 5, excess 3 → two units of 2 = 4 tokens written back, request 3 first
    assert int(moves.to_hbm_tokens) == 2 and int(moves.to_hbf_tokens) == 6 and int(moves.writeback_tokens) == 4
    assert np.asarray(new.hbm_tokens).tolist() == [4, 0, 0]
    assert int(moves.hbm_tokens) == 4 and int(moves.hbf_tokens) == (11 + 7 + 6) - 4
    # a placement that keeps prefill KV in HBM sends the chunk there instead
    place = orgs.dash_placement()
    place[orgs.PREFILL_KV] = (1.0, 0.0, 0.0)
    _, moves = kv_tiers.book(kv, kv_tokens, _batch([0, 0, 0], [0, 0, 6]), orgs.dash(place=place), cap)
    assert int(moves.to_hbm_tokens) == 6 and int(moves.to_hbf_tokens) == 0
    assert int(moves.writeback_tokens) == 8  # 12 − 5 = 7 → 4 units of 2; oldest first: request 3 (2), then 5 (6)
    # a slot whose request changed starts empty; read shares weight each request by its KV
    synced = kv_tiers.sync(kv, jnp.asarray([7, 9, 5], jnp.int32))
    assert np.asarray(synced.hbm_tokens).tolist() == [4, 0, 0]
    decode, prefill = kv_tiers.read_shares(kv, kv_tokens, _batch([1, 1, 0], [0, 0, 6]))
    assert abs(float(decode) - 6 / 16) < 1e-7 and float(prefill) == 0.0
