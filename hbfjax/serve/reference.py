"""Plain-Python reference of the batcher (one stream, loops): the correctness oracle of
:mod:`hbfjax.serve.batching` and its speed baseline (DESIGN.md §5 "A plain-Python reference").

The same schedule, written as the prose of :mod:`hbfjax.serve.batching` reads: walk the queue in
arrival order, walk the slots, walk the prefilling requests by request index. Time is whole µs in
Python ints, so the iteration-time function must return whole µs for the two to agree exactly (the
JAX clock is exact for whole µs). The iteration-time function is called on a ``Batch`` of NumPy
arrays shaped as the JAX one (``[B_max]``, masked), so one callable serves both.

:func:`serve` adds the composed serving step of :mod:`hbfjax.serve.engine` on a DASH organisation
(``ServeConfig.parts = ("tiers",)``, :class:`ServeStep`):
per pass the roofline of every operator, its weights and KV read from HBM and HBF over the link
network's max flows, the routed experts' Direct/Relay split found by trying every k, where each
request's KV lives and the page-wave writeback, and the KV writes' exposed stalls, in float µs; the
clock is then float64 µs (``tests/test_serve_reference.py`` derives the float32 tolerance).
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hbfjax.serve.state import BatcherConfig, Phase
from hbfjax.validate import require, require_choice
from hbfjax.workload import gpus
from hbfjax.workload.timing import Batch

NEVER = None  # a time not reached


@dataclass
class _Slot:
    request: int = -1
    phase: int = Phase.EMPTY
    prefill_left: int = 0
    decode_left: int = 0
    kv_tokens: int = 0
    reserved: list = field(default_factory=list)
    new: bool = False  # admitted at this boundary (for the ``admit`` hook)


@dataclass
class Result:
    """One stream served: per-request times (whole µs; None if not reached) and an iteration log."""

    first_token_us: list
    finish_us: list
    tokens_out: list
    iterations: int
    overflow: bool
    log: list  # per iteration: dict(start_us, decode: [request], chunks: {request: tokens}, us)
    arrival_us: list = None  # each request's arrival (a closed loop issues them; None: never issued)


def _batch(slots: list, decode: list, chunks: dict) -> Batch:
    """The iteration's Batch (NumPy, slot order, masked) for the iteration-time function."""
    b = len(slots)
    ctx, dmask = np.zeros(b, np.int32), np.zeros(b, bool)
    tok, pre, cmask, emits = np.zeros(b, np.int32), np.zeros(b, np.int32), np.zeros(b, bool), np.zeros(b, bool)
    for i, sl in enumerate(slots):
        if sl.request in decode:
            ctx[i], dmask[i] = sl.kv_tokens + 1, True
        if sl.request in chunks:
            tok[i], pre[i], cmask[i] = chunks[sl.request], sl.kv_tokens, True
            emits[i] = chunks[sl.request] == sl.prefill_left
    return Batch(ctx, dmask, tok, pre, cmask, emits)


def _give_back(sl: _Slot, reused: int, used: list) -> list:
    """Slot ``sl`` starts ``reused`` tokens into its prompt and returns the last ``reused`` tokens of its
    reservation (last tier first); the tiers' new ``used``."""
    sl.prefill_left -= reused
    sl.kv_tokens += reused
    keep, below, used = sum(sl.reserved) - reused, 0, list(used)
    for t, r in enumerate(sl.reserved):
        kept = min(max(keep - below, 0), r)
        used[t] -= r - kept
        sl.reserved[t], below = kept, below + r
    return used


def _passes(batch: Batch, mode: str) -> list:
    if mode != "serial":
        return [batch]
    none_b, none_c = np.zeros_like(batch.decode_mask), np.zeros_like(batch.chunk_mask)
    return [Batch(batch.decode_context, batch.decode_mask, batch.chunk_tokens, batch.chunk_prefix, none_c, none_c),
            Batch(batch.decode_context, none_b, batch.chunk_tokens, batch.chunk_prefix, batch.chunk_mask,
                  batch.chunk_emits)]


