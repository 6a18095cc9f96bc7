"""`hbfjax gc` end to end: the documented keys, clean rejections, the closest-label fallback."""

import json

from hbfjax.cli import main


def test_cli_json_has_the_issue_keys_and_rejects_bad_values(capsys):
    rc = main(["gc", "--blocks", "16", "--pages-per-block", "8", "--spare-factor", "0.3", "--victim", "fifo",
               "--drive-writes", "1", "--warmup-drive-writes", "0.5", "--streams", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("waf", "ci95_waf", "host_writes", "migrated_pages", "erases_per_block_mean", "erases_per_block_max",
                "gc_invocations", "effective_spare_factor", "overflow", "warmup_host_writes", "lifetime_years"):
        assert key in out, key
    assert out["waf"] >= 1.0 and out["overflow"] is False and out["lifetime_dash"]["A_W_waf"] == out["waf"]
    capsys.readouterr()
    assert main(["gc", "--spare-factor", "1.2"]) == 2
    assert "--spare-factor = 1.2: must be in (0, 1)" in capsys.readouterr().err
    assert main(["gc", "--blocks", "2"]) == 2
    assert "BlockConfig.n_blocks = 2: need at least 4 blocks" in capsys.readouterr().err


def test_cli_kv_lifetime_reports_the_closest_label_fallback(capsys):
    args = ["gc", "--workload", "kv", "--allocation", "lifetime", "--blocks", "64", "--pages-per-block", "16",
            "--streams", "2", "--ticks", "100", "--json"]
    borrowed = {}
    for flag in ("--label-fallback", "--no-label-fallback"):
        assert main(args + [flag]) == 0
        out = json.loads(capsys.readouterr().out)
        assert not out["overflow"]
        borrowed[flag] = out["label_fallback_pages"]
    assert borrowed["--no-label-fallback"] == 0
    assert borrowed["--label-fallback"] > 0  # 64 blocks: the pool runs short and labels borrow
