import json

import numpy as np
import pytest

from hbfjax import traces
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


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SWE_HEADER = "session_id,timestamp_us,input_chars,output_chars,prefix_chars_shared_with_previous_turn\n"


def _mooncake_line(**fields):
    row = dict(timestamp=0, input_length=5, output_length=1, hash_ids=[1])
    row.update(fields)
    return json.dumps(row)


@pytest.mark.parametrize("name,text,fragment", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,12,3\n2023-11-16 18:17:04.1,x,3\n",
     ":3: field 'ContextTokens' = 'x' is not a number"),
    ("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,3\n", ":2: TIMESTAMP = 'yesterday'"),
    ("c.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5\n',
     ":2: not valid JSON"),
    ("d.jsonl", '{"timestamp": 0, "input_length": -5, "output_length": 1}\n', "must be >= 1"),
    ("e.txt", "hello,world\n", "unknown trace schema"),
    ("header.csv", AZURE_HEADER, "no requests"),
    ("swe_header.csv", SWE_HEADER, "no requests"),
    ("empty.jsonl", "", "no requests"),
    ("blank.jsonl", "\n  \n\n", "no requests"),
    ("nested.jsonl", _mooncake_line(hash_ids=[[1, 2], 3]), ":1: field 'hash_ids' = [[1, 2], 3] must be a list of integers"),
    ("strhash.jsonl", _mooncake_line() + "\n" + _mooncake_line(hash_ids=["a"]), ":2: field 'hash_ids'"),
    ("floathash.jsonl", _mooncake_line(hash_ids=[1.5]), "must be a list of integers"),
    ("scalarhash.jsonl", _mooncake_line(hash_ids=7), "must be a list of integers"),
    ("neg.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,-3,1\n", ":2: field 'ContextTokens' = -3: must be >= 1"),
    ("frac.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,12,2.5\n", ":2: field 'GeneratedTokens' = 2.5: must be an integer"),
    ("big.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,2147483648,1\n", "= 2147483648: must be >= 1 and <= 2147483647"),
    ("huge.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,1e300,1\n", "<= 2147483647"),
    ("nan.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,nan,1\n", "field 'ContextTokens' = nan: must be an integer"),
    ("inf.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,12,inf\n", "field 'GeneratedTokens' = inf: must be an integer"),
    ("nan.jsonl", '{"timestamp": NaN, "input_length": 5, "output_length": 1}\n', "field 'timestamp' = nan: must be finite"),
    ("inf.jsonl", '{"timestamp": 0, "input_length": Infinity, "output_length": 1}\n', "= inf: must be an integer"),
    ("bool.jsonl", '{"timestamp": 0, "input_length": true, "output_length": 1}\n', "= True: must be an integer"),
    ("bad_line.jsonl", _mooncake_line() + "\n\n" + '{"timestamp": 1, "input_length": 5,, }\n', ":3: not valid JSON"),
    ("array_line.jsonl", _mooncake_line() + "\n[1, 2]\n", ":2: expected a JSON object, got list"),
    ("swe_frac.csv", SWE_HEADER + "a,1000000,4.5,8,0\n", ":2: field 'input_chars' = 4.5: must be an integer"),
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


def test_undecodable_bytes_name_the_file_and_line(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes(AZURE_HEADER.encode() + b"2023-11-16 18:17:03.97,12,1\n2023-11-16 18:17:04.5,1\xe92,1\n")
    with pytest.raises(TraceError, match=r"latin1\.csv:3: not UTF-8 text \(byte 0xe9"):
        load_trace(p)


def test_a_directory_is_not_a_trace_file(tmp_path):
    with pytest.raises(TraceError, match="is a directory, not a trace file"):
        traces.load_azure_csv(tmp_path)
    with pytest.raises(TraceError, match="is a directory with no \\*.jsonl session files"):
        load_trace(tmp_path)


def test_byte_order_mark_is_allowed_in_csv_and_jsonl(tmp_path):
    csv_path = tmp_path / "bom.csv"
    csv_path.write_bytes(b"\xef\xbb\xbf" + (AZURE_HEADER + "2023-11-16 18:17:03.5,12,3\n2023-11-16 18:17:05.25,7,2\n"
                                           ).encode())
    azure = load_trace(csv_path)
    assert list(azure.arrival_s) == [0.0, 1.75] and list(azure.input_tokens) == [12, 7]
    jsonl_path = tmp_path / "bom.jsonl"
    jsonl_path.write_bytes(b"\xef\xbb\xbf" + (_mooncake_line(timestamp=2000, hash_ids=[4, 5]) + "\n"
                                             + _mooncake_line(timestamp=500, input_length=1024, hash_ids=[4, 6])
                                             + "\n").encode())
    moon = load_trace(jsonl_path)
    assert list(moon.arrival_s) == [0.0, 1.5] and list(moon.input_tokens) == [1024, 5]
    assert list(moon.prefix_tokens) == [0, 5]  # block 4 seen first by the earlier request; capped at the prompt
