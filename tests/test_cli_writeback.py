"""`hbfjax writeback` end to end: the documented keys of the rollout and of the synthetic backlog."""

import json

from hbfjax.cli import main


def test_cli_reports_the_documented_keys(capsys):
    assert main(["writeback", "--policy", "stripe", "--layers", "2", "--iterations", "4", "--streams", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("stall_us_per_iteration", "ci95_stall_us", "program_busy_us_per_iteration", "buffer_peak_bytes",
                "forced_writebacks"):
        assert key in out
    assert main(["writeback", "--synthetic", "--pages-per-iter", "2", "--window-pages", "3", "--iterations", "200",
                 "--streams", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"mean_backlog_pages", "p_backlog_positive", "exact_mean_backlog_pages"} <= set(out)
    assert main(["writeback", "--synthetic", "--pages-per-iter", "2"]) == 2
    assert "needs --pages-per-iter and --window-pages" in capsys.readouterr().err
