"""Read reclaim of a served run's weights (``hbfjax.read_reclaim``, issue 26): the renewal estimate by hand on
DASH's and HBFlex's packages, refresh as a floor, the lifetimes' wear arithmetic, and ``hbfjax serve
--read-disturb-reads`` against the run's own reads; off by default."""

import json
import math

import numpy as np
import pytest

from hbfjax import cli, read_reclaim
from hbfjax.flash.erase.endurance import SECONDS_PER_YEAR
from hbfjax.memory import hbf_packages
from hbfjax.memory import organisations as orgs
from hbfjax.validate import ConfigError
from hbfjax.workload import models

PAGE_BLOCK = 512 * 4096  # bytes of a 512-page block of 4 KiB pages


def _totals(expert_bytes, passes, busy_s):
    return {"expert_direct_bytes": np.array([expert_bytes / 2]), "expert_relay_bytes": np.array([expert_bytes / 2]),
            "passes": np.array([float(passes)]), "busy_us": np.array([busy_s * 1e6])}


def test_dash_expert_blocks_by_hand():
    # DASH: dense weights in HBM, experts in HBF; 1e12 expert bytes read in 10 s -> 2.44e7 page reads/s;
    # N = 1e6 -> 24.4 relocations/s of 2 MiB blocks; 1 TB package at 1e5 P/E
    org, model = orgs.organisation("dash"), models.preset("qwen3-235b-a22b")
    assert float(org.page_bytes) == 4096 and float(org.place[orgs.DENSE_WEIGHTS, orgs.HBF]) == 0.0
    m = read_reclaim.ReclaimModel(threshold_reads=1e6)
    out = read_reclaim.per_stream(_totals(1e12, 100, 10.0), org, model, np.array([5e9]), m)
    reads = 1e12 / 4096 / 10.0
    assert out["weight_page_reads_per_s"][0] == pytest.approx(reads)
    assert out["reclaim_relocations_per_s"][0] == pytest.approx(reads / 1e6)
    rewrite_bps = reads / 1e6 * PAGE_BLOCK
    assert out["reclaim_program_gb"][0] == pytest.approx(rewrite_bps * 10.0 / 1e9)
    assert out["reclaim_over_kv_programs"][0] == pytest.approx(rewrite_bps / 5e8)
    device = float(org.hbf_stacks) * float(org.hbf_capacity_bytes)
    assert out["lifetime_years_read_reclaim"][0] == pytest.approx(1e5 * device / rewrite_bps / SECONDS_PER_YEAR)
    combined = 1.0 / (1.0 / out["lifetime_years_read_reclaim"][0] + 1.0 / out["lifetime_years_kv_writes"][0])
    assert out["lifetime_years_combined"][0] == pytest.approx(combined)  # erase rates add


def test_lifetimes_split_the_wear_into_host_writes_gc_and_reclaim():
    # 5e9 B of KV over 10 s, of them 1e9 GC's; 2e9 B of KV-block copies; erase rates add, so 1 / combined is the
    # sum of 1 / host, 1 / GC and 1 / reclaim (the weights' estimate with the KV copies)
    org, model = orgs.organisation("dash"), models.preset("qwen3-235b-a22b")
    m = read_reclaim.ReclaimModel(threshold_reads=1e6)
    out = read_reclaim.per_stream(_totals(1e12, 100, 10.0), org, model, np.array([5e9]), m, np.array([1e9]),
                                  np.array([2e9]))
    weights_only = read_reclaim.per_stream(_totals(1e12, 100, 10.0), org, model, np.array([5e9]), m)
    device = float(org.hbf_stacks) * float(org.hbf_capacity_bytes)
    life = lambda bps: 1e5 * device / bps / SECONDS_PER_YEAR  # noqa: E731
    assert out["lifetime_years_kv_host_writes"][0] == pytest.approx(life(4e8))
    assert out["lifetime_years_gc"][0] == pytest.approx(life(1e8))
    assert out["kv_reclaim_program_gbps"][0] == pytest.approx(0.2)
    rewrite_bps = weights_only["reclaim_program_gbps"][0] * 1e9
    assert out["lifetime_years_read_reclaim"][0] == pytest.approx(life(rewrite_bps + 2e8))
    inverse = sum(1.0 / out[k][0] for k in ("lifetime_years_kv_host_writes", "lifetime_years_gc",
                                            "lifetime_years_read_reclaim"))
    assert out["lifetime_years_combined"][0] == pytest.approx(1.0 / inverse)
    assert weights_only["lifetime_years_kv_writes"][0] == out["lifetime_years_kv_writes"][0]  # host + GC, as before


