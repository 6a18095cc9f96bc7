import json

import numpy as np
import pytest

from hbfjax import traces
from hbfjax.traces import TraceError, load_trace


def test_shared_traces_load_with_their_row_counts(real_trace):
    azure = load_trace(real_trace("azure_llm_2023_code.csv"))
    mooncake = load_trace(real_trace("mooncake_conversation.jsonl"))
    swe = load_trace(real_trace("swebench_miniswe_agent.csv"))
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
    assert t.block_tokens == 16 and t.block_hashes == ((1, 2), (1, 2, 3), (1, 2, 3, 4))
    assert list(t.root_start_s) == [0.0, 0.0, 0.0]


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
    ("big.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,2147483648,1\n", "= 2147483648: must be <= 2147483647"),
    ("huge.csv", AZURE_HEADER + "2023-11-16 18:17:03.97,1e300,1\n", "= 1e+300: must be <= 2147483647"),
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


# --- SWE-bench as published: one JSONL file per session ----------------------------------------------------

FIELDS = ("arrival_s", "input_tokens", "output_tokens", "session", "parent", "prefix_tokens")


def _same_requests(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def _session_files(folder):
    """Two sessions; s1's file is not in time order (as upstream): prefixes follow the file, parents the clock."""
    p1 = "a" * 40
    s1 = [(1_000_000, p1, "b" * 8), (3_000_000, p1 + "c" * 20, "e" * 20), (2_000_000, p1 + "cccc" + "d" * 36, "")]
    s2 = [(1_500_000, "é" * 16 + "x" * 8, "ok!!")]  # characters, not UTF-8 bytes, are counted
    folder.mkdir()
    for sid, turns in (("s1", s1), ("s2", s2)):
        (folder / f"{sid}.jsonl").write_text("".join(
            json.dumps({"timestamp": t, "input": i, "output": o, "session_id": sid}) + "\n" for t, i, o in turns),
            encoding="utf-8")
    return folder


def test_swebench_jsonl_sessions_give_the_same_trace_as_their_derived_csv(tmp_path):
    jsonl = load_trace(_session_files(tmp_path / "sessions"))
    csv_path = tmp_path / "derived.csv"
    csv_path.write_text("session_id,timestamp_us,input_chars,output_chars,prefix_chars_shared_with_previous_turn\n"
                        "s1,1000000,40,8,0\ns1,3000000,60,20,40\ns1,2000000,80,0,44\ns2,1500000,24,4,0\n")
    derived = load_trace(csv_path)
    assert _same_requests(jsonl, derived) and jsonl.name == "sessions"
    assert list(jsonl.arrival_s) == [0.0, 0.5, 1.0, 2.0]
    assert list(jsonl.input_tokens) == [10, 6, 20, 15] and list(jsonl.output_tokens) == [2, 1, 0, 5]
    assert list(jsonl.prefix_tokens) == [0, 0, 11, 10]  # 44 and 40 shared characters with the file's previous line
    assert list(jsonl.session) == [0, 1, 0, 0] and list(jsonl.parent) == [-1, -1, 0, 2]
    one = load_trace(tmp_path / "sessions" / "s2.jsonl")  # a single session file loads alone
    assert (list(one.input_tokens), list(one.output_tokens), list(one.prefix_tokens)) == ([6], [1], [0])
    assert list(load_trace(tmp_path / "sessions" / "s1.jsonl").prefix_tokens) == [0, 11, 10]


def test_swebench_jsonl_rows_are_checked(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 1, "input": "abc", "output": "d", "session_id": "s"}\n'
                 '{"timestamp": 2, "input": ["abc"], "output": "d", "session_id": "s"}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: field 'input' must be a string"):
        load_trace(p)


@pytest.mark.parametrize("a,b,expected", [("", "abc", 0), ("abc", "abd", 2), ("abc", "abc", 3), ("abc", "abcdef", 3),
                                          ("x" * 9000 + "y", "x" * 9000 + "z", 9000), ("x" * 8192, "x" * 8192, 8192),
                                          ("éé" + "a", "éé" + "b", 2)])
def test_common_prefix_counts_characters(a, b, expected):
    assert traces.common_prefix_chars(a, b) == expected == traces.common_prefix_chars(b, a)


def test_fetched_upstream_sessions_match_the_shared_csv():
    """Real data: the upstream JSONL folder (after `hbfjax traces fetch`) and the shared derived CSV."""
    def first(name):
        found = [d / name for d in traces.search_path() if (d / name).exists()]
        if not found:
            pytest.skip(f"{name} not found in {traces.search_path()}; the comparison needs the upstream sessions "
                        "(hbfjax traces fetch swebench_miniswe_agent) and the derived CSV of ../shared/traces")
        return found[0]

    folder, shared = first("swebench_miniswe_agent"), first("swebench_miniswe_agent.csv")
    assert _same_requests(load_trace(folder), load_trace(shared)) and len(load_trace(shared)) == 402


# --- where bare names are looked up ------------------------------------------------------------------------

@pytest.fixture
def three_dirs(tmp_path, monkeypatch):
    env, user, shared = (tmp_path / n for n in ("env", "xdg", "shared"))
    monkeypatch.setenv("HBFJAX_TRACE_DIR", str(env))
    monkeypatch.setenv("XDG_DATA_HOME", str(user))
    monkeypatch.setattr(traces, "shared_trace_dir", lambda: shared)
    user = user / "hbfjax" / "traces"
    for d in (env, user, shared):
        d.mkdir(parents=True)
    return env, user, shared


def test_bare_names_are_looked_up_env_then_user_data_then_shared(three_dirs, monkeypatch):
    env, user, shared = three_dirs
    assert traces.search_path() == [env, user, shared] and traces.fetch_dir() == env
    name = "azure_llm_2023_code.csv"
    for d in (shared, user, env):  # each folder added shadows the later ones
        (d / name).write_text(AZURE_HEADER + "2023-11-16 18:17:03.5,12,3\n")
        assert traces.resolve(name) == d / name
    assert traces.resolve("azure_llm_2023_code") == env / name  # the catalogue name works too
    monkeypatch.delenv("HBFJAX_TRACE_DIR")
    assert traces.search_path() == [user, shared] and traces.fetch_dir() == user


def test_fetched_swebench_folder_answers_for_the_shared_csv_name(three_dirs, tmp_path):
    _env, user, shared = three_dirs
    (shared / "swebench_miniswe_agent.csv").write_text(SWE_HEADER + "s,1,4,4,0\n")
    assert traces.resolve("swebench_miniswe_agent.csv") == shared / "swebench_miniswe_agent.csv"
    _session_files(user / "swebench_miniswe_agent")
    assert traces.resolve("swebench_miniswe_agent.csv") == user / "swebench_miniswe_agent"
    assert len(load_trace("swebench_miniswe_agent.csv")) == 4


def test_a_missing_catalogued_trace_names_the_fetch_command(three_dirs):
    with pytest.raises(traces.TraceMissing) as err:
        load_trace("swebench_miniswe_agent.csv")
    message = str(err.value)
    assert message.startswith("trace 'swebench_miniswe_agent.csv' not found (looked in ")
    assert all(str(d) in message for d in three_dirs)
    assert message.endswith("get it with: hbfjax traces fetch swebench_miniswe_agent")


# --- sessions from Mooncake block hashes -------------------------------------------------------------------

def _mooncake_file(tmp_path, rows):
    p = tmp_path / "moon.jsonl"
    p.write_text("".join(json.dumps(dict(timestamp=t, input_length=n, output_length=1, hash_ids=h)) + "\n"
                         for t, n, h in rows))
    return p


MOON_ROWS = [  # (timestamp ms, prompt tokens, 512-token block ids); the last row arrives fourth
    (0, 1500, [1, 2, 3]),  # root
    (1000, 700, [9, 8]),  # root: no block in common
    (2000, 2000, [1, 2, 4, 5]),  # shares [1, 2] with the first
    (3000, 1200, [1, 2, 3, 7]),  # shares [1, 2, 3] with the first (longest), prefix capped at its 1,200 tokens
    (4000, 600, [1, 2]),  # shares 2 blocks with three earlier requests: the latest (previous row) is its parent
    (5000, 300, [9]),  # shares [9] with the second and the last row: the latest, the last row
    (6000, 100, []),  # no blocks: a root
    (2500, 1600, [9, 8, 6]),  # shares [9, 8] with the second
]


def test_mooncake_sessions_are_rebuilt_from_the_longest_common_block_prefix(tmp_path):
    t = load_trace(_mooncake_file(tmp_path, MOON_ROWS))
    # arrival order: rows 0, 1, 2, 7, 3, 4, 5, 6
    assert list(t.arrival_s) == [0.0, 1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0]
    assert list(t.parent) == [-1, -1, 0, 1, 0, 4, 3, -1]
    assert list(t.session) == [0, 1, 0, 1, 0, 0, 1, 7]
    assert list(t.prefix_tokens) == [0, 0, 1024, 1024, 1200, 600, 300, 0]
    assert list(t.root_start_s) == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 6.0]
    assert t.block_tokens == 512 and t.block_hashes[3] == (9, 8, 6) and t.block_hashes[7] == ()
    two = traces.load_mooncake_jsonl(_mooncake_file(tmp_path, MOON_ROWS), min_shared_blocks=2)
    assert list(two.parent) == [-1, -1, 0, 1, 0, 4, -1, -1]  # the one-block match is no longer a parent
    assert list(two.session) == [0, 1, 0, 1, 0, 0, 6, 7]
    assert list(two.prefix_tokens) == list(t.prefix_tokens)  # a reusable prefix need not be a parent's


