import json

import numpy as np
import pytest

from hbfjax.traces import TraceError, load_trace


def test_shared_traces_load_with_their_row_counts(trace_dir):
    azure = load_trace(trace_dir / "azure_llm_2023_code.csv")
    mooncake = load_trace(trace_dir / "mooncake_conversation.jsonl")
    swe = load_trace(trace_dir / "swebench_miniswe_agent.csv")
    # data rows in each file (the Azure file has 8,819 rows after its header)
    assert (len(azure), len(mooncake), len(swe)) == (8819, 12031, 402)
    for t in (azure, mooncake, swe):
        assert np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[0] == 0
        assert np.all(t.input_tokens >= 1) and np.all(t.prefix_tokens <= t.input_tokens)
    assert 3000 < azure.duration_s < 4000  # about one hour
    assert len(np.unique(swe.session)) == 20  # 20 agent sessions
    assert np.sum(swe.parent >= 0) == 402 - 20  # every turn but the first of a session has a parent
    assert mooncake.prefix_tokens.mean() > 0  # shared 512-token blocks are detected


def test_swebench_characters_become_tokens_at_four_per_token(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("session_id,timestamp_us,input_chars,output_chars,prefix_chars_shared_with_previous_turn\n"
                 "a,2000000,400,40,0\na,1000000,800,80,0\n")
    t = load_trace(p)
    assert list(t.input_tokens) == [200, 100] and list(t.output_tokens) == [20, 10]
    assert list(t.parent) == [-1, 0] and list(t.session) == [0, 0] and list(t.arrival_s) == [0.0, 1.0]


def test_bailian_schema_links_turns_to_their_root(tmp_path):
    rows = [dict(chat_id=10, parent_chat_id=-1, timestamp=0.0, input_length=32, output_length=5, type="text", turn=1,
                 hash_ids=[1, 2]),
            dict(chat_id=11, parent_chat_id=10, timestamp=2.0, input_length=48, output_length=5, type="text", turn=2,
                 hash_ids=[1, 2, 3]),
            dict(chat_id=12, parent_chat_id=11, timestamp=3.0, input_length=64, output_length=5, type="text", turn=3,
                 hash_ids=[1, 2, 3, 4])]
    p = tmp_path / "bailian.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = load_trace(p)
    assert list(t.parent) == [-1, 0, 1] and list(t.session) == [0, 0, 0]
    assert list(t.prefix_tokens) == [0, 32, 48]  # 16-token blocks already seen


@pytest.mark.parametrize("name,text,fragment", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,12,3\n2023-11-16 18:17:04.1,x,3\n",
     ":3: field 'ContextTokens' = 'x' is not a number"),
    ("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,3\n", ":2: TIMESTAMP = 'yesterday'"),
    ("c.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5\n',
     ":2: not valid JSON"),
    ("d.jsonl", '{"timestamp": 0, "input_length": -5, "output_length": 1}\n', "must be >= 1"),
    ("e.txt", "hello,world\n", "unknown trace schema"),
])
def test_malformed_rows_name_file_line_and_problem(tmp_path, name, text, fragment):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert fragment in str(err.value) and name in str(err.value)


def test_missing_trace_says_where_it_looked():
    with pytest.raises(TraceError, match="not found"):
        load_trace("no_such_trace.csv")
