"""The choices and bounds the subcommands' options offer (system, model, GPU and policy names, modes,
numeric limits, the sizes help texts quote), as plain constants, so that building the parser imports
no JAX and ``--help`` or a refused option answers at once. Each mirrors the registry named beside it,
which the run itself uses; ``tests/test_cli_names.py`` checks every one equals its registry (value and
type)."""

# serve, sweep
DASH_SYSTEMS = ("dash", "compact-dash", "relay-only", "direct-only")  # memory.organisations.ORGANISATIONS
HBFLEX_SYSTEMS = ("hbflex", "naive-hbf", "naive-block", "h3", "fa-cli", "fa-csi", "is")  # memory.hbf_packages.PACKAGES
CPU_SYSTEMS = ("cpu-stream", "cpu-compute", "hybrid", "hybrid-split")  # serve.cpu_offload.SYSTEMS
SYSTEMS = DASH_SYSTEMS + HBFLEX_SYSTEMS + CPU_SYSTEMS  # serve.systems.SYSTEMS
MODEL_PRESETS = ("qwen3-235b-a22b", "qwen3-235b-a22b-int8", "mixtral-8x22b", "grok-1", "llama4-maverick",
                 "deepseek-v3", "deepseek-v2", "deepseek-v4-pro", "hunyuan", "llama3-8b", "llama3-70b")  # tuple(workload.models.PRESETS)
MODELS = tuple(sorted(MODEL_PRESETS))  # sorted(workload.models.PRESETS)
GPUS = ("h100-pcie", "h100-sxm", "h200")  # sorted(workload.gpus.PRESETS)
MODES = ("mixed", "serial", "alternate")  # serve.state.MODES
ROUTING_KINDS = ("uniform", "zipf", "balanced")  # workload.routing.KINDS
READS = ("linear", "planes")  # serve.systems.READS
ARRAY_RATES = ("shared", "per-path")  # tuple(serve.systems.ARRAY_RATES)
TR_MODELS = ("rate", "latency")  # tuple(serve.systems.TR_MODELS)
FIXED_PREFILL = ("chunked", "whole")  # serve.systems.FIXED_PREFILL
MECHANISMS = ("placement", "balancing", "scheduling", "writeback", "reclamation")  # memory.hbf_packages.MECHANISMS
MAX_REQUESTS = 2**17  # workload.requests.MAX_REQUESTS
MAX_TOKENS = 2**24  # workload.requests.MAX_TOKENS

# collide, gc, serve (--hbf)
HBF_PARTS = ("ocp-hbf-v0.7", "sandisk-gen1", "slc-96l")  # tuple(memory.hbf_parts.PARTS)

# collide
PLACEMENTS = ("random", "isolated", "plane-group")  # flash.reads.collide.PLACEMENTS
MAX_PLANES = 2**24  # flash.reads.collide.MAX_PLANES
MAX_READ_PAGES = 2**24  # flash.reads.collide.MAX_READ_PAGES
SCHEDULES = ("in-order", "placement-aware")  # flash.reads.workingset.SCHEDULES
WORKINGSET_MAX_TOKENS = 2**30  # flash.reads.workingset.MAX_TOKENS

# gc
ALLOCATIONS = ("interleaved", "isolated", "lifetime", "plane-group")  # flash.erase.kv_lifetimes.ALLOCATIONS

# writeback
WRITEBACK_POLICIES = ("immediate", "stripe", "window", "dash-hbm",
                      "dash-prefill-direct")  # flash.programs.writeback.POLICIES
WRITEBACK_MAX_US = 1e9  # flash.programs.writeback.MAX_US
WRITEBACK_MAX_LAYERS = 2**16  # flash.programs.writeback.MAX_LAYERS
WRITEBACK_MAX_COUNT = 2.0**30  # flash.programs.writeback.MAX_COUNT
WRITEBACK_MAX_ITERATIONS = 2**24  # flash.programs.writeback.MAX_ITERATIONS
BACKLOG_MAX_PAGES_PER_ITER = 1e6  # flash.programs.backlog.MAX_PAGES_PER_ITER
BACKLOG_MAX_WINDOW_PAGES = 2**24  # flash.programs.backlog.MAX_WINDOW_PAGES

# profile
PROFILE_PREFILL_CHUNK = 512  # workload.profiler.PREFILL_CHUNK
PROFILE_QUICK_TOKENS = (1, 4, 16, 64)  # workload.profiler.QUICK_TOKENS
PROFILE_QUICK_CONTEXTS = (64, 256)  # workload.profiler.QUICK_CONTEXTS
PROFILE_QUICK_CHUNK = 32  # workload.profiler.QUICK_CHUNK

# tune
TUNE_PROBLEMS = ("collide-sram", "collide-gc", "dash-split", "hbflex-sram")  # tune.problems.NAMES
ESTIMATORS = ("smooth", "perturb", "fd", "spsa", "exact")  # tune.estimators.ESTIMATORS

# traces
TRACE_BASE_URL_ENV = "HBFJAX_TRACE_BASE_URL"  # trace_fetch.BASE_URL_ENV