def test_hbflex_dense_blocks_are_read_whole_every_pass():
    # HBFlex holds every weight in HBF: a dense block is read 512 times a pass; at 10 passes/s and
    # N = 1e5 each dense block relocates every 1e5 / 5,120 s
    pkg = hbf_packages.package("hbflex")
    org, model = pkg.org, models.preset("deepseek-v3")
    assert float(org.place[orgs.DENSE_WEIGHTS, orgs.HBF]) == 1.0
    m = read_reclaim.ReclaimModel(threshold_reads=1e5)
    out = read_reclaim.per_stream(_totals(0.0, 100, 10.0), org, model, np.array([0.0]), m)
    dense_blocks = model.non_expert_weight_bytes / PAGE_BLOCK
    assert out["reclaim_relocations_per_s"][0] == pytest.approx(dense_blocks * 512 * 10 / 1e5)
    assert math.isinf(out["lifetime_years_kv_writes"][0]) and math.isinf(out["reclaim_over_kv_programs"][0])


def test_refresh_is_a_floor_on_each_block():
    org, model = orgs.organisation("dash"), models.preset("qwen3-235b-a22b")
    cold = _totals(1e6, 1, 3600.0)  # almost no reads in an hour: every expert block refreshes every T
    off = read_reclaim.per_stream(cold, org, model, np.array([1.0]), read_reclaim.ReclaimModel(1e6))
    on = read_reclaim.per_stream(cold, org, model, np.array([1.0]), read_reclaim.ReclaimModel(1e6, refresh_hours=24))
    blocks = model.expert_weight_bytes / PAGE_BLOCK
    assert on["reclaim_relocations_per_s"][0] == 0.0
    assert on["reclaim_refreshes_per_s"][0] == pytest.approx(blocks / (24 * 3600))
    assert off["reclaim_refreshes_per_s"][0] == 0.0 and off["reclaim_relocations_per_s"][0] > 0


def _json(capsys, argv):
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_serve_reports_reclaim_from_its_own_reads(capsys):
    base = ["serve", "--system", "dash", "--model", "mixtral-8x22b", "--batch", "2", "--prompt", "64", "--output",
            "4", "--streams", "2", "--json"]
    plain = _json(capsys, base)
    assert not any("reclaim" in k for k in plain)  # off by default: today's keys only
    d = _json(capsys, base + ["--read-disturb-reads", "1e4"])
    assert d["reclaim_model"]["threshold_reads"]["value"] == 1e4
    timing = d["reclaim_timing"]  # the header states the timed part's choices and where they come from
    assert timing["threshold_reads"]["value"] == 1e4 and timing["in_windows"]["value"] == 1.0
    assert "assumed" in timing["relocation_frontier"] and "DASH" in timing["kv_blocks"]
    # DASH's KV: each request's HBF KV a cohort of blocks, read whole by its 3 decode passes (the prefill pass
    # reads no HBF KV): 512 reads a block a pass, 1,536 in all, short of N = 10^4: nothing relocated
    assert d["kv_block_reads_max"] == 512 * 3 and d["kv_reclaim_relocations_per_s"] == 0
    assert d["reclaim_relocations_per_s"] == pytest.approx(d["weight_page_reads_per_s"] / 1e4, rel=1e-9)
    # the engine times the same rewrites (parts.reclaim): a stall, so fewer tokens a second than without
    assert "parts.reclaim" in d["reclaim_note"] and d["reclaim_stall_s"] > 0
    assert d["throughput_tokens_per_s"] < plain["throughput_tokens_per_s"]
    unreached = _json(capsys, base + ["--read-disturb-reads", "1e15"])
    assert unreached["throughput_tokens_per_s"] == plain["throughput_tokens_per_s"]
    assert unreached["reclaim_stall_s"] == 0


@pytest.mark.parametrize("extra, text", [(["--refresh-hours", "24"], "give --read-disturb-reads"),
                                         (["--read-disturb-reads", "0"], "--read-disturb-reads"),
                                         (["--reclaim-in", "windows"], "give --read-disturb-reads"),
                                         (["--read-disturb-reads", "1e6", "--reclaim-in", "critical-path",
                                           "--reclaim-backlog-blocks", "4"], "applies to --reclaim-in windows"),
                                         (["--read-disturb-reads", "1e6", "--reclaim-in", "sometimes"], "invalid choice")])
def test_bad_reclaim_options_exit_2(capsys, extra, text):
    argv = ["serve", "--system", "dash", "--model", "mixtral-8x22b", "--batch", "1", "--prompt", "8", "--output", "2",
            "--streams", "2", "--json"] + extra
    assert cli.main(argv) == 2
    assert text in capsys.readouterr().err


def test_model_refuses_a_threshold_below_one():
    with pytest.raises(ConfigError, match="threshold_reads"):
        read_reclaim.ReclaimModel(threshold_reads=0.5)