def simulate(arrival_us, prompt_tokens, output_tokens, chunk_tokens: int, token_budget: int, kv_capacity_tokens,
             config: BatcherConfig, pass_us=None, max_iterations: int = 10**6, step=None, admit=None,
             every_chunk=None, scan_chunk: int = 64, think_us=None) -> Result:
    """Serve the valid requests (``arrival_us`` sorted whole µs, lengths ints) to the end.

    A closed loop (``config.tasks`` = T > 0, ``think_us`` the requests' think times): request i belongs to
    task i mod T, only the first T arrivals are read, and a request's finish issues its task's next one
    ``think_us`` later; the queue is the tasks' next requests in order of arrival (ties by task).

    ``pass_us(batch, draw)`` times each pass (rounded to whole µs); or ``step(requests, kv_tokens,
    batch, iteration)`` times a whole iteration (float µs, not rounded) from the slot table
    (``requests``: each slot's request or −1, ``kv_tokens`` its KV before the iteration) and may keep
    state of its own (:class:`ServeStep`); arrivals may then be float µs.

    ``admit(requests, new, kv_tokens, now) -> reused`` (optional, ``batching.Mechanism.admit``): called
    right after admission with the slot table and ``new`` (the slots that just received a request);
    each new slot starts ``reused`` tokens into its prompt (clipped to [0, prompt − 1]) and gives back
    the last ``reused`` tokens of its reservation, last tier first; a closed loop passes the requests'
    arrivals too (``admit(..., now, arrival_us)``: issued ones, the rest None). ``every_chunk()`` (optional) is
    called after every ``scan_chunk`` loop steps and once after a last partial chunk (the engine's
    ``Mechanism.every_chunk``)."""
    as_time = int if step is None else float
    arrival, prompt, output = [as_time(a) for a in arrival_us], [int(p) for p in prompt_tokens], [int(o) for o in output_tokens]
    n = len(prompt)  # a closed loop's ``arrival_us`` may hold only its first T arrivals
    caps = [int(c) for c in kv_capacity_tokens]
    used = [0] * len(caps)
    slots = [_Slot(reserved=[0] * len(caps)) for _ in range(config.slots)]
    first, finish, out = [NEVER] * n, [NEVER] * n, [0] * n
    tasks = config.tasks
    if tasks:
        arrival = arrival[:tasks] + [NEVER] * (n - tasks)
        task_next = list(range(tasks))

    def arrived(now) -> list:
        """The requests waiting at ``now`` (arrived, not admitted), in admission order."""
        if not tasks:
            return list(range(admitted, bisect.bisect_right(arrival, now)))
        issued = [(arrival[q], t, q) for t, q in enumerate(task_next) if q < n and arrival[q] is not NEVER]
        return [q for a, _, q in sorted(issued) if a <= now]

    def next_arrival():
        """The earliest arrival of a request not yet admitted (None: none issued)."""
        if not tasks:
            return arrival[admitted] if admitted < n else None
        return min((arrival[q] for q in task_next if q < n and arrival[q] is not NEVER), default=None)

    now, admitted, prefill_last, overflow, log, it, steps = 0, 0, False, False, [], 0, 0
    while (admitted < n or any(sl.request >= 0 for sl in slots)) and not overflow and it < max_iterations:
        waiting = arrived(now)
        due = next_arrival()
        if not any(sl.request >= 0 for sl in slots) and not waiting and due is not None:
            now = due  # idle: jump to the next arrival
            waiting = arrived(now)
        # admission: FIFO into free slots (slot order), whole KV reserved, tiers filled in order
        if waiting and prompt[waiting[0]] + output[waiting[0]] > sum(caps):
            overflow = True  # the head of the queue can never fit: it blocks the queue for good
        for sl in slots:
            if sl.request >= 0 or not waiting:
                continue
            head = waiting[0]
            need = prompt[head] + output[head]
            if need > sum(caps) - sum(used):
                break
            left = need
            for t in range(len(caps)):
                take = min(left, caps[t] - used[t])
                used[t] += take
                sl.reserved[t] = take
                left -= take
            sl.request, sl.phase = head, Phase.PREFILL
            sl.prefill_left, sl.decode_left, sl.kv_tokens = prompt[head], output[head], 0
            sl.new = True
            admitted += 1
            waiting.pop(0)
            if tasks:
                task_next[head % tasks] = head + tasks
        if admit is not None:
            new = [sl.new for sl in slots]
            args = ([sl.request for sl in slots], new, [sl.kv_tokens for sl in slots], now)
            reused = admit(*args, arrival) if tasks else admit(*args)
            for sl, is_new, r in zip(slots, new, reused):
                if is_new:
                    used = _give_back(sl, min(max(int(r), 0), max(sl.prefill_left - 1, 0)), used)
        for sl in slots:
            sl.new = False
        decode = [sl.request for sl in slots if sl.phase == Phase.DECODE]
        prefilling = sorted(sl.request for sl in slots if sl.phase == Phase.PREFILL)
        if config.mode == "alternate":
            take_prefill = bool(prefilling) and (not prefill_last or not decode)
            decode, prefilling = ([], prefilling) if take_prefill else (decode, [])
        room = max(token_budget - len(decode), 0)
        chunks = {}
        by_request = {sl.request: sl for sl in slots if sl.request >= 0}
        for q in prefilling:
            c = min(by_request[q].prefill_left, chunk_tokens, room)
            if c > 0:
                chunks[q] = c
                room -= c
        if decode or chunks:
            prefill_last = bool(chunks)
        batch = _batch(slots, decode, chunks)
        if step is not None:
            us = step([sl.request for sl in slots], [sl.kv_tokens for sl in slots], batch, it)
        else:
            us = sum(int(round(float(pass_us(p, 2 * it + k)))) for k, p in enumerate(_passes(batch, config.mode))
                     if p.decode_mask.any() or p.chunk_mask.any())
        log.append(dict(start_us=now, decode=sorted(decode), chunks=chunks, us=us))
        now += us
        it += bool(decode or chunks)  # iterations with work (a stuck queue runs one empty one)
        for sl in slots:
            q = sl.request
            produced = False
            if q in chunks:
                sl.prefill_left -= chunks[q]
                sl.kv_tokens += chunks[q]
                if sl.prefill_left == 0:
                    first[q], sl.phase, produced = now, Phase.DECODE, True
            elif q in decode:
                sl.kv_tokens += 1
                produced = True
            if produced:
                out[q] += 1
                sl.decode_left -= 1
                if sl.decode_left == 0:
                    finish[q] = now
                    if tasks and q + tasks < n:
                        arrival[q + tasks] = now + as_time(think_us[q + tasks])
                    used = [u - r for u, r in zip(used, sl.reserved)]
                    slots[slots.index(sl)] = _Slot(reserved=[0] * len(caps))
        steps += 1
        if every_chunk is not None and steps % scan_chunk == 0:
            every_chunk()
    if every_chunk is not None and steps % scan_chunk:
        every_chunk()
    overflow = overflow or admitted < n or any(sl.request >= 0 for sl in slots)
    return Result(first, finish, out, it, overflow, log, arrival)


# --- the composed serving step (issue 11: "a plain-Python reference of the same iteration step") ----
#
# What hbfjax.serve.engine.simulate composes with the tiers part, rewritten from the formulas in Python floats
# (float64), one stream, loops over layers, operators and kernels: the GPU roofline per operator
# (hbfjax.workload.timing), each operator's weights and KV read from HBM and HBF in parallel over the
# link network's max flows (computed here by enumerating the network's cuts), routed experts split
# between Direct and Relay by trying every k, KV residency per request (prefill to HBF, decode to HBM,
# oldest-first page-wave writeback past the HBM budget) and the KV writes as a two-stage flow shop
# (send a region, program it) per layer window. Only the routing draws (the distinct experts of each
# MoE layer in each pass) and the requests come from the JAX code, so both see the same randomness.

_OP_NAMES = ("norms", "qkv_proj", "attention_decode", "attention_prefill", "out_proj", "router", "experts",
             "shared_experts", "dense_ffn")  # hbfjax.workload.timing.OPS (the test checks they agree)
_WINDOW_OPS = ("attention_decode", "attention_prefill", "out_proj", "norms", "router", "dense_ffn")
_INF = float("inf")
TIE = 2.0**-18  # relative: 64 float32 ulps, above the rounding of one expert delivery time


