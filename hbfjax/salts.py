"""Every hash salt of the simulator, named once (DESIGN.md §3 "Randomness").

A draw is ``rng.mix(<hash words>, ..., Salt.X, ...)``: the salt says which kind of draw it is, so
two mechanisms composed on one ``(seed, stream)`` never draw correlated numbers by accident.
``@unique`` makes a repeated value an import-time error; ``tests/test_stats_rng.py`` checks it too.
The values are the ones each mechanism has always used (changing one changes every result drawn
with it); a new draw takes a new value.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class Salt(IntEnum):
    # reads: placement of one read's pages (hbfjax.flash.reads.collide). The stripe offset of a logical
    # page uses PLACE_RANDOM too, so plane-group placement with G = planes and L = 1 places every
    # page exactly where random placement does.
    PLACE_RANDOM = 11
    PLACE_BLOCK = 12
    PLACE_GROUP_START = 14
    # reads: the attention working set (hbfjax.flash.reads.workingset); its pages are placed by collide.
    # 22-24 were its own page salts before placement was implemented once: not to be reused.
    WS_COMPLETE = 21
    WS_PREFIX = 25
    WS_THIN = 26
    WS_START = 27
    WS_PREFIX_OFFSET = 125
    # programs: writeback timeline (hbfjax.flash.programs.writeback)
    WB_PHASE = 41
    WB_TOUCH = 42
    WB_PREFILL = 43
    # programs: synthetic backlog (hbfjax.flash.programs.backlog)
    BACKLOG_ARRIVALS = 51
    # workload: MoE routing (hbfjax.workload.routing); 61-69 belong to routing
    ROUTE_FLOYD = 61
    ROUTE_KEYS = 62
    ROUTE_POPULARITY = 63
    ROUTE_BALANCED_OFFSET = 64
    ROUTE_SUCCESSIVE = 65
    ROUTE_COUNT = 66  # exact draw of a layer's distinct-expert count (routing.distinct_count_draws)
    # workload: request streams (hbfjax.workload.requests); 71-79 reserved for it
    REQ_GAP = 71  # exponential inter-arrival gap of request i
    REQ_GAMMA = 72  # Marsaglia-Tsang gamma gap of request i (words: try, part)
    REQ_PROMPT = 73  # prompt length of request i (words: part)
    REQ_OUTPUT = 74  # output length of request i (words: part)
    REQ_PAIR = 75  # empirical (prompt, output) pair of request i
    REQ_OFFSET = 76  # trace replay start offset of a stream
    REQ_BOOT_SESSION = 77  # bootstrap: which trace session the m-th session replays
    REQ_BOOT_START = 78  # bootstrap: gap before the m-th session starts
    REQ_TASK_SESSION = 79  # closed loop: which trace session a task's k-th session replays (words: task, k)
    REQ_THINK = 90  # closed loop: exponential think time before request i
    # serve: the CPU-offloading systems (hbfjax.serve.offload_system); 81-89 reserved for them
    OFFLOAD_RESIDENT = 81  # resident experts among a layer's needed ones (hypergeometric, count routing)
    # reads: one scheduling wave of an attention read (hbfjax.flash.reads.wave); 130-139 belong to it.
    # Folded into the wave's words, so its stripe start planes (drawn with PLACE_RANDOM, like collide's
    # random pages) never repeat another read's draws on the same words.
    WAVE_STRIPE = 130
    WAVE_TABLE = 131  # the tabulated wave law's own draws (wave.tabulate)
    WAVE_DRAW = 132  # a serving pass's quantile of the tabulated law (hbflex_system)
    # tune: the reference problems with exact gradients (hbfjax.tune.analytic)
    TUNE_PAGE_PLANE = 135  # a page's uniform for its plane under non-uniform plane probabilities
    TUNE_WORK = 136  # an iteration's exponential new work in the backlog reference
    # erase: GC victims and workloads (hbfjax.flash.erase.gc, gc_overwrite, kv_lifetimes)
    GC_RANDOM_VICTIM = 0x6C
    OVERWRITE_UNIFORM = 0x77
    OVERWRITE_HOT = 0x78
    OVERWRITE_PAGE = 0x79
    LIFETIME_U1 = 0x11F
    LIFETIME_U2 = 0x120
    # erase × reads: plane-group KV reads and the collide-gc tuning problem (kv_lifetimes,
    # hbfjax.tune.problems.collide_gc); 140-144 belong to them
    KV_GROUP_OFFSET = 140  # stripe start plane of a request's KV within its plane group (words: slot, gen)
    # serving: the sampled planes of the KV block store (hbfjax.serve.plane_store, parts.blocks); 150-159
    STORE_PLANE_PAGES = 150  # Poisson pages of a session reaching a sampled plane (words: call, plane, session)
    STORE_PLANE_NORMAL = 151  # its normal approximation's second hash, for large means (same words)
    STORE_GROUP = 152  # the plane group of a session under plane-group placement (words: session)
    STORE_STRIPE_OFFSET = 153  # the stripe start of a session's pages within its group (words: session)
    STORE_PILOT = 154  # the request whose session's group a sampled plane lies in (words: plane)
    STORE_CUT_ROUND = 155  # a cut's rounding of a session's random pages kept on a plane (words: call, plane, session)
