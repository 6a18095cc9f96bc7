"""Closed loops (HBFlex §6.1, §6.3: concurrent agent tasks): a task issues its next request a think time
after its previous one finishes. Hand-traced schedule, the plain-Python reference on random closed
streams, the loop's invariants, the request layouts (synthetic and a trace's sessions), the think-time
law, the steady window's metrics and the CLI's refusals. The engine's closed loop with HBFlex's parts is
compared with its plain-Python reference in ``tests/test_hbflex_reference.py``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax import clock
from hbfjax.cli import main
from hbfjax.serve import batching, metrics, reference
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.validate import ConfigError
from hbfjax.workload import requests as rq
from hbfjax.workload.requests import Requests


def constant_pass_us(b, draw=0):
    return jnp.float32(100.0) + 0.0 * b.decode_mask.sum()


def mixed_pass_us(b, draw=0):
    """50 µs, 3 µs per chunk token, 7 µs per decode token, 1 µs per 16 context tokens (whole µs)."""
    return (50.0 + 3.0 * (b.chunk_tokens * b.chunk_mask).sum() + 7.0 * b.decode_mask.sum()
            + ((b.decode_context * b.decode_mask) // 16).sum())


@functools.partial(jax.jit, static_argnames=("config", "pass_us"))
def serve(requests, knobs, config, pass_us):
    return batching.rollout(requests, knobs, config, pass_us, 10_000)


def closed_requests(tasks, think_us, prompt, output) -> Requests:
    """A closed stream from host lists (request i of task i mod T; first turns arrive at their think)."""
    r = len(think_us)
    i = jnp.arange(r, dtype=jnp.int32)
    think = jnp.asarray(think_us, jnp.float32)
    arrival = clock.where(i < tasks, clock.advance(clock.zeros((r,)), think), clock.never((r,)))
    a = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    return Requests(arrival=arrival, prompt_tokens=a(prompt), output_tokens=a(output), prefix_tokens=jnp.zeros_like(i),
                    session=i, parent=jnp.full_like(i, -1), root_start=arrival, valid=jnp.ones(r, bool), think_us=think)


def test_two_tasks_on_one_slot_by_hand():
    """2 tasks × 3 turns, 1 slot, 100 µs passes, prompt 4 (one chunk) → 2 tokens: 200 µs a request.
    Thinks [50, 0, 30, 500, 0, 10]: r1 arrives at 0 and runs 0–200 (issues r3 at 700); r0 (arrived 50)
    200–400 (r2 at 430); idle jump to 430, r2 430–630 (r4 at 630); r4 before r3 (630 < 700) 630–830;
    r3 830–1030 (r5 at 1040); idle jump, r5 1040–1240."""
    req = closed_requests(2, [50, 0, 30, 500, 0, 10], [4] * 6, [2] * 6)
    config = BatcherConfig(slots=1, tasks=2)
    knobs = BatcherKnobs.make(chunk_tokens=4, token_budget=8)
    st = serve(req, knobs, config, constant_pass_us)
    arrival, finish = [50, 0, 430, 700, 630, 1040], [400, 200, 630, 1030, 830, 1240]
    np.testing.assert_array_equal(clock.to_us(st.arrival), arrival)
    np.testing.assert_array_equal(clock.to_us(st.finish), finish)
    np.testing.assert_array_equal(clock.to_us(st.first_token), np.asarray(finish) - 100)
    assert not bool(st.overflow) and int(st.admitted) == 6
    ref = reference.simulate([50, 0], [4] * 6, [2] * 6, 4, 8, (2**30, 0), config, pass_us=constant_pass_us,
                             think_us=[50, 0, 30, 500, 0, 10])
    assert (ref.arrival_us, ref.finish_us) == (arrival, finish)


CASES = {  # tasks, turns, slots, mode, KV capacity (tiers), think_s: the first two share a compilation
    "more-tasks-than-slots": (6, 4, 4, "mixed", (2**30, 0), 0.0005),
    "kv-bound": (6, 4, 4, "mixed", (40, 10), 0.0005),  # the same requests: only the KV capacity differs
    "serial-idle": (3, 5, 4, "serial", (2**30, 0), 0.01),  # fewer tasks than slots, long thinks: idle jumps
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    tasks, turns, slots, mode, caps, think_s = CASES[request.param]
    config = rq.RequestsConfig(requests=tasks * turns, arrivals="closed", tasks=tasks, prompt_lengths="uniform",
                               output_lengths="uniform")
    knobs = rq.RequestKnobs.make(prompt=rq.LengthKnobs.make(8, lo=1, hi=20), output=rq.LengthKnobs.make(4, lo=1, hi=9),
                                 think_s=think_s)
    req = rq.generate(jnp.int32(3), jnp.uint32(11), knobs, None, config)
    bc = BatcherConfig(slots=slots, mode=mode, tasks=tasks)
    st = serve(req, BatcherKnobs.make(chunk_tokens=6, token_budget=16, kv_capacity_tokens=caps), bc, mixed_pass_us)
    return req, st, bc, caps, request.param


def test_closed_loop_equals_the_reference(case):
    req, st, bc, caps, name = case
    tasks = bc.tasks
    ref = reference.simulate(clock.to_us(req.arrival)[:tasks].tolist(), np.asarray(req.prompt_tokens),
                             np.asarray(req.output_tokens), 6, 16, caps, bc, pass_us=mixed_pass_us,
                             think_us=np.asarray(req.think_us).tolist())
    assert not ref.overflow and not bool(st.overflow)
    np.testing.assert_array_equal(clock.to_us(st.arrival), ref.arrival_us)
    np.testing.assert_array_equal(clock.to_us(st.first_token), ref.first_token_us)
    np.testing.assert_array_equal(clock.to_us(st.finish), ref.finish_us)
    assert int(st.iterations) == ref.iterations
    # each case exercises what it is named for
    running = max(len(r["decode"]) + len(r["chunks"]) for r in ref.log)
    if name == "kv-bound":  # the KV room binds: the same requests wait longer than with unbounded KV
        free = serve(req, BatcherKnobs.make(chunk_tokens=6, token_budget=16), bc, mixed_pass_us)
        assert (clock.to_us(st.finish) - clock.to_us(st.arrival)).sum() > \
            (clock.to_us(free.finish) - clock.to_us(free.arrival)).sum()
    if name == "more-tasks-than-slots":
        assert running == bc.slots
    if name == "serial-idle":
        ends = [r["start_us"] + r["us"] for r in ref.log]
        assert any(later["start_us"] > end for later, end in zip(ref.log[1:], ends))  # an idle jump


def test_a_task_issues_its_next_request_a_think_after_the_last_one_finishes(case):
    req, st, bc, _, _ = case
    t = bc.tasks
    arrival, finish, think = clock.to_us(st.arrival), clock.to_us(st.finish), np.asarray(req.think_us)
    np.testing.assert_array_equal(arrival[t:], finish[:-t] + think[t:])
    np.testing.assert_array_equal(arrival[:t], think[:t])
    assert np.all(finish > arrival)
    # never more requests in the system than tasks: at each arrival, count those arrived and not finished
    in_system = ((arrival[None, :] <= arrival[:, None]) & (finish[None, :] > arrival[:, None])).sum(axis=1)
    assert in_system.max() <= t
    assert np.asarray(st.tokens_out).tolist() == np.asarray(req.output_tokens).tolist()


def test_synthetic_think_times_are_exponential_with_the_mean_asked():
    """4,096 draws of mean 2 s: the sample mean within 3.5 standard errors (σ = mean for an exponential),
    the first T requests the only ones with an arrival."""
    config = rq.RequestsConfig(requests=4096, arrivals="closed", tasks=64)
    req = rq.generate(jnp.int32(0), jnp.uint32(7), rq.RequestKnobs.make(think_s=2.0), None, config)
    think_s = np.asarray(req.think_us, np.float64) * 1e-6
    assert abs(think_s.mean() - 2.0) < 3.5 * 2.0 / np.sqrt(think_s.size)
    arrival = np.asarray(req.arrival.s)
    assert np.all(arrival[64:] == np.iinfo(np.int32).max) and np.all(arrival[:64] < 60)
    assert np.all(np.asarray(req.parent) == -1)


def test_a_closed_replay_runs_whole_trace_sessions_one_after_another(real_trace):
    from hbfjax import traces

    trace = traces.load_trace(real_trace("swebench_miniswe_agent.csv"))
    inputs = rq.TraceInputs.from_trace(trace)
    tasks, turns = 8, 40
    config = rq.RequestsConfig(requests=tasks * turns, arrivals="trace", replay="closed", tasks=tasks)
    req = jax.jit(rq.generate, static_argnums=4)(jnp.int32(1), jnp.uint32(2), rq.RequestKnobs.make(think_s=0.5),
                                                 inputs, config)
    prompt, parent, session = (np.asarray(x) for x in (req.prompt_tokens, req.parent, req.session))
    prefix, think = np.asarray(req.prefix_tokens), np.asarray(req.think_us)
    rows = np.asarray(inputs.turns)
    sessions = [[int(inputs.prompt_tokens[q]) for q in row if q >= 0] for row in rows]
    gaps = [[float(inputs.gap_us[q]) for q in row if q >= 0] for row in rows]
    starts = 0
    for task in range(tasks):
        mine = np.arange(task, tasks * turns, tasks)
        k = 0
        while k < turns:  # each run of turns is a prefix of one trace session, whole unless cut at the end
            run = [mine[k]]
            while k + len(run) < turns and parent[mine[k + len(run)]] == mine[k + len(run) - 1]:
                run.append(mine[k + len(run)])
            got = prompt[run].tolist()
            match = [s for s, row in enumerate(sessions) if row[:len(got)] == got]
            assert match, (task, k)
            assert k + len(run) == turns or any(len(sessions[s]) == len(got) for s in match)
            assert np.all(session[run] == run[0]) and parent[run[0]] == -1 and prefix[run[0]] == 0
            assert any(np.allclose(think[run[1:]], gaps[s][1:len(got)]) for s in match)
            starts += 1
            k += len(run)
    assert starts > tasks  # tasks went on to new sessions


def test_the_closed_window_is_every_task_past_its_warm_up_and_none_finished():
    """2 tasks × 4 turns: turn-2 arrivals (request 4, 5) at 3 and 5 → t0 = 5; last turns (6, 7) at 8
    and 9 → t1 = 8; measured: arrivals in [5, 8), i.e. requests 5 (at 5) and 6? no: 6 arrives at 8."""
    arrival = np.array([[0, 1, 2, 2.5, 3, 5, 8, 9]])
    finish = arrival + 0.5
    t = metrics.RequestTimes(arrival, arrival + 0.1, finish, np.full((1, 8), 10), np.ones((1, 8), bool))
    inside, t0, t1 = metrics.closed_window(t, 2, 2)
    assert (t0[0], t1[0]) == (5.0, 8.0) and np.flatnonzero(inside[0]).tolist() == [5]
    stream = metrics.per_stream(t, inside, None, (t0, t1))
    # finishing in [5, 8): request 5 (5.5) only: 10 tokens over 3 s
    assert stream["throughput_tokens_per_s"][0] == pytest.approx(10 / 3)
    assert stream["window_requests"][0] == 1
    # the KV room turns over when the finished requests' KV (10 tokens each) reaches it: the 4th finish (3.0 s)
    kv = np.full((1, 8), 10)
    assert metrics.kv_turnover_s(t, kv, np.array([35]))[0] == 3.0
    assert np.isinf(metrics.kv_turnover_s(t, kv, np.array([1000]))[0])
    assert np.isnan(metrics.kv_turnover_s(t, kv, np.array([-1]))[0])
    with pytest.raises(ConfigError, match="1 of 1 streams"):
        metrics.stream_window(metrics.RequestTimes(arrival[:, ::-1].copy(), arrival, finish, t.tokens_out, t.valid),
                              closed=(2, 2))


def test_a_warm_up_in_time_opens_the_window_a_fraction_of_the_way_through_the_full_loop():
    """Task 0 runs turns at 0, 1, 2, 3 and task 1, far behind, at 0.5, 4, 6, 9 (request i = turn · 2 + task):
    in turns, the last task's turn 2 (6) comes after the first task's last turn (3): no window. In time, the
    last task starts at 0.5 and the first ends at 3: f = 0.2 opens the window at 0.5 + 0.2 · 2.5 = 1.0, so
    it holds the requests arriving in [1, 3): task 0's turns 1 and 2 (requests 2 and 4)."""
    arrival = np.array([[0.0, 0.5, 1.0, 4.0, 2.0, 6.0, 3.0, 9.0]])
    finish = arrival + 0.25
    t = metrics.RequestTimes(arrival, arrival + 0.1, finish, np.full((1, 8), 10), np.ones((1, 8), bool))
    with pytest.raises(ConfigError, match="warm-up in time"):
        metrics.stream_window(t, closed=(2, 2))
    inside, t0, t1 = metrics.closed_window(t, 2, 0, 0.2)
    assert (t0[0], t1[0]) == pytest.approx((1.0, 3.0)) and np.flatnonzero(inside[0]).tolist() == [2, 4]
    assert metrics.stream_window(t, closed=metrics.ClosedLoop(2, 0, 0.2))[1][0][0] == pytest.approx(1.0)
    assert metrics.closed_window(t, 2, 0, 0.0)[1][0] == 0.5  # f = 0: from the last task's start
    with pytest.raises(ConfigError, match="warmup_turns"):
        metrics.closed_window(t, 2, 1, 0.2)  # one warm-up rule
    with pytest.raises(ConfigError, match="warmup_fraction"):
        metrics.closed_window(t, 2, 0, 1.0)
    late = metrics.RequestTimes(arrival + np.array([0, 5.0] * 4), arrival, finish, t.tokens_out, t.valid)
    with pytest.raises(ConfigError, match="the last task starts after the first one ends"):
        metrics.stream_window(late, closed=(2, 0, 0.2))  # task 1 starts at 5.5, task 0 ends at 3


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "4", "--rate", "2"], "give one"),
    (["--tasks", "4", "--warmup-fraction", "0.1", "--warmup-turns", "1"], "give one"),
    (["--rate", "2", "--warmup-fraction", "0.1"], "closed loop"),
    (["--turns-per-task", "4"], "closed loop"),
    (["--tasks", "4", "--warmup", "3"], "--warmup-turns"),
    (["--tasks", "4", "--requests", "30"], "--turns-per-task"),
    (["--tasks", "4", "--slots", "5"], "--slots = 5"),
    (["--tasks", "4", "--turns-per-task", "4", "--warmup-turns", "3"], "--warmup-turns = 3"),
    (["--tasks", "4", "--concurrency", "3", "--trace", "x.csv"], "--concurrency"),
])
def test_the_cli_refuses_closed_loop_options_that_do_not_fit(argv, message, capsys):
    assert main(["serve", "--system", "hbflex", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_data_parallel_tasks_are_split_over_the_gpus_and_their_rates_summed():
    """--tasks 12 --data-parallel 4: each stream is one GPU's package serving 3 tasks in 3 slots; the cluster
    rates are 4 × a GPU's, their half-widths too (the GPUs share nothing under a session-affine router)."""
    from hbfjax.cli import build_parser
    from hbfjax.commands import serve

    args = build_parser().parse_args(["serve", "--system", "hbflex", "--tasks", "12", "--data-parallel", "4"])
    sc = serve.scenario(args)
    assert (sc.requests.tasks, sc.slots, sc.requests.requests) == (3, 3, 3 * 16)
    out = serve.assemble({"data_parallel": 4}, {"hbflex": {"throughput_tokens_per_s": 2.5,
                                                           "ci95_throughput_tokens_per_s": 0.5}}, ["hbflex"])
    assert (out["cluster_throughput_tokens_per_s"], out["ci95_cluster_throughput_tokens_per_s"]) == (10.0, 2.0)