def _precision(bytes_per_param: float) -> str:
    """The tensor-core precision of a matmul with weights of ``bytes_per_param`` bytes (gpus.compute_precision)."""
    if bytes_per_param >= 3:
        return "fp32"
    if bytes_per_param >= 1.5 or bytes_per_param < 1:
        return "bf16"
    return "fp8"


def _host(tree) -> dict:
    """A knobs dataclass's leaves as host floats (arrays for non-scalars)."""
    out = {}
    for name in tree.__dataclass_fields__:
        v = np.asarray(getattr(tree, name), np.float64)
        out[name] = float(v) if v.ndim == 0 else v
    return out


def _us(nbytes: float, gbps: float) -> float:
    """µs to move ``nbytes`` at ``gbps`` (1 GB/s = 1e3 B/µs): 0 for nothing, ∞ over an absent path."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (gbps * 1e3) if gbps > 0 else _INF


def _min_cut(edges: list, inner: tuple) -> float:
    """Max flow from "s" to "gpu" of a small network (``edges``: (u, v, GB/s)), as its min cut: every
    subset of the ``inner`` nodes on the source side."""
    best = _INF
    for mask in range(1 << len(inner)):
        side = {"s"} | {n for i, n in enumerate(inner) if mask >> i & 1}
        best = min(best, sum(c for u, v, c in edges if u in side and v not in side))
    return best


class _Org:
    """An organisation's rates and geometry as host floats (DASH §IV; hbfjax.memory.delivery's docstring)."""

    def __init__(self, knobs):
        k = _host(knobs)
        self.k = k
        self.pairs = min(k["hbm_stacks"], k["hbf_stacks"])
        self.gpu_hbm = k["hbm_stacks"] * k["gpu_hbm_gbps"]  # G
        self.cells = k["hbm_stacks"] * k["hbm_bw_gbps"]  # M
        self.direct = k["hbf_stacks"] * k["direct_gbps"]  # D
        self.relay_links = self.pairs * k["relay_gbps"]  # HBM–HBF links
        self.relay = self.pairs * min(k["relay_gbps"], k["gpu_hbm_gbps"])  # a relay route also crosses GPU–HBM
        rate_tr = k["t_read_us"] if k["tr_sets_rate"] > 0.5 else k["rate_t_read_us"]  # delivery.rate_t_read_us
        per_tr = k["hbf_stacks"] / (rate_tr * 1e3)
        self.source = min(k["parallel_units"] * k["page_bytes"] * per_tr, k["hbf_sram_region_bytes"] * per_tr,
                          k["hbf_stacks"] * k["hbf_interface_gbps"])  # delivery.source_gbps: min(A, S, I)
        self.shared = k["shared_array_rate"] > 0.5
        self.place = k["place"]
        self.page_wave = k["hbf_stacks"] * k["parallel_units"] * k["page_bytes"]
        self.write_chunk = k["hbf_stacks"] * min(k["parallel_units"] * k["page_bytes"], k["hbf_sram_region_bytes"])
        self.cuts = tuple(self._cut(hbm, hbf) for hbm, hbf in ((True, False), (False, True), (True, True)))

    def _cut(self, from_hbm: bool, from_hbf: bool) -> float:
        """GB/s the GPU can receive from the chosen tiers: HBM cells → HBM base die → GPU; HBF arrays →
        (one shared source, or each path alone) → Direct to the GPU, or HBM–HBF link → HBM base die → GPU."""
        s_cells, s_arrays = (_INF if from_hbm else 0.0), (_INF if from_hbf else 0.0)
        common = [("s", "cells", s_cells), ("cells", "hbm_die", self.cells), ("hbm_die", "gpu", self.gpu_hbm)]
        if self.shared:
            edges = common + [("s", "arrays", s_arrays), ("arrays", "hbf_die", self.source),
                              ("hbf_die", "gpu", self.direct), ("hbf_die", "hbm_die", self.relay_links)]
            return _min_cut(edges, ("cells", "arrays", "hbm_die", "hbf_die"))
        edges = common + [("s", "arrays", s_arrays), ("arrays", "gpu", min(self.direct, self.source)),
                          ("arrays", "hbm_die", min(self.relay_links, self.source))]
        return _min_cut(edges, ("cells", "arrays", "hbm_die"))

    def read(self, hbm_only: float, hbf_only: float, either: float = 0.0) -> tuple[float, float, float]:
        """(µs, HBM bytes, HBF bytes) of a parallel read (DASH §V-B): the least time over every split,
        max(H / hbm cut, F / hbf cut, (H + F + E) / joint cut); the replicated bytes split in proportion
        to the two cuts, within what each side carries in that time."""
        hbm, hbf, joint = self.cuts
        total = hbm_only + hbf_only + either
        t = max(_us(hbm_only, hbm), _us(hbf_only, hbf), _us(total, joint))
        within = (t if t < _INF else 0.0) * 1e3
        lo = max(hbm_only, total - hbf * within)
        hi = max(min(hbm_only + either, hbm * within), lo)
        h = min(max(total * hbm / max(hbm + hbf, 1e-30), lo), hi)
        return t, h, total - h

    def experts(self, n: int, expert_bytes: float, window_us: float) -> tuple[float, float, float]:
        """(µs, least and most Direct bytes) of ``n`` whole experts split over Direct and Relay to
        minimise max(T_Direct, T_Relay) (DASH §V-B, §VI-E), trying every k experts on Direct. Splits
        within a relative ``TIE`` of the best time count as ties (their Direct bytes span the range):
        the engine's float32 may pick any of them."""
        k_ = self.k
        tr = k_["t_read_us"] - k_["lookahead"] * min(k_["t_read_us"], window_us)
        floor = _us(n * expert_bytes, self.source) if self.shared else 0.0
        cap_d = self.direct if self.shared else min(self.direct, self.source)
        cap_r = self.relay if self.shared else min(self.relay, self.source)
        times = []
        for k in range(n + 1):
            d_bytes, r_bytes = k * expert_bytes, (n - k) * expert_bytes
            t_d = tr + max(_us(d_bytes, cap_d), floor) if d_bytes > 0 else 0.0
            fill = _us(min(r_bytes / self.pairs if self.pairs > 0 else _INF, k_["relay_sram_region_bytes"]),
                       k_["relay_gbps"]) if r_bytes > 0 else 0.0
            t_r = tr + fill + max(_us(r_bytes, cap_r), floor) if r_bytes > 0 else 0.0
            times.append(max(t_d, t_r))
        best = min(times)
        ties = [k for k, t in enumerate(times) if t <= best * (1.0 + TIE)]
        return best, ties[0] * expert_bytes, ties[-1] * expert_bytes

    def write_us(self, nbytes: float, route_gbps: float) -> tuple[float, float]:
        """(µs from the first byte sent to the last wave programmed, program-busy µs) of ``nbytes`` sent
        into the HBF base-die SRAM a region per stack at a time and programmed there (DASH §V-B): a
        two-stage flow shop over two regions, simulated chunk by chunk; the package's program bandwidth
        caps the route."""
        if nbytes <= 0:
            return 0.0, 0.0
        p = self.k["t_prog_us"]
        route_gbps = min(route_gbps, self.k["hbf_stacks"] * self.k["hbf_write_gbps"])
        waves = math.ceil(nbytes / self.write_chunk)
        sent, programmed, left = 0.0, [], nbytes
        for i in range(waves):
            part = min(self.write_chunk, left)
            left -= part
            start = max(sent, programmed[i - 2] if i >= 2 else 0.0)  # a region is refilled once programmed
            sent = start + _us(part, route_gbps)
            programmed.append(max(sent, programmed[-1] if programmed else 0.0) + p)
        return programmed[-1], waves * p

    @property
    def prefill_route(self) -> float:
        return self.direct if self.direct > 0 else self.relay

    @property
    def writeback_route(self) -> float:
        """HBM → HBF: over the HBM–HBF links, else through the GPU (in over GPU–HBM, out over Direct)."""
        return self.relay_links if self.relay_links > 0 else min(self.gpu_hbm, self.direct)


