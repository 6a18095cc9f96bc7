"""Every numeric option of collide, gc and writeback, fed bad and borderline values generated from the
argparse parsers themselves: each gets a clean error (exit 2, one line on stderr naming the option, no
traceback, nothing on stdout) or, where the value is legal, a result that satisfies the output
invariants (hbfjax.invariants)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from hbfjax import batch
from hbfjax.cli import build_parser, main
from hbfjax.invariants import check_result
from hbfjax.flash.programs import backlog as bl
from hbfjax.validate import ConfigError

COMMANDS = ("collide", "gc", "writeback", "disturb")
# tiny runs: two streams, a few planes, blocks and iterations
BASE = {
    "collide": ["--planes", "8", "--streams", "2", "--json"],
    "gc": ["--blocks", "16", "--pages-per-block", "4", "--spare-factor", "0.4", "--streams", "2", "--json"],
    "writeback": ["--layers", "2", "--iterations", "4", "--streams", "2", "--json"],
    "disturb": ["--planes", "2", "--blocks", "32", "--free-blocks-per-plane", "4", "--pages-per-block", "8",
                "--read-disturb-reads", "1000", "--reads-per-s", "2000", "--hours", "1", "--streams", "2", "--json"],
}
_ATTENTION = ["--workload", "attention", "--slots", "2", "--max-context-tokens", "64", "--chunk-tokens", "32",
              "--measurements", "1", "--context-tokens-mean", "40"]
_KV = ["--workload", "kv", "--blocks", "64", "--slots", "2", "--pages-per-tick", "1", "--ticks", "8"]
# extra arguments that put an option in a mode where it applies (the base replaces what they repeat)
CONTEXT = {
    ("collide", "--group-size"): ["--placement", "plane-group"],
    ("collide", "--pages-per-logical"): ["--placement", "plane-group"],
    ("collide", "--pages-per-block"): ["--placement", "isolated"],
    ("collide", "--replicas"): _ATTENTION + ["--shared-prefix-tokens", "16", "--placement", "plane-group",
                                             "--group-size", "2"],
    ("gc", "--hot-fraction"): ["--workload", "hotcold"],
    ("gc", "--hot-write-fraction"): ["--workload", "hotcold"],
    ("gc", "--lifetime-sigma"): _KV + ["--lifetime", "lognormal"],
    ("writeback", "--hbm-budget-gb"): ["--preset", "dash"],
}
ATTENTION_OPTIONS = {"--context-tokens-mean", "--context-tokens-sigma", "--model-kv-bytes-per-token",
                     "--logical-page-tokens", "--slots", "--max-context-tokens", "--chunk-tokens",
                     "--chunks-per-wave", "--shared-prefix-tokens", "--measurements"}
KV_OPTIONS = {"--gc-trigger-used", "--mean-lifetime-ticks", "--slots", "--pages-per-tick", "--ticks"}
SYNTHETIC_OPTIONS = {"--pages-per-iter", "--window-pages"}


def numeric_options(command: str):
    """(flag, type) of every option of ``command`` whose type is a ``hbfjax.validate.number``."""
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and command in a.choices)
    parser = sub.choices[command]
    return [(a.option_strings[0], a.type) for a in parser._actions if hasattr(a.type, "kind")]


def context(command: str, flag: str) -> list[str]:
    if (command, flag) in CONTEXT:
        return CONTEXT[(command, flag)]
    if command == "collide" and flag in ATTENTION_OPTIONS:
        return _ATTENTION
    if command == "gc" and flag in KV_OPTIONS:
        return _KV
    if command == "writeback" and flag in SYNTHETIC_OPTIONS:
        return ["--synthetic", "--pages-per-iter", "1", "--window-pages", "2", "--iterations", "20", "--layers"]
    return []


def bad_values(kind, hi) -> list[str]:
    values = ["0", "-1", "nan", "inf", "-inf", str(2**31), "1e12"]
    if kind is int:
        values.append("2.5")
    if kind is float and hi is not None and hi <= 1:
        values += ["1.5", "1"]
    return values


def _argv(command, flag, value):
    extra = context(command, flag)
    base = list(BASE[command])
    if extra[-1:] == ["--layers"]:  # synthetic mode: no timeline options in the base
        base, extra = ["--streams", "2", "--json"], extra[:-1]
    if command == "collide" and "attention" not in extra:
        extra = ["--pages", "8", *extra]
    if command == "gc" and "kv" not in extra:
        extra = ["--drive-writes", "0.5", "--warmup-drive-writes", "0", *extra]
    return [command, *base, *extra, flag, value]


CASES = [(c, f, v) for c in COMMANDS for f, t in numeric_options(c) for v in bad_values(t.kind, t.hi)]


def _legal(kind_type, value: str) -> bool:
    try:
        kind_type(value)
        return True
    except Exception:  # argparse.ArgumentTypeError or ValueError
        return False


def test_every_numeric_option_is_introspected():
    flags = {c: {f for f, _ in numeric_options(c)} for c in COMMANDS}
    assert {"--planes", "--pages", "--group-size", "--offload-fraction", "--replicas", "--seed"} <= flags["collide"]
    assert {"--blocks", "--spare-factor", "--drive-writes", "--mean-lifetime-ticks"} <= flags["gc"]
    assert {"--decode-requests", "--t-prog-us", "--stripe-pages", "--warmup", "--window-pages"} <= flags["writeback"]
    assert len(CASES) > 250


@pytest.mark.parametrize("command,flag,value", CASES, ids=[f"{c}{f}={v}" for c, f, v in CASES])
def test_bad_input_is_refused_cleanly_or_gives_a_valid_result(command, flag, value, capsys):
    type_ = dict(numeric_options(command))[flag]
    # rules independent of any option's range: no NaN or infinity, no fraction for a count, int32 counts
    must_refuse = value in ("nan", "inf", "-inf") or (type_.kind is int and value == "2.5") or \
        (type_.kind is int and value in (str(2**31), "1e12") and flag != "--seed") or \
        (flag == "--seed" and value in ("-1", "1e12"))
    if must_refuse:
        assert not _legal(type_, value)
    if not _legal(type_, value):
        # refused at parse time: no simulation, so every such case is instant
        rc = main(_argv(command, flag, value))
        out, err = capsys.readouterr()
        assert rc == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err
        return
    rc = main(_argv(command, flag, value))
    out, err = capsys.readouterr()
    if rc == 2:  # a relation between options refused: still one line that names this option
        assert out == "" and len(err.strip().splitlines()) == 1 and flag in err, err
        return
    assert rc in (0, 1), err  # 1: gc reports a free-pool overflow, still a printed result
    result = json.loads(out)
    check_result(result)  # finite, >= 0, fractions in [0, 1], waves >= ideal, amplification >= 1, WAF >= 1


def test_count_of_generated_cases_that_get_a_clean_error():
    refused = sum(not _legal(dict(numeric_options(c))[f], v) for c, f, v in CASES)
    assert refused >= 0.75 * len(CASES)  # most bad values die in argparse, before any simulation


# --- one pin per class of the issue -------------------------------------------------------------

def _err(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out)
    return err


@pytest.mark.parametrize("argv,flag", [
    (["collide", "--planes", "0"], "--planes"), (["collide", "--group-size", "0", "--placement", "plane-group"],
                                                  "--group-size"),
    (["collide", "--pages-per-logical", "-1", "--placement", "plane-group"], "--pages-per-logical"),
    (["collide", "--pages-per-block", "0", "--placement", "isolated"], "--pages-per-block"),
    (["collide", "--workload", "attention", "--chunks-per-wave", "0"], "--chunks-per-wave"),
    (["collide", "--workload", "attention", "--shared-prefix-tokens", "16", "--replicas", "0"], "--replicas"),
])
def test_zero_or_negative_counts_are_refused_not_replaced(capsys, argv, flag):
    assert f"{flag} = " in _err(capsys, argv)


def test_offload_keeps_waves_at_or_above_the_ideal_of_plane_pages(capsys):
    assert main(["collide", "--planes", "64", "--pages", "96", "--offload-fraction", "0.5", "--streams", "4",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mean_waves"] >= out["ideal_waves"] and out["amplification"] >= 1
    assert out["sram_served_pages"] > 0 and out["ideal_waves"] < out["ideal_waves_all_pages"]


def test_gc_spare_factor_without_room_for_host_writes_is_refused_with_the_rule(capsys):
    err = _err(capsys, ["gc", "--spare-factor", "0.013"])
    assert "--spare-factor = 0.013" in err and "reserve 96 + slack 32" in err


def test_invariants_refuse_meaningless_results():
    good = {"mean_waves": 2.0, "ideal_waves": 1, "amplification": 2.0, "ci95_waves": 0.1, "hot_plane_fraction": 0.2}
    check_result(good)
    for bad, field in (({"mean_waves": 0.9}, "mean_waves"), ({"amplification": 0.98}, "amplification"),
                       ({"ci95_waves": math.inf}, "ci95_waves"), ({"hot_plane_fraction": 1.5}, "hot_plane_fraction"),
                       ({"ci95_waves": -1.0}, "ci95_waves"), ({"mean_waves": None}, "mean_waves")):
        with pytest.raises(ConfigError, match=f"result.{field}"):
            check_result({**good, **bad})
    with pytest.raises(ConfigError, match="at least one measured host write"):
        check_result({"waf": 62464.0, "host_writes": 0})
    with pytest.raises(ConfigError, match="must be >= 0"):
        check_result({"pages_programmed_per_iteration": -2.1e9})
    # NaN means "not measured" only for the TPOT and decode rate of a run with no decode; a NaN WAF is a bug
    check_result({"tpot_ms": math.nan, "p99_tpot_ms": math.nan, "decode_tokens_per_s": math.nan, "waf": None})
    for key in ("waf", "read_wave_amplification", "e2e_s"):
        with pytest.raises(ConfigError, match=f"result.{key} = nan: must be finite"):
            check_result({key: math.nan, "host_writes": 5})


def test_writeback_counts_that_would_overflow_int32_are_refused(capsys):
    err = _err(capsys, ["writeback", "--decode-requests", "1e8", "--iterations", "4", "--streams", "2"])
    assert "--decode-requests = 100000000.0" in err and "int32" in err
    err = _err(capsys, ["writeback", "--preset", "dash", "--hbm-budget-gb", "0.001", "--streams", "2"])
    assert "--hbm-budget-gb = 0.001" in err and "buffer_base_pages" in err


def test_seeds_are_uint32_words_and_never_wrap(capsys):
    assert "--seed = 4294967296" in _err(capsys, ["collide", "--seed", str(2**32)])
    with pytest.raises(ConfigError, match="seed"):
        batch.run(bl.simulate, 2, 2**32, bl.BacklogKnobs.make(1.0, 2), bl.BacklogConfig(4, 0, 30))
    a = batch.run(bl.simulate, 2, 2**32 - 1, bl.BacklogKnobs.make(1.0, 2), bl.BacklogConfig(40, 0, 30))
    b = batch.run(bl.simulate, 2, 0, bl.BacklogKnobs.make(1.0, 2), bl.BacklogConfig(40, 0, 30))
    assert not np.array_equal(a.mean_backlog_pages, b.mean_backlog_pages)


@pytest.mark.parametrize("argv,flag,mode", [
    (["collide", "--trace", "x.csv"], "--trace", "--workload read"),
    (["writeback", "--synthetic", "--pages-per-iter", "1", "--window-pages", "2", "--policy", "stripe"], "--policy",
     "--synthetic"),
    (["gc", "--hot-fraction", "0.3"], "--hot-fraction", "--workload uniform"),
    (["gc", "--mean-lifetime-ticks", "50"], "--mean-lifetime-ticks", "--workload uniform"),
    (["writeback", "--preset", "dash", "--sram-mb", "3"], "--sram-mb", "--preset dash --policy dash-hbm"),
    (["writeback", "--preset", "dash", "--stripe-pages", "8"], "--stripe-pages", "--preset dash"),
])
def test_options_the_mode_ignores_are_refused_naming_option_and_mode(capsys, argv, flag, mode):
    err = _err(capsys, argv)
    assert flag in err and mode in err and "no effect" in err


def test_near_critical_backlog_is_refused_at_once_with_the_rule(capsys):
    for lam, w in (("3.99", "4"), ("1e5", "200000")):
        t0 = time.perf_counter()
        err = _err(capsys, ["writeback", "--synthetic", "--pages-per-iter", lam, "--window-pages", w])
        assert time.perf_counter() - t0 < 5 and "exact stationary backlog" in err and "operations" in err
    assert bl.exact_work(3.0, 4) <= bl.MAX_EXACT_WORK < bl.exact_work(3.99, 4)


def test_unexpected_exceptions_are_not_swallowed(monkeypatch):
    from hbfjax.commands import collide

    monkeypatch.setattr(collide, "_read", lambda *a: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        main(["collide", "--planes", "8", "--pages", "8", "--streams", "2"])


# --- the serving level's files and sub-parsers (issue 27): one line, exit 2, before any work ----------

@pytest.fixture()
def files(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00not text")
    (tmp_path / "grid.toml").write_text('command = "gc"\nfixed = 3\n[vary]\ngc-trigger-used = [0.8]\n')
    return tmp_path


@pytest.mark.parametrize("argv,says", [
    (["serve", "--system", "dash", "--profile-table", "{d}/missing.csv"], "--profile-table {d}/missing.csv: no such file"),
    (["serve", "--system", "dash", "--profile-table", "{d}/folder"], "--profile-table {d}/folder: is a folder"),
    (["serve", "--system", "dash", "--profile-table", "{d}/binary.csv"], "--profile-table {d}/binary.csv: not UTF-8"),
    (["sweep", "gc", "--vary", "gc-trigger-used=0.8", "--out", "{d}/missing/t.csv"], "the folder {d}/missing does not exist"),
    (["sweep", "gc", "--vary", "gc-trigger-used=0.8", "--out", "{d}/folder"], "--out {d}/folder: is a folder"),
    (["sweep", "gc", "--vary", "gc-trigger-used=0.8", "--nosuch", "3", "--out", "{d}/t.csv"], "unrecognized arguments: --nosuch"),
    (["sweep", "--grid", "{d}/grid.toml", "gc", "--out", "{d}/t.csv"], "fixed = 3: must be a table"),
    (["sweep", "serve", "--capacity", "--capacity-rates", "", "--slo", "p90_ttft_s<=2", "--out", "{d}/t.csv"],
     "--capacity-rates values ''"),
    (["plot", "{d}/missing.csv", "--x", "a", "--y", "b", "--out", "{d}/p.png"], "TABLE {d}/missing.csv: no such file"),
    (["plot", "{d}/binary.csv", "--x", "a", "--y", "b", "--out", "{d}/p.png"], "TABLE {d}/binary.csv: not UTF-8"),
    (["profile", "--quick", "--out", "{d}/missing/p.csv"], "the folder {d}/missing does not exist"),
    (["profile", "--quick", "--out", "{d}/folder"], "--out {d}/folder: is a folder"),
])
def test_serving_level_files_and_options_are_refused_in_one_line(capsys, files, argv, says):
    err = _err(capsys, [a.format(d=files) for a in argv])
    assert says.format(d=files) in err and err.count("\n") == 1 and "Traceback" not in err


TRACE_FILES = {  # name -> (bytes or None for a folder, what the one line says)
    "binary.csv": (b"\x00\x01\x02binary", "unknown trace schema"),
    "wrong.csv": (b"a,b,c\n1,2,3\n", "unknown trace schema (first line 'a,b,c\\n')"),
    "empty.csv": (b"", "no requests (the file is empty)"),
    "cut.csv": (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-1",
                ":3: TIMESTAMP = '2023-1' is not"),
    "sessions": (None, "is a directory with no *.jsonl session files"),
    "missing.csv": (False, "trace '{d}/missing.csv' not found"),
}


@pytest.mark.parametrize("command", ["trace-info", "serve"])
@pytest.mark.parametrize("name", list(TRACE_FILES))
def test_a_trace_file_that_is_not_a_trace_is_one_line_naming_it(capsys, tmp_path, command, name):
    content, says = TRACE_FILES[name]
    path = tmp_path / name
    if content is None:
        path.mkdir()
    elif content is not False:
        path.write_bytes(content)
    argv = (["trace-info", str(path)] if command == "trace-info" else
            ["serve", "--system", "hbflex", "--model", "deepseek-v3", "--trace", str(path), "--requests", "8",
             "--warmup", "2", "--streams", "2"])
    err = _err(capsys, argv)
    assert says.format(d=tmp_path) in err and err.count("\n") == 1 and "Traceback" not in err, err


def _sweep_table(path, sweep_id: str, rows: int = 2) -> None:
    from hbfjax.sweep.table import ResultTable

    table = ResultTable(path, sweep_id).open()
    table.append([{"row_kind": "point", "point": i, "key": f'{{"x":"{i}"}}', "x": i, "status": "ok"}
                  for i in range(rows)])


def test_a_table_that_cannot_be_resumed_is_refused_and_a_cut_last_line_repaired(tmp_path):
    from hbfjax.sweep.table import ResultTable

    path = tmp_path / "t.csv"
    _sweep_table(path, "s1")
    whole = path.read_bytes()
    path.write_bytes(whole + b'"s1",point,2,"{""x')  # killed inside a write: the partial last line is cut
    assert ResultTable(path, "s1").open().done("point") == {'{"x":"0"}', '{"x":"1"}'} and path.read_bytes() == whole
    lines = whole.split(b"\n")
    for garbled, says in ((whole + b"\xff\xfe\n", "not UTF-8"),
                          (b"\n".join([lines[0], lines[1][:25], *lines[2:]]), "cannot be resumed"),  # cut inside
                          (whole.replace(b"point,1", b"pt,1"), "not a sweep row"),
                          (whole, "another sweep")):
        path.write_bytes(garbled)
        with pytest.raises(ConfigError, match=says):
            ResultTable(path, "s1" if says != "another sweep" else "s2").open()
        assert path.read_bytes() == garbled  # refused, never half-read or rewritten


SERVING = ("serve", "profile", "tune", "sweep", "models")
SERVING_CASES = [(c, f, v) for c in SERVING for f, t in numeric_options(c) for v in bad_values(t.kind, t.hi)
                 if not _legal(t, v)]


def test_the_serving_battery_covers_every_numeric_option():
    flags = {c: {f for f, _ in numeric_options(c)} for c in SERVING}
    assert {"--kv-room-gb", "--tasks", "--think-s", "--slots", "--rate", "--cores"} <= flags["serve"]
    assert {"--points-per-call", "--refine-rounds"} <= flags["sweep"] and "--repeats" in flags["profile"]
    assert {f for _, f, _ in SERVING_CASES} == set().union(*flags.values())  # every option has a refused value
    assert len(SERVING_CASES) > 150


@pytest.mark.parametrize("command,flag,value", SERVING_CASES, ids=[f"{c}{f}={v}" for c, f, v in SERVING_CASES])
def test_a_serving_level_value_out_of_range_is_one_line_naming_its_option(command, flag, value, capsys):
    """The values each option's type refuses (a value it accepts would simulate: the pins above and
    tests/test_cli_serve.py hold those): refused by the parser, before any work."""
    argv = [command, "gc", flag, value] if command == "sweep" else [command, flag, value]
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err


# --- borderline values a serving option accepts (issue 27) ---------------------------------------
# Each is a clear one-line error naming what it breaks, or a result that meets the output invariants
# (``emit`` checks them: a value the run cannot measure is null, never a NaN or a 0). The cases share a
# few base runs (one compilation each in this process; the values are knobs or lengths).
_MODEL = ["--model", "mixtral-8x22b", "--streams", "2", "--json"]
FIXED = ["--system", "dash", "--batch", "1", "--prompt", "64", "--output", "4", *_MODEL]
POISSON = ["--system", "dash", "--rate", "2", "--requests", "12", "--warmup", "2", "--prompt", "64", "--output", "4",
           "--slots", "4", *_MODEL]
CPU = ["--system", "hybrid", "--batch", "1", "--prompt", "64", "--output", "4", *_MODEL]
BORDERLINE = [  # (base, flag, value, None: a result | text of the one-line error)
    (FIXED, "--prompt", "1", None), (FIXED, "--output", "1", None), (FIXED, "--chunk-tokens", "1", None),
    (FIXED, "--token-budget", "1", None), (FIXED, "--t-read-us", "1e-6", None),
    (FIXED, "--t-read-us", "1e6", "--t-read-us = 1e+06: dash would program a page (tPROG 100 µs) faster than it reads"),
    (FIXED, "--t-prog-us", "1e-6", "--t-prog-us = 1e-06: dash would program a page"), (FIXED, "--t-prog-us", "1e6", None),
    (FIXED, "--link-tbps", "1e-9", None), (FIXED, "--link-tbps", "1000", None), (FIXED, "--page-kib", "1", None),
    (FIXED, "--page-kib", "1024", None), (FIXED, "--hbm-kv-budget-gb", "0", None), (FIXED, "--launch-us", "0", None),
    (FIXED, "--launch-us", "10000", None), (FIXED, "--write-window-layers", "4096", None),
    (FIXED, "--seed", "4294967295", None),
    (POISSON, "--rate", "1e-6", None), (POISSON, "--rate", "1e6", None), (POISSON, "--warmup", "0", None),
    (POISSON, "--warmup", "11", "--warmup = 11: must be below --requests − 1 = 11 (an arrival window needs at least two"),
    (POISSON, "--slo-ttft-s", "1e-9", None), (POISSON, "--slo-tpot-ms", "1e9", None), (POISSON, "--slots", "1", None),
    (POISSON, "--concurrency", "4", "--concurrency = 4.0: needs --trace without --tasks"),
    (CPU, "--cores", "1", None), (CPU, "--cores", "37", "--cores = 37: must be <= the 36 cores of the host CPU"),
    (CPU, "--cpu-dram-gbps", "1e-9", None), (CPU, "--cpu-dram-gbps", "307.2", None),
    (CPU, "--cpu-dram-gbps", "307.3", "--cpu-dram-gbps = 307.3: must be <= the Xeon 8452Y's DDR5-4800 x 8 peak"),
    (CPU, "--cpu-core-gbps", "10000", None),
    (["--system", "hybrid-split", *CPU[2:]], "--cpu-experts", "8", None),
    (["--system", "hybrid-split", *CPU[2:]], "--cpu-experts", "9", "--cpu-experts = 9: must be <= mixtral-8x22b's 8"),
]


# make test runs the lengths, the empty HBM budget, the CPU systems' limits and the refusals (the fixed-batch and
# CPU results share two compilations); the extreme hardware rates, times and page sizes, the batcher's limits and
# the Poisson base's values, each a serve run of 5-9 s, run in make test-slow (CI's 10 minutes)
FAST_RESULTS = {"--prompt", "--output", "--hbm-kv-budget-gb", "--cores", "--cpu-experts"}


def _borderline_cases():
    for base, flag, value, says in BORDERLINE:
        slow = says is None and flag not in FAST_RESULTS
        yield pytest.param(base, flag, value, says, id=f"{base[1]}{flag}={value}",
                           marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("base,flag,value,says", list(_borderline_cases()))
def test_a_borderline_serving_value_is_a_valid_result_or_one_clear_line(capsys, base, flag, value, says):
    rc = main(["serve", *base, flag, value])
    out, err = capsys.readouterr()
    if says is None:
        assert rc == 0, err
        result = json.loads(out)
        check_result(result)
        rows = result.get("systems", [result])
        assert all(not r["overflow"] for r in rows)
        if flag == "--output":  # one token a request: nothing decodes, so no TPOT was measured
            assert all(r["tpot_ms"] is None and r["decode_tokens_per_s"] is None for r in rows)
        return
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and says in lines[0] and "Traceback" not in err, err


def test_a_sweep_over_readings_and_a_one_token_output_has_no_failed_row(tmp_path, capsys):
    table = tmp_path / "t.csv"
    assert main(["sweep", "--out", str(table), "--vary", "array-rate=shared,per-path", "--vary", "output=1,4", "serve",
                 *[a for a in FIXED if a not in ("--output", "4", "--json")]]) == 0
    capsys.readouterr()
    import pandas as pd

    rows = pd.read_csv(table)
    assert len(rows) == 4 and set(rows.status) == {"ok"}
    assert rows[rows.output == 1].tpot_ms.isna().all() and rows[rows.output == 4].tpot_ms.notna().all()


@pytest.mark.parametrize("argv", [
    ["sweep", "--points-per-call", "1", "--vary", "spare-factor=0.1,0.2", "gc", "--blocks", "64", "--pages-per-block",
     "16", "--streams", "2", "--drive-writes", "0.5", "--warmup-drive-writes", "0", "--out", "{d}/a.csv"],
    ["sweep", "--points-per-call", "4096", "--vary", "spare-factor=0.1,0.2", "gc", "--blocks", "64", "--pages-per-block",
     "16", "--streams", "2", "--drive-writes", "0.5", "--warmup-drive-writes", "0", "--out", "{d}/b.csv"],
    pytest.param(["profile", "--model", "mixtral-8x22b", "--max-tokens", "1", "--max-context", "1", "--warmup", "0",
                  "--repeats", "1", "--out", "{d}/p.csv"], marks=pytest.mark.slow),  # 8 s: make test-slow
    ["models", "--kv-bytes-per-element", "1e-9", "--json"], ["models", "--kv-bytes-per-element", "8", "--json"],
])
def test_borderline_values_of_the_other_serving_commands_run(capsys, tmp_path, argv):
    assert main([a.format(d=tmp_path) for a in argv]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.strip() and "Traceback" not in out