def test_a_prefix_every_request_shares_is_a_system_prompt_not_a_session(tmp_path):
    rows = [(t, n + 512, [0] + h) for t, n, h in MOON_ROWS]  # every prompt now begins with block 0
    t = load_trace(_mooncake_file(tmp_path, rows))
    assert list(t.parent) == [-1, -1, 0, 1, 0, 4, 3, -1]  # the same links as without block 0
    assert list(t.prefix_tokens) == [0, 512, 1536, 1536, 1712, 1112, 812, 512]  # block 0 is reusable KV
    one = traces.load_mooncake_jsonl(_mooncake_file(tmp_path, rows), min_shared_blocks=1)
    assert len(set(one.session)) == 1  # linking on the shared block makes one session


def _naive_common_blocks(hash_lists):
    """Plain Python: for each request, the longest block prefix an earlier one began with, and the latest such."""
    last_with_prefix: dict = {}
    out = []
    for i, h in enumerate(hash_lists):
        best = max((k for k in range(1, len(h) + 1) if tuple(h[:k]) in last_with_prefix), default=0)
        out.append((best, last_with_prefix[tuple(h[:best])] if best else -1))
        for k in range(1, len(h) + 1):
            last_with_prefix[tuple(h[:k])] = i
    return out


def test_real_mooncake_sessions_match_a_plain_python_reconstruction(real_trace):
    path = real_trace("mooncake_conversation.jsonl")
    rows = [json.loads(line) for line in open(path)]
    t = load_trace(path)
    head = 2000  # the file is in time order; a request's links depend on earlier requests only
    assert [r["timestamp"] / 1e3 for r in rows[:head]] == list(t.arrival_s[:head])
    naive = _naive_common_blocks([r["hash_ids"] for r in rows[:head]])
    # every prompt begins with the same block (a shared system prompt), so a parent shares at least two
    assert len({r["hash_ids"][0] for r in rows}) == 1 and min(len(r["hash_ids"]) for r in rows) >= 1
    assert [s if b >= 2 else -1 for b, s in naive] == list(t.parent[:head])
    assert [min(b * 512, r["input_length"]) for (b, _), r in zip(naive, rows)] == list(t.prefix_tokens[:head])
    assert len(np.unique(t.session)) == 7373 and np.all(t.root_start_s == t.arrival_s[t.session])
    one = traces.load_mooncake_jsonl(path, min_shared_blocks=1)  # linking on the system prompt: one session
    assert len(np.unique(one.session)) == 1 and int((one.parent >= 0).sum()) == len(rows) - 1
    assert len(t.block_hashes) == len(rows) and t.block_tokens == 512


def test_schemas_without_block_hashes_have_none(real_trace):
    for name in ("azure_llm_2023_code.csv", "swebench_miniswe_agent.csv"):
        t = load_trace(real_trace(name))
        assert t.block_hashes is None and t.block_tokens is None
    swe = load_trace(real_trace("swebench_miniswe_agent.csv"))
    assert np.array_equal(swe.root_start_s, swe.arrival_s[swe.session]) and np.all(swe.root_start_s <= swe.arrival_s)