class _Gpu:
    def __init__(self, knobs):
        k = _host(knobs)
        self.peak = dict(zip(gpus.PRECISIONS, k["peak_tflops"]))  # the order of GpuKnobs.peak_tflops
        self.bw, self.launch = k["hbm_bw_gbps"], k["launch_us"]
        self.eff, self.att_eff, self.mem_eff = k["compute_efficiency"], k["attention_efficiency"], k["memory_efficiency"]
        self.nvlink, self.ar_eff, self.ar_latency = k["nvlink_gbps"], k["allreduce_efficiency"], k["allreduce_latency_us"]

    def compute_us(self, flops: float, precision: str, attention: bool = False) -> float:
        return flops / (self.peak[precision] * (self.att_eff if attention else self.eff) * 1e6)


class _Op:
    """One operator's roofline parts (summed over its kernels)."""

    __slots__ = ("compute_us", "other_bytes", "weight_bytes", "kv_bytes", "kernels")

    def __init__(self):
        self.compute_us = self.other_bytes = self.weight_bytes = self.kv_bytes = self.kernels = 0.0

    def kernel(self, gpu: _Gpu, flops, weight_bytes, kv_bytes, other_bytes, precision, attention=False, launches=1):
        self.compute_us += gpu.compute_us(flops, precision, attention)
        self.weight_bytes += weight_bytes
        self.kv_bytes += kv_bytes
        self.other_bytes += other_bytes
        self.kernels += launches

    def us(self, gpu: _Gpu, delivery_us: float) -> float:
        """max(compute, activations through the GPU's HBM, delivery) + launches (layer_time's op time)."""
        if self.kernels == 0:
            return 0.0
        return max(self.compute_us, self.other_bytes * 1e-3 / (gpu.bw * gpu.mem_eff), delivery_us) + \
            self.kernels * gpu.launch


class _Pass(NamedTuple):
    tokens: int  # through each layer
    emitting: int  # through the LM head
    decode: int  # decode tokens (queries)
    decode_pairs: float  # Σ context over decode tokens
    chunk_tokens: int
    chunk_pairs: float  # Σ n·p + n(n + 1)/2
    chunk_kv: float  # Σ (p + n)


def _pass_shape(batch: Batch) -> _Pass:
    dec = [int(c) for c, m in zip(batch.decode_context, batch.decode_mask) if m]
    chunks = [(int(n), int(p), bool(e)) for n, p, m, e in zip(batch.chunk_tokens, batch.chunk_prefix, batch.chunk_mask,
                                                               batch.chunk_emits) if m]
    n_chunk = sum(n for n, _, _ in chunks)
    return _Pass(tokens=len(dec) + n_chunk, emitting=len(dec) + sum(e for _, _, e in chunks), decode=len(dec),
                 decode_pairs=float(sum(dec)), chunk_tokens=n_chunk,
                 chunk_pairs=float(sum(n * p + n * (n + 1) / 2 for n, p, _ in chunks)),
                 chunk_kv=float(sum(p + n for n, p, _ in chunks)))


class _Model:
    """The model's constants the step uses, read once (ModelSpec's Linears, norms, KV, attention)."""

    def __init__(self, model, act: int = 2, attention_precision: str = "bf16"):
        self.act, self.attention_precision = act, attention_precision
        lin = lambda l: (l.op, l.in_features, l.out_features, l.copies, l.bytes_per_param,  # noqa: E731
                         _precision(l.bytes_per_param))
        self.linears = {kind: [lin(l) for l in model.linears(kind) if l.op != "experts"]
                        for kind in set(model.layer_kinds)}
        self.expert_linears = [lin(l) for l in model.linears("moe") if l.op == "experts"] if model.is_moe else []
        self.head = [lin(l) for l in model.head_linears()]
        self.hidden, self.top_k = model.hidden, model.top_k
        self.norm_weight_bytes = model.norm_params_per_layer * model.bytes_per_param("norms")
        self.kv_layer, self.kv_token = model.kv_bytes_per_token_layer, model.kv_bytes_per_token
        self.kv_read = model.kv_bytes_per_token_layer * model.kv_fraction_attended
        self.pair_flops = {phase: model.attention_flops_per_pair(phase) for phase in ("decode", "prefill")}
        self.kinds = list(model.layer_kinds)
        self.is_moe, self.lookahead_capable = model.is_moe, model.lookahead_capable
        self.expert_bytes = float(sum(i * o * bpp for _, i, o, _, bpp, _ in self.expert_linears))
        self.gpus = model.tensor_parallel  # a tensor-parallel group's GPUs; every size above is one GPU's


