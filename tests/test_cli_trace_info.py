"""``hbfjax trace-info``: statistics checked against values computed here from the raw files."""

import csv
import json
from datetime import datetime

import numpy as np
import pytest

from hbfjax.cli import main

TOKEN_KEYS = ("p50", "p90", "p99", "mean", "max")


def _info(capsys, *argv) -> dict:
    assert main(["trace-info", *map(str, argv), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def _tokens(values) -> dict:
    x = np.asarray(values, np.float64)
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return dict(zip(TOKEN_KEYS, (p50, p90, p99, x.mean(), x.max())))


def _check(info, n, duration, prompt, output, sessions, fraction):
    assert info["requests"] == n
    assert info["duration_s"] == pytest.approx(duration, abs=1e-6)
    assert info["arrival_rate_per_s"] == pytest.approx((n - 1) / duration, rel=1e-9)
    for name, values in (("prompt_tokens", prompt), ("output_tokens", output)):
        for key, value in _tokens(values).items():
            assert info[f"{name}_{key}"] == pytest.approx(value, rel=1e-12), f"{name}_{key}"
    assert info["sessions"] == sessions and info["mean_turns_per_session"] == pytest.approx(n / sessions)
    if fraction is None:
        assert info["prefix_reusable_block_fraction"] is None
    else:
        assert info["prefix_reusable_block_fraction"] == pytest.approx(fraction, rel=1e-12)


def _reusable_blocks(hash_lists) -> tuple[int, int]:
    """(blocks whose whole block prefix began an earlier request, all blocks): rolling prefix keys."""
    seen, reused = set(), 0
    for hashes in hash_lists:
        key, new = (), []
        for h in hashes:
            key = (key, h)  # the prefix up to and including this block
            if key in seen and not new:
                reused += 1
            else:
                new.append(key)
        seen.update(new)
    return reused, sum(map(len, hash_lists))


def test_azure_statistics_match_the_raw_csv(capsys, real_trace):
    path = real_trace("azure_llm_2023_code.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    stamps = [datetime.strptime(r["TIMESTAMP"][:19], "%Y-%m-%d %H:%M:%S").timestamp() + float("0" + r["TIMESTAMP"][19:])
              for r in rows]
    info = _info(capsys, path)
    _check(info, len(rows), max(stamps) - min(stamps), [int(r["ContextTokens"]) for r in rows],
           [int(r["GeneratedTokens"]) for r in rows], len(rows), None)


def test_mooncake_statistics_match_the_raw_jsonl(capsys, real_trace):
    path = real_trace("mooncake_conversation.jsonl")
    rows = [json.loads(line) for line in open(path)]
    rows.sort(key=lambda r: r["timestamp"])
    # every prompt begins with the same block (a system prompt), so a request links to an earlier one only
    # when they share their first two blocks; a root is a request whose first two blocks are new
    assert len({r["hash_ids"][0] for r in rows}) == 1
    seen, roots = set(), 0
    for r in rows:
        head = tuple(r["hash_ids"][:2])
        roots += len(head) < 2 or head not in seen
        seen.add(head)
    reused, total = _reusable_blocks([r["hash_ids"] for r in rows])
    info = _info(capsys, "mooncake_conversation.jsonl")  # a bare name, looked up along the search path
    assert info["trace"] == str(path)
    _check(info, len(rows), (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1e3, [r["input_length"] for r in rows],
           [r["output_length"] for r in rows], roots, reused / total)
    assert roots == 7373 and 0.3 < reused / total < 0.4


def test_swebench_statistics_match_the_raw_csv(capsys, real_trace):
    path = real_trace("swebench_miniswe_agent.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    t = [int(r["timestamp_us"]) / 1e6 for r in rows]
    _check(_info(capsys, path), len(rows), max(t) - min(t), [max(1, round(int(r["input_chars"]) / 4)) for r in rows],
           [round(int(r["output_chars"]) / 4) for r in rows], len({r["session_id"] for r in rows}), None)


def test_a_small_bailian_trace_counts_reused_blocks(capsys, tmp_path):
    rows = [dict(chat_id=1, parent_chat_id=-1, timestamp=0.0, input_length=40, output_length=3, type="text", turn=1,
                 hash_ids=[7, 8, 9]),
            dict(chat_id=2, parent_chat_id=1, timestamp=4.0, input_length=60, output_length=5, type="text", turn=2,
                 hash_ids=[7, 8, 9, 10]),
            dict(chat_id=3, parent_chat_id=-1, timestamp=10.0, input_length=20, output_length=8, type="text", turn=1,
                 hash_ids=[7, 11])]
    p = tmp_path / "bailian.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = _info(capsys, p)
    # blocks 7, 8, 9 of the second request and 7 of the third began an earlier prompt: 4 of 9
    _check(info, 3, 10.0, [40, 60, 20], [3, 5, 8], 2, 4 / 9)
    assert _reusable_blocks([r["hash_ids"] for r in rows]) == (4, 9)


def test_text_output_lists_every_key(capsys, tmp_path):
    p = tmp_path / "one.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5,12,3\n")
    assert main(["trace-info", str(p)]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines["requests"] == "1" and lines["arrival_rate_per_s"] == "None"  # one instant: no rate
    assert lines["prompt_tokens_p99"] == "12" and lines["prefix_reusable_block_fraction"] == "None"


@pytest.mark.parametrize("text", ["hello,world\n", '{"timestamp": 0, "input_length": -5, "output_length": 1}\n'])
def test_a_bad_file_exits_2_with_one_line(capsys, tmp_path, text):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    assert main(["trace-info", str(p), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("hbfjax trace-info: error: ") and "bad.jsonl" in err


def test_a_missing_trace_exits_2_naming_where_it_looked(capsys):
    assert main(["trace-info", "no_such_trace.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found (looked in" in err