def _allreduce_us(m: _Model, gpu: _Gpu, tokens: int) -> float:
    """One layer's two ring all-reduces of tokens × hidden × 2 B (hbfjax.workload.tensor_parallel): each
    2 (T − 1) / T × bytes over the NVLink rate times the bus efficiency, plus the latency; 0 on one GPU."""
    if m.gpus == 1 or tokens == 0:
        return 0.0
    message = tokens * m.hidden * m.act
    return 2 * (2.0 * (m.gpus - 1) / m.gpus * message * 1e-3 / (gpu.nvlink * gpu.ar_eff) + gpu.ar_latency)


def _linear(op: _Op, gpu: _Gpu, tokens: int, linear, act: int, copies=None) -> None:
    """A Linear over ``tokens`` tokens: 2·T·in·out·copies FLOPs, its weights once, activations in and out."""
    _, i, o, c, bpp, precision = linear
    c = c if copies is None else copies
    op.kernel(gpu, 2.0 * tokens * i * o * c, i * o * c * bpp, 0.0, tokens * (i + o) * c * act, precision)


def _layer_ops(m: _Model, kind: str, ps: _Pass, gpu: _Gpu) -> dict:
    """{op: _Op} of one layer of ``kind`` without the routed experts (hbfjax.workload.timing's roofline):
    the two norms, each Linear over every token, the two attentions."""
    ops = {name: _Op() for name in _OP_NAMES}
    t, act = ps.tokens, m.act
    if t > 0:
        elements = t * m.hidden
        ops["norms"].kernel(gpu, 2 * 4.0 * elements, m.norm_weight_bytes, 0.0, 2 * 2 * act * elements, "fp32",
                            launches=2)
        for lin in m.linears[kind]:
            _linear(ops[lin[0]], gpu, t, lin, act)
    for op, phase, pairs, queries, kv_tokens in (("attention_decode", "decode", ps.decode_pairs, ps.decode, ps.decode_pairs),
                                                 ("attention_prefill", "prefill", ps.chunk_pairs, ps.chunk_tokens,
                                                  ps.chunk_kv)):
        if queries > 0:
            ops[op].kernel(gpu, pairs * m.pair_flops[phase], 0.0, kv_tokens * m.kv_read,
                           queries * (m.kv_layer + 2.0 * m.hidden * act), m.attention_precision, attention=True)
    return ops


def _expert_op(m: _Model, ps: _Pass, distinct: int, gpu: _Gpu) -> tuple[_Op, int]:
    """The routed experts of one MoE layer: T·k rows over ``distinct`` experts, each expert Linear one
    grouped kernel (each needed expert's matrix read once); and the experts that get rows."""
    op = _Op()
    rows = ps.tokens * m.top_k
    used = min(distinct, rows)
    if rows > 0:
        for _, i, o, _, bpp, precision in m.expert_linears:
            op.kernel(gpu, 2.0 * rows * i * o, used * i * o * bpp, 0.0, rows * (i + o) * m.act, precision)
    return op, used


class Totals(NamedTuple):
    """A run's sums (float64; the fields of ``hbfjax.serve.engine.Totals`` but the measured table's
    misses and the chunk stall, which a DASH organisation on the roofline never has), the largest Direct bytes
    among the expert splits that tie the best time (``expert_direct_bytes`` holds the smallest), and the
    scale of the write stalls' inputs (Σ write + window over the layers with writes: a float32 stall
    is exact to a few ulps of that)."""

    busy_us: float
    prefill_write_bytes: float
    writeback_bytes: float
    write_stall_us: float
    program_busy_us: float
    writeback_passes: float
    expert_direct_bytes: float
    expert_relay_bytes: float
    hbm_read_bytes: float
    hbf_read_bytes: float
    kv_hbm_byte_us: float
    kv_hbf_byte_us: float
    max_kv_hbm_bytes: float
    max_kv_hbf_bytes: float
    expert_direct_max_bytes: float
    stall_scale_us: float
    passes: float  # passes with work
    allreduce_us: float  # tensor-parallel all-reduce time inside busy_us (0 on one GPU)


class ServeStep:
    """The composed iteration of ``hbfjax.serve.engine`` (the tiers part) for :func:`simulate`'s ``step``: per pass the
    per-layer times on the organisation, the KV residency and writes, and the run's totals.

    ``draws(draw, tokens) -> [distinct experts per MoE layer]`` gives the routing draws."""

    def __init__(self, model, org_knobs, gpu_knobs, mode: str, hbm_budget_tokens: int, writeback_unit_tokens: int,
                 draws):
        self.m, self.org, self.gpu, self.mode, self.draws = _Model(model), _Org(org_knobs), _Gpu(gpu_knobs), mode, draws
        self.budget, self.unit = hbm_budget_tokens, writeback_unit_tokens
        self.hbm = {}  # request -> its KV tokens held in HBM (the rest of its KV in HBF)
        self.sums = dict.fromkeys(Totals._fields, 0.0)
        self.passes, self.loop_s = 0, 0.0
        self.kv_hbf_factor = 1.0  # multiplies the HBF share of the attention's KV bytes (read-wave amplification)
        self.idle = ([], [])  # the last pass's per-layer idle array time: Σ and max over its operators
        self.record = None  # a list to append each pass's detail to (hbfjax.serve.timeline); None: off
        self.calls, self.detail = 0, None  # iterations timed; the last pass's operators (when recording)
        self.allreduce_us = 0.0  # the last pass's tensor-parallel all-reduces, every layer

    def _delivery(self, name: str, op: _Op, shares: tuple) -> tuple[float, float, float]:
        """One operator's data read in parallel: weights by their kind's placement (shared experts are
        expert weights, the rest dense), the attention's KV split by the pass's HBM shares."""
        place = self.org.place[1 if name == "shared_experts" else 0]
        w = [op.weight_bytes * x for x in place]
        kv = op.kv_bytes if name.startswith("attention") else 0.0
        share = shares[0] if name == "attention_decode" else shares[1] if name == "attention_prefill" else 0.0
        return self.org.read(w[0] + kv * share, w[1] + kv * (1.0 - share) * self.kv_hbf_factor, either=w[2])

    def _times(self, ps: _Pass, draw: int, shares: tuple):
        """(per-layer µs [L], per-layer write windows [L], LM head µs, expert (Direct, Direct max,
        Relay) bytes, HBM and HBF read bytes) of one pass."""
        gpu, m = self.gpu, self.m
        per_kind, hbm_bytes, hbf_bytes, idle = {}, 0.0, 0.0, {}
        for kind in set(m.kinds):
            ops = _layer_ops(m, kind, ps, gpu)
            reads = {name: self._delivery(name, op, shares) for name, op in ops.items()}
            op_us = {name: op.us(gpu, reads[name][0]) for name, op in ops.items()}
            count = m.kinds.count(kind)
            hbm_bytes += count * sum(r[1] for r in reads.values())
            hbf_bytes += count * sum(r[2] for r in reads.values())
            per_kind[kind] = (op_us, sum(op_us.values()), sum(op_us[name] for name in _WINDOW_OPS))
            idle[kind] = [max(op_us[name] - reads[name][0], 0.0) for name in ops]
        head = _Op()
        if ps.emitting > 0:
            for lin in m.head:
                _linear(head, gpu, ps.emitting, lin, m.act)
        head_read = self.org.read(*(head.weight_bytes * x for x in self.org.place[0]))
        hbm_bytes, hbf_bytes = hbm_bytes + head_read[1], hbf_bytes + head_read[2]
        head_us = head.us(gpu, head_read[0])
        distinct = iter(self.draws(draw, ps.tokens)) if m.is_moe else None
        if "moe" in per_kind:
            base = per_kind["moe"][0]
            window = base["out_proj"] + base["norms"] + base["router"] if m.lookahead_capable else 0.0
        direct = direct_max = relay = 0.0
        layer_us, windows, memo, experts = [], [], {}, []
        self.idle = ([], [])
        allreduce = _allreduce_us(m, gpu, ps.tokens)  # after the operators, in no window
        self.allreduce_us = len(m.kinds) * allreduce
        for kind in m.kinds:
            _, total_us, window_us = per_kind[kind]
            total_us += allreduce
            layer_idle = list(idle[kind])
            if kind == "moe":  # the routed experts: this layer's draw, delivered over Direct and Relay
                d = int(next(distinct))
                if d not in memo:
                    op, used = _expert_op(m, ps, d, gpu)
                    t, lo, hi = self.org.experts(used, m.expert_bytes, window)
                    memo[d] = (op.us(gpu, t), lo, hi, used * m.expert_bytes - lo, t)
                us, lo, hi, r, t = memo[d]
                total_us += us
                layer_idle.append(max(us - t, 0.0))
                direct, direct_max, relay = direct + lo, direct_max + hi, relay + r
                experts.append((us, lo, r, d))
            else:
                experts.append(None)
            layer_us.append(total_us)
            windows.append(window_us)
            self.idle[0].append(sum(layer_idle))
            self.idle[1].append(max(layer_idle))
        if self.record is not None:  # each layer's operators: µs by kind, routed experts (µs, Direct, Relay B, distinct)
            self.detail = {"ops": {kind: v[0] for kind, v in per_kind.items()}, "experts": experts}
        return layer_us, windows, head_us, (direct, direct_max, relay), hbm_bytes, hbf_bytes

    def _book(self, requests: list, kv_tokens: list, batch: Batch) -> tuple[int, int, int, int]:
        """The pass's new KV placed and the writeback it triggers (kv_tiers): (to HBF, written back,
        HBM-resident after, HBF-resident after), tokens."""
        place = self.org.place
        prefill_hbm, decode_hbm = place[2][0] >= 0.5, place[3][0] >= 0.5
        to_hbf, held = 0, {}
        for i, q in enumerate(requests):
            if q < 0:
                continue
            chunk = int(batch.chunk_tokens[i]) if batch.chunk_mask[i] else 0
            dec = int(bool(batch.decode_mask[i]))
            new_hbm = (chunk if prefill_hbm else 0) + (dec if decode_hbm else 0)
            to_hbf += chunk + dec - new_hbm
            held[q] = self.hbm.get(q, 0) + new_hbm
        total = sum(held.values())
        excess = max(total - self.budget, 0)
        moved = min(-(-excess // self.unit) * self.unit, total)
        left = moved
        for q in sorted(held):  # oldest (earliest admitted) first
            take = min(left, held[q])
            held[q] -= take
            left -= take
        self.hbm.update(held)
        after = {q: kv + (int(batch.chunk_tokens[i]) if batch.chunk_mask[i] else 0) + int(bool(batch.decode_mask[i]))
                 for i, (q, kv) in enumerate(zip(requests, kv_tokens)) if q >= 0}
        hbm_after = sum(held.values())
        return to_hbf, moved, hbm_after, sum(after.values()) - hbm_after

    def _shares(self, requests: list, kv_tokens: list, batch: Batch) -> tuple[float, float]:
        def share(mask):
            num = sum(self.hbm.get(q, 0) for q, m in zip(requests, mask) if m and q >= 0)
            den = sum(kv for q, kv, m in zip(requests, kv_tokens, mask) if m and q >= 0)
            return num / den if den > 0 else 0.0
        return share(batch.decode_mask), share(batch.chunk_mask)

    def _dash_writes(self, to_hbf: int, back: int, windows: list) -> tuple[float, float, float, float]:
        """(exposed stall µs, program-busy µs, stall scale µs, written-back bytes) of a pass's KV writes
        (:meth:`one_pass`'s docstring)."""
        m, org = self.m, self.org
        n = len(windows)
        prefill_us, prefill_busy = org.write_us(to_hbf * m.kv_layer, org.prefill_route)
        back_bytes = back * m.kv_token
        waves = math.ceil(back_bytes / org.page_wave)
        writes = {}  # waves in a layer -> (µs, program-busy µs)
        block = int(self.org.k["write_window_layers"])  # layers whose windows a write may overlap
        stall = busy = scale = 0.0
        need = room = 0.0
        for i, window in enumerate(windows):
            share = waves // n + (i < waves % n)
            if share not in writes:
                writes[share] = org.write_us(back_bytes * share / max(waves, 1), org.writeback_route)
            back_us, back_busy = writes[share]
            need, room = need + prefill_us + back_us, room + window
            if (i + 1) % block == 0 or i == n - 1:  # the block's last layer books its excess
                stall += max(need - room, 0.0)
                need = room = 0.0
            busy += prefill_busy + back_busy
            if prefill_us + back_us > 0:
                scale += prefill_us + back_us + window
        return stall, busy, scale, back_bytes

    def one_pass(self, requests: list, kv_tokens: list, batch: Batch, draw: int) -> float:
        """µs of one non-empty pass (layers, LM head, exposed KV-write stalls), booking its totals.

        KV writes (layer_time.kv_writes): every layer writes its share of the new HBF-bound KV straight
        from the GPU; the written-back tokens go as whole page waves, ``W // L`` per layer and one more
        in the first ``W mod L`` layers; a layer's two writes run one after the other from its QKV
        projection, and what exceeds its window (attention, output projection, norms, router, dense FFN)
        is exposed."""
        ps = _pass_shape(batch)
        m = self.m
        layer_us, windows, head_us, (direct, direct_max, relay), hbm_read, hbf_read = self._times(
            ps, draw, self._shares(requests, kv_tokens, batch))
        to_hbf, back, hbm_after, hbf_after = self._book(requests, kv_tokens, batch)
        stall, busy, scale, back_bytes = self._dash_writes(to_hbf, back, windows)
        us = sum(layer_us) + head_us + stall
        values = dict(busy_us=us, prefill_write_bytes=to_hbf * m.kv_token, writeback_bytes=back_bytes,
                      write_stall_us=stall, program_busy_us=busy, writeback_passes=float(back > 0),
                      expert_direct_bytes=direct, expert_direct_max_bytes=direct_max, expert_relay_bytes=relay,
                      hbm_read_bytes=hbm_read, hbf_read_bytes=hbf_read, stall_scale_us=scale)
        self._add_sums(values, hbm_after, hbf_after)
        self._record_pass(values, requests, batch, ps, layer_us, head_us, hbm_after, hbf_after)
        return us

    def _record_pass(self, values: dict, requests: list, batch: Batch, ps: _Pass, layer_us: list, head_us: float,
                     hbm_after: int, hbf_after: int, **extra) -> None:
        """With recording on, append one pass's detail (``values``: its totals by Totals field) to ``record``."""
        if self.record is None:
            return
        per_token = self.m.kv_token
        self.record.append(dict(
            call=self.calls, us=values["busy_us"], layer_us=layer_us, head_us=head_us, stall_us=values["write_stall_us"],
            program_busy_us=values["program_busy_us"], decode_tokens=ps.decode, prefill_tokens=ps.chunk_tokens,
            direct_bytes=values["expert_direct_bytes"], relay_bytes=values["expert_relay_bytes"],
            hbm_read_bytes=values["hbm_read_bytes"], hbf_read_bytes=values["hbf_read_bytes"],
            prefill_write_bytes=values["prefill_write_bytes"], writeback_bytes=values["writeback_bytes"],
            kv_hbm_bytes=hbm_after * per_token, kv_hbf_bytes=hbf_after * per_token,
            decode_requests=[q for q, d in zip(requests, batch.decode_mask) if d and q >= 0],
            prefill_requests=[q for q, c in zip(requests, batch.chunk_mask) if c and q >= 0],
            **self.detail, **extra))

    def _add_sums(self, values: dict, hbm_after: int, hbf_after: int) -> None:
        """Book one pass's totals (``values`` by Totals field) and its KV residency after it, in tokens."""
        s, per_token, us = self.sums, self.m.kv_token, values["busy_us"]
        for name, value in values.items():
            s[name] += value
        s["kv_hbm_byte_us"] += hbm_after * per_token * us
        s["kv_hbf_byte_us"] += hbf_after * per_token * us
        s["max_kv_hbm_bytes"] = max(s["max_kv_hbm_bytes"], hbm_after * per_token)
        s["max_kv_hbf_bytes"] = max(s["max_kv_hbf_bytes"], hbf_after * per_token)
        s["passes"] += 1
        s["allreduce_us"] += self.allreduce_us
        self.passes += 1

    def __call__(self, requests: list, kv_tokens: list, batch: Batch, iteration: int) -> float:
        kv_tokens, us = list(kv_tokens), 0.0
        live = {q for q in requests if q >= 0}
        self.hbm = {q: v for q, v in self.hbm.items() if q in live}  # finished requests free their KV
        for k, p in enumerate(_passes(batch, self.mode)):
            if p.decode_mask.any() or p.chunk_mask.any():
                us += self.one_pass(requests, kv_tokens, p, 2 * iteration + k)
            kv_tokens = [kv + (int(p.chunk_tokens[i]) if p.chunk_mask[i] else 0) + int(bool(p.decode_mask[i]))
                         for i, kv in enumerate(kv_tokens)]
        self.calls += 1
        return us

    def totals(self) -> Totals:
        return Totals(**self.sums)


def capacity_tokens(model, org_knobs, hbm_budget_bytes: float = -1.0) -> tuple[int, int, int]:
    """(HBM budget, HBF room, writeback unit) in tokens (kv_tiers' capacity): HBM and HBF less the
    weights placed there (a replicated share in both), over the KV bytes of a token; the unit is the
    whole tokens of one page wave (at least one)."""
    org, per_token = _Org(org_knobs), model.kv_bytes_per_token
    kinds = (model.non_expert_weight_bytes, model.expert_weight_bytes)
    held = [sum(w * (org.place[k][t] + org.place[k][2]) for k, w in enumerate(kinds)) for t in (0, 1)]
    k = org.k
    hbm, hbf = k["hbm_stacks"] * k["hbm_capacity_bytes"], k["hbf_stacks"] * k["hbf_capacity_bytes"]
    budget = hbm_budget_bytes if hbm_budget_bytes >= 0 else max(hbm - held[0], 0.0)
    tokens = lambda b: int(min(max(math.floor(b / per_token), 0), 2**30))  # noqa: E731
    return tokens(budget), tokens(max(hbf - held[1], 0.0)), max(math.floor(org.page_wave / per_token), 1)


def room_tokens(model, knobs, hbf_derived: int) -> int:
    """The HBF KV room in tokens (``engine.room_tokens``): what the weights leave (``hbf_derived``), or
    ``knobs.kv_room_bytes`` where that is given (>= 0) and smaller (float32 division, as the engine's)."""
    room = float(np.asarray(knobs.kv_room_bytes))
    given = int(np.floor(np.float32(room) / np.float32(model.kv_bytes_per_token)))
    return min(given, hbf_derived) if room >= 0 else hbf_derived


def admission_caps(hbm_tokens: int, hbf_tokens: int, batcher_knobs, tiers: int) -> list:
    """The batcher's per-tier KV capacities (``parts.tiers.admission_capacity``): the HBM budget and
    the HBF room, cut to the batcher's own total where that is smaller (one tier: their sum)."""
    cap = int(np.asarray(batcher_knobs.kv_capacity_tokens).sum())
    hbm_cap = min(hbm_tokens, cap)
    hbf_cap = min(hbf_tokens, cap - hbm_cap)
    return [hbm_cap + hbf_cap] if tiers == 1 else [hbm_cap, hbf_cap] + [0] * (tiers - 2)


class CountDraws:
    """``draws(draw, tokens) -> [distinct experts per MoE layer]`` of pass ``draw`` with ``tokens``
    tokens: ``routing.distinct_count_draws``'s inverse CDF at its hashed uniforms. The uniforms
    (``rng.uniform01(rng.mix(seed, stream, draw, layer, Salt.ROUTE_COUNT))``) come from JAX, in blocks
    of ``block`` passes, and the CDF table is routing's; the lookup is NumPy. ``jax_s`` is the time
    spent computing the uniforms (the speed baseline leaves it out)."""

    def __init__(self, config, seed: int, stream_id: int, block: int = 1024):
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415

        from hbfjax import rng  # noqa: PLC0415
        from hbfjax.salts import Salt  # noqa: PLC0415
        from hbfjax.workload import routing  # noqa: PLC0415

        rc = config.routing
        layers = jnp.asarray([i for i, k in enumerate(config.model.layer_kinds) if k == "moe"], jnp.int32)
        words = (jnp.uint32(seed), jnp.int32(stream_id))
        self._uniforms = jax.jit(lambda first: rng.uniform01(rng.mix(
            *words, first + jnp.arange(block, dtype=jnp.int32)[:, None], layers[None, :], Salt.ROUTE_COUNT)))
        self.cdf = routing._distinct_cdf_table(rc.routed_experts, rc.top_k, rc.max_tokens)  # f32[T + 1, E + 1]
        self.experts, self.block, self.max_tokens = rc.routed_experts, block, rc.max_tokens
        self.u, self.jax_s = {}, 0.0

    def __call__(self, draw: int, tokens: int) -> list:
        first = draw - draw % self.block
        if first not in self.u:
            t0 = time.perf_counter()
            self.u[first] = np.asarray(self._uniforms(first))
            self.jax_s += time.perf_counter() - t0
        u = self.u[first][draw - first]  # f32[L_moe]
        cdf = self.cdf[min(max(tokens, 0), self.max_tokens)]
        return np.minimum((cdf[None, :] <= u[:, None]).sum(axis=1), self.experts).tolist()


def serve(stream_id: int, seed: int, knobs, config, max_iterations: int | None = None, trace=None, record=None):
    """One stream of ``hbfjax.serve.engine.simulate(stream_id, seed, knobs, None, config)`` (a DASH
    organisation: ``config.parts = ("tiers",)``, its policy DASH's) in plain
    Python: (:class:`Result` with float µs times, :class:`Totals`, the :class:`ServeStep`, whose
    ``loop_s`` is the loop's time without the JAX routing uniforms: the speed baseline). The
    requests are drawn by ``hbfjax.workload.requests.generate`` (inputs, as for the engine); routing
    draws as :func:`count_draws` (``config.routing_draw`` must be "counts"). ``trace``: the engine's
    ``requests.TraceInputs`` of a replay (open loop); ``record``: a list each pass's detail is appended to
    (:class:`ServeStep`, ``hbfjax.serve.timeline``)."""
    from hbfjax import clock  # noqa: PLC0415
    from hbfjax.workload import requests as rq  # noqa: PLC0415

    require_choice("reference.serve", "routing_draw", config.routing_draw, ("counts",))
    require_choice("reference.serve", "parts", tuple(config.parts), (("tiers",),))
    require_choice("reference.serve", "timing_kind", config.timing_kind, ("organisation",))
    require(not config.batcher.tasks, "reference.serve", "config.batcher.tasks", config.batcher.tasks,
            "a closed loop is not in the reference (its think times are not passed on)")
    reqs = rq.generate(stream_id, seed, knobs.requests, trace, config.requests)
    valid = np.asarray(reqs.valid)
    arrival = clock.to_us(reqs.arrival)[valid]
    budget = float(np.asarray(knobs.hbm_kv_budget_bytes))
    hbm_tokens, hbf_tokens, unit = capacity_tokens(config.model, knobs.org, budget)
    hbf_room = room_tokens(config.model, knobs, hbf_tokens) if float(np.asarray(knobs.policy.hbf_request_kv)) > 0 else 0
    caps = admission_caps(hbm_tokens, hbf_room, knobs.batcher, config.batcher.tiers)
    step = ServeStep(config.model, knobs.org, knobs.gpu, config.batcher.mode, hbm_tokens, unit,
                     CountDraws(config, seed, stream_id) if config.model.is_moe else None)
    step.record = record
    t0 = time.perf_counter()
    result = simulate(arrival, np.asarray(reqs.prompt_tokens)[valid], np.asarray(reqs.output_tokens)[valid],
                      int(knobs.batcher.chunk_tokens), int(knobs.batcher.token_budget), caps,
                      config.batcher, max_iterations=max_iterations or config.max_iterations, step=step)
    step.loop_s = time.perf_counter() - t0 - (step.draws.jax_s if step.draws is not None else 0.0)
    return result, step.totals(), step
