"""Request-trace loaders: Azure LLM 2023 CSV, Mooncake JSONL, SWE-bench agent CSV or per-session JSONL,
Alibaba Bailian JSONL.

Every loader returns a :class:`Trace` of NumPy columns sorted by arrival time, and raises
:class:`TraceError` naming the file, the line and the problem for a malformed row (never a bare
traceback): files are read as UTF-8 (a byte-order mark is allowed), lengths must be whole numbers in
the int32 range, times finite. A bare trace name is looked up along :func:`search_path`
(``$HBFJAX_TRACE_DIR``, the per-user data folder that ``hbfjax traces fetch`` fills, then
``../shared/traces`` beside the repository); a catalogued trace that is nowhere raises
:class:`TraceMissing`, whose message names the command that gets it. Any other file of a supported
schema loads the same way.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from hbfjax import trace_catalog
from hbfjax.validate import ConfigError, INT32_MAX, require_int, require_real

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake hash_ids cover 512-token prompt blocks
BAILIAN_BLOCK_TOKENS = 16  # Bailian hash_ids cover 16-token blocks
CHARS_PER_TOKEN = 4.0  # usual estimate for the SWE-bench character counts
MAX_TIMESTAMP_US = 2**53  # µs timestamps stay exact in float64 below this


class TraceError(ValueError):
    """A trace file is missing, unreadable, of unknown schema, or has a malformed row."""


class TraceMissing(TraceError):
    """A trace is in none of the folders of :func:`search_path`; the message says how to get it."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests of one trace, one entry per request, sorted by arrival.

    ``session`` groups the turns of one conversation/agent task (the root request's index);
    ``parent`` is the index of the previous turn (−1 for a root); ``prefix_tokens`` is the prompt
    prefix already held in KV by an earlier request (0 when the schema cannot tell).
    ``block_hashes`` are each request's prompt block ids (``block_tokens`` tokens a block; equal ids
    = the same block) where the schema has them (Mooncake, Bailian), else None.
    """

    name: str
    arrival_s: np.ndarray  # [R] float64, seconds from the first request
    input_tokens: np.ndarray  # [R] int64
    output_tokens: np.ndarray  # [R] int64
    session: np.ndarray  # [R] int64, index of the session's root request
    parent: np.ndarray  # [R] int64, index of the parent request or -1
    prefix_tokens: np.ndarray  # [R] int64, reusable prefix tokens
    block_hashes: tuple[tuple[int, ...], ...] | None = None  # [R] prompt block ids, or None
    block_tokens: int | None = None  # tokens per hashed block, or None

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def root_start_s(self) -> np.ndarray:
        """[R] float64: arrival of each request's session root, the lifetime label (HBFlex §5.4)."""
        return self.arrival_s[self.session]

    @property
    def context_tokens(self) -> np.ndarray:
        """Tokens of KV a request holds when it finishes: prompt + generated."""
        return self.input_tokens + self.output_tokens


# --- where traces live ---------------------------------------------------------------------------

def user_data_dir() -> Path:
    """Per-user trace folder: ``$XDG_DATA_HOME/hbfjax/traces`` (default ``~/.local/share/hbfjax/traces``)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "hbfjax" / "traces"


def shared_trace_dir() -> Path:
    """``shared/traces`` beside the repository (what CI provides next to every clone)."""
    import hbfjax

    return Path(hbfjax.__file__).resolve().parent.parent.parent / "shared" / "traces"


def fetch_dir() -> Path:
    """Where ``hbfjax traces fetch`` writes: ``$HBFJAX_TRACE_DIR`` if set, else :func:`user_data_dir`."""
    env = os.environ.get("HBFJAX_TRACE_DIR")
    return Path(env) if env else user_data_dir()


def search_path() -> list[Path]:
    """Folders a bare trace name is looked up in, first match wins: ``$HBFJAX_TRACE_DIR`` (if set),
    the per-user data folder, ``shared/traces`` beside the repository."""
    env = os.environ.get("HBFJAX_TRACE_DIR")
    return ([Path(env)] if env else []) + [user_data_dir(), shared_trace_dir()]


def fetch_hint(name: str) -> str:
    """How to get the trace ``name``: the fetch command for a catalogued trace, else where to put it."""
    source = trace_catalog.find(Path(name).name)
    if source is not None:
        return f"get it with: hbfjax traces fetch {source.name}"
    return "not a catalogued trace (hbfjax traces list); give its path"


def _candidates(name: str) -> list[str]:
    """File or folder names that hold the trace ``name``: itself, then its catalogue local name and aliases."""
    source = trace_catalog.find(name)
    extra = [] if source is None else [source.local, *source.aliases]
    return list(dict.fromkeys([name, *extra]))


def resolve(path_or_name: str | os.PathLike) -> Path:
    """A trace path: an existing path as given, else a relative name looked up along :func:`search_path`
    (a catalogued trace also under its other names, e.g. the fetched SWE-bench folder for the shared CSV)."""
    p = Path(path_or_name)
    if p.exists():
        return p
    folders = search_path()
    if not p.is_absolute():
        names = _candidates(str(p)) if len(p.parts) == 1 else [str(p)]
        for folder in folders:
            for candidate in names:
                if (folder / candidate).exists():
                    return folder / candidate
    raise TraceMissing(f"trace {str(path_or_name)!r} not found (looked in {', '.join(map(str, folders))}); "
                       f"{fetch_hint(str(path_or_name))}")


# --- reading files -------------------------------------------------------------------------------

def _text_lines(path: Path):
    """``(line number, text)`` of a UTF-8 file (a leading byte-order mark dropped), each line decoded alone
    so an undecodable byte is reported with its line."""
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    try:
        fh = open(path, "rb")
    except OSError as err:
        raise TraceError(f"{path}: cannot read ({err.strerror})") from None
    with fh:
        for line, raw in enumerate(fh, start=1):
            try:
                yield line, raw.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise TraceError(f"{path}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x} at byte "
                                 f"{err.start + 1} of the line)") from None


def _csv_rows(path: Path):
    """``(line number, row dict)`` of a CSV file with a header."""
    lines = (text for _, text in _text_lines(path))
    reader = csv.DictReader(lines)
    for row in reader:
        yield reader.line_num, row


def _read_jsonl(path: Path):
    """``(line number, object)`` of every non-blank line of a JSONL file."""
    for line, text in _text_lines(path):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}:{line}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise TraceError(f"{path}:{line}: expected a JSON object, got {type(row).__name__}")
        yield line, row


def _raw(path: Path, line: int, row: dict, key: str):
    value = row.get(key)
    if value is None or value == "":
        raise TraceError(f"{path}:{line}: missing field {key!r}")
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                raise TraceError(f"{path}:{line}: field {key!r} = {value!r} is not a number") from None
    return value


def _int_field(path: Path, line: int, row: dict, key: str, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    """A whole number in [minimum, maximum] (default: the int32 range the simulator indexes with)."""
    raw = _raw(path, line, row, key)
    try:
        value = require_int("", f"field {key!r}", raw, None, None)
    except ConfigError as err:
        raise TraceError(f"{path}:{line}: {err}") from None
    for ok, rule in ((value >= minimum, f"must be >= {minimum}"), (value <= maximum, f"must be <= {maximum}")):
        if not ok:
            raise TraceError(f"{path}:{line}: field {key!r} = {raw!r}: {rule}")
    return value


def _float_field(path: Path, line: int, row: dict, key: str) -> float:
    """A finite number."""
    try:
        return require_real("", f"field {key!r}", _raw(path, line, row, key))
    except ConfigError as err:
        raise TraceError(f"{path}:{line}: {err}") from None


def _key_field(path: Path, line: int, row: dict, key: str, default=None):
    """An identifier (an integer or a non-empty string)."""
    value = row.get(key, default)
    if isinstance(value, str):
        value = value.strip()
    if value is None or value == "":
        raise TraceError(f"{path}:{line}: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TraceError(f"{path}:{line}: field {key!r} = {value!r} must be an integer or a string")
    return value


def _text_field(path: Path, line: int, row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise TraceError(f"{path}:{line}: field {key!r} must be a string (the prompt or completion text)")
    return value


def _hash_ids(path: Path, line: int, row: dict) -> list:
    """``hash_ids``: a flat list of integer block ids (absent: no blocks)."""
    ids = row.get("hash_ids", [])
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
        raise TraceError(f"{path}:{line}: field 'hash_ids' = {str(ids)[:60]} must be a list of integers")
    return ids


def _finish(path: Path, arrival, inp, out, session, parent, prefix, hashes=None, block_tokens=None) -> Trace:
    arrival = np.asarray(arrival, np.float64)
    if arrival.size == 0:
        raise TraceError(f"{path}: no requests (the file has no data rows)")
    order = np.argsort(arrival, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    remap = lambda idx: np.where(np.asarray(idx) >= 0, rank[np.maximum(np.asarray(idx), 0)], -1)  # noqa: E731
    return Trace(
        name=path.stem,
        arrival_s=arrival[order] - arrival[order[0]],
        input_tokens=np.asarray(inp, np.int64)[order],
        output_tokens=np.asarray(out, np.int64)[order],
        session=remap(np.asarray(session, np.int64))[order],
        parent=remap(np.asarray(parent, np.int64))[order],
        prefix_tokens=np.asarray(prefix, np.int64)[order],
        block_hashes=None if hashes is None else tuple(tuple(hashes[i]) for i in order),
        block_tokens=None if hashes is None else block_tokens,
    )


def _prefix_from_hashes(hash_lists, input_tokens, block_tokens: int) -> np.ndarray:
    """Leading prompt blocks whose hash an earlier request already had, in tokens (capped at the prompt)."""
    seen: set = set()
    prefix = np.zeros(len(hash_lists), np.int64)
    for i, hashes in enumerate(hash_lists):
        shared = 0
        for h in hashes:
            if h not in seen:
                break
            shared += 1
        prefix[i] = min(shared * block_tokens, input_tokens[i])
        seen.update(hashes)
    return prefix


def _prefix_in_arrival_order(arrival, inp, hashes, block_tokens: int) -> np.ndarray:
    """:func:`_prefix_from_hashes` over the requests sorted by arrival, returned in file order."""
    order = np.argsort(np.asarray(arrival), kind="stable")
    prefix_sorted = _prefix_from_hashes([hashes[i] for i in order], np.asarray(inp)[order], block_tokens)
    prefix = np.empty_like(prefix_sorted)
    prefix[order] = prefix_sorted
    return prefix


# --- loaders -------------------------------------------------------------------------------------

def load_azure_csv(path: str | os.PathLike) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP,ContextTokens,GeneratedTokens`` (no sessions)."""
    path = resolve(path)
    arrival, inp, out = [], [], []
    for line, row in _csv_rows(path):
        stamp = row.get("TIMESTAMP")
        try:
            # 7 fractional digits: datetime takes at most 6
            head, _, frac = (stamp or "").partition(".")
            t = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp() + float("0." + (frac or "0"))
        except ValueError:
            raise TraceError(f"{path}:{line}: TIMESTAMP = {stamp!r} is not 'YYYY-MM-DD HH:MM:SS.f'") from None
        arrival.append(t)
        inp.append(_int_field(path, line, row, "ContextTokens", 1))
        out.append(_int_field(path, line, row, "GeneratedTokens", 0))
    n = len(arrival)
    return _finish(path, arrival, inp, out, np.arange(n), -np.ones(n), np.zeros(n))


def shared_prefix_blocks(hash_lists) -> tuple[np.ndarray, np.ndarray]:
    """Per request (in the given order, i.e. arrival): the number of leading prompt blocks whose whole
    block prefix an earlier request also began with, and the latest such earlier request (−1: none).

    A trie of block-prefix paths, each node holding the last request that passed through it: one walk
    per request, O(blocks) in all. The blocks counted are the longest common block prefix with any
    earlier request; among the earlier requests sharing that many, the latest is returned.
    """
    child: dict = {}  # (node, block id) -> node; node 0 is the empty prefix
    last: list[int] = [-1]  # node -> latest request through it
    shared = np.zeros(len(hash_lists), np.int64)
    source = np.full(len(hash_lists), -1, np.int64)
    for i, hashes in enumerate(hash_lists):
        path = [0]  # nodes of the prefixes earlier requests made, walked down from the root
        for h in hashes:
            nxt = child.get((path[-1], h))
            if nxt is None:
                break
            path.append(nxt)
        depth = len(path) - 1
        shared[i], source[i] = depth, last[path[-1]] if depth else -1
        for node in path:
            last[node] = i
        node = path[-1]
        for h in hashes[depth:]:  # this request's new blocks extend the trie
            child[(node, h)] = len(last)
            node = len(last)
            last.append(i)
    return shared, source


def universal_prefix_blocks(hash_lists) -> int:
    """Leading blocks that every request's prompt begins with (a trace-wide system prompt)."""
    if not hash_lists:
        return 0
    first = hash_lists[0]
    n = len(first)
    for hashes in hash_lists[1:]:
        k = 0
        while k < min(n, len(hashes)) and hashes[k] == first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return n


def block_sessions(hash_lists, input_tokens, block_tokens: int, min_shared_blocks: int | None = None):
    """Sessions reconstructed from prompt block hashes, in the given (arrival) order.

    A request's parent is the earlier request with the longest common block prefix (ties: the latest
    such request), if they share at least ``min_shared_blocks`` blocks, else it is a root; its session is
    its parent's. The default (None) is one block more than every request of the trace shares: a
    prefix common to all requests is a system prompt, not a conversation's history, and linking on it
    would make the whole trace one session (the published Mooncake conversation trace begins every
    prompt with the same block). A request's reusable prefix is its common blocks with any earlier
    request × ``block_tokens``, capped at its prompt, whether or not that request is its parent (a
    shared system prompt's KV is reusable too). Returns int64 ``(parent, session, prefix_tokens)``.
    """
    shared, source = shared_prefix_blocks(hash_lists)
    if min_shared_blocks is None:
        min_shared_blocks = universal_prefix_blocks(hash_lists) + 1
    linked = shared >= max(min_shared_blocks, 1)
    parent = np.where(linked, source, -1)
    session = np.arange(len(hash_lists), dtype=np.int64)
    for i in np.flatnonzero(linked):  # parents come first, so their session is already final
        session[i] = session[parent[i]]
    prefix = np.minimum(shared * block_tokens, np.asarray(input_tokens, np.int64))
    return parent, session, prefix


def load_mooncake_jsonl(path: str | os.PathLike, min_shared_blocks: int | None = None) -> Trace:
    """Mooncake FAST'25 trace: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
    (512-token prompt blocks). The schema has no session column: sessions, parents and reusable
    prefixes are reconstructed from the block hashes by :func:`block_sessions`. In the published
    conversation trace every prompt begins with the same block (a shared system prompt): linking on
    one block would make all 12,031 requests one session, so by default a parent must share one block
    more than that (7,373 sessions)."""
    path = resolve(path)
    arrival, inp, out, hashes = [], [], [], []
    for line, row in _read_jsonl(path):
        arrival.append(_float_field(path, line, row, "timestamp") / 1e3)
        inp.append(_int_field(path, line, row, "input_length", 1))
        out.append(_int_field(path, line, row, "output_length", 0))
        hashes.append(_hash_ids(path, line, row))
    order = np.argsort(np.asarray(arrival), kind="stable")
    hashes = [hashes[i] for i in order]
    arrival, inp, out = (np.asarray(c)[order] for c in (arrival, inp, out))
    parent, session, prefix = block_sessions(hashes, inp, MOONCAKE_BLOCK_TOKENS, min_shared_blocks)
    return _finish(path, arrival, inp, out, session, parent, prefix, hashes, MOONCAKE_BLOCK_TOKENS)


def _session_trace(path: Path, session_key, timestamp_us, input_chars, output_chars, prefix_chars) -> Trace:
    """SWE-bench agent requests from character counts (4 per token): a session's turns are linked in
    arrival order, each to the one before."""
    arrival = [t / 1e6 for t in timestamp_us]
    inp = [max(1, round(c / CHARS_PER_TOKEN)) for c in input_chars]
    out = [round(c / CHARS_PER_TOKEN) for c in output_chars]
    prefix = [round(c / CHARS_PER_TOKEN) for c in prefix_chars]
    n = len(arrival)
    order = np.argsort(np.asarray(arrival), kind="stable")
    session = np.empty(n, np.int64)
    parent = np.empty(n, np.int64)
    root: dict = {}
    last: dict = {}
    for i in order:
        key = session_key[i]
        session[i] = root.setdefault(key, i)
        parent[i] = last.get(key, -1)
        last[key] = i
    prefix = np.minimum(np.asarray(prefix, np.int64), np.asarray(inp, np.int64))
    return _finish(path, arrival, inp, out, session, parent, prefix)


def load_swebench_csv(path: str | os.PathLike) -> Trace:
    """SWE-bench agent sessions: ``session_id, timestamp_us, input_chars, output_chars,
    prefix_chars_shared_with_previous_turn`` — characters converted at 4 per token."""
    path = resolve(path)
    cols: tuple[list, ...] = ([], [], [], [], [])
    for line, row in _csv_rows(path):
        values = (_key_field(path, line, row, "session_id"),
                  _int_field(path, line, row, "timestamp_us", 0, MAX_TIMESTAMP_US),
                  _int_field(path, line, row, "input_chars", 1), _int_field(path, line, row, "output_chars"),
                  _int_field(path, line, row, "prefix_chars_shared_with_previous_turn"))
        for col, value in zip(cols, values):
            col.append(value)
    return _session_trace(path, *cols)


def common_prefix_chars(a: str, b: str, step: int = 4096) -> int:
    """Length (characters) of the longest common prefix of ``a`` and ``b``: compared ``step`` characters
    at a time, then bisected inside the first block that differs (linear work, in C)."""
    n = min(len(a), len(b))
    lo = 0
    while lo + step <= n and a[lo:lo + step] == b[lo:lo + step]:
        lo += step
    hi = min(lo + step, n)  # the common prefix ends in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _session_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix == ".jsonl" and p.is_file())
    if not files:
        raise TraceError(f"{path}: is a directory with no *.jsonl session files (a folder trace is the "
                         "SWE-bench agent schema, one JSONL file per session)")
    return files


def load_swebench_jsonl(path: str | os.PathLike) -> Trace:
    """SWE-bench agent sessions as published (LMCache/lmcache-agent-trace ``miniswe/``): a folder of JSONL
    files (or one file), each line a request with ``timestamp`` (µs), ``input`` (the full prompt text),
    ``output`` (the completion text), ``session_id``. Files are read in name order; a request's reusable
    prefix is the longest common prefix (characters) of its prompt and the previous prompt of its session
    in reading order. Gives the same :class:`Trace` as the derived CSV of :func:`load_swebench_csv`."""
    path = resolve(path)
    cols: tuple[list, ...] = ([], [], [], [], [])
    previous: dict = {}
    for file in _session_files(path):
        for line, row in _read_jsonl(file):
            sid = _key_field(file, line, row, "session_id")
            prompt = _text_field(file, line, row, "input")
            if not prompt:
                raise TraceError(f"{file}:{line}: field 'input' is empty (a request has a prompt)")
            values = (sid, _int_field(file, line, row, "timestamp", 0, MAX_TIMESTAMP_US), len(prompt),
                      len(_text_field(file, line, row, "output")), common_prefix_chars(previous.get(sid, ""), prompt))
            previous[sid] = prompt
            for col, value in zip(cols, values):
                col.append(value)
    return _session_trace(path, *cols)


def load_bailian_jsonl(path: str | os.PathLike) -> Trace:
    """Alibaba Bailian trace: ``chat_id, parent_chat_id, timestamp (s), input_length, output_length,
    type, turn, hash_ids`` (16-token blocks); ``parent_chat_id`` −1 marks a root request."""
    path = resolve(path)
    rows = []
    for line, row in _read_jsonl(path):
        root = row.get("parent_chat_id", -1) in (None, "", -1, "-1")
        parent_chat = -1 if root else _key_field(path, line, row, "parent_chat_id")
        rows.append((line, _key_field(path, line, row, "chat_id"), parent_chat,
                     _float_field(path, line, row, "timestamp"), _int_field(path, line, row, "input_length", 1),
                     _int_field(path, line, row, "output_length"), _hash_ids(path, line, row)))
    index = {}
    for i, (line, chat, *_rest) in enumerate(rows):
        if chat in index:
            raise TraceError(f"{path}:{line}: duplicate chat_id {chat!r}")
        index[chat] = i
    n = len(rows)
    parent = np.full(n, -1, np.int64)
    for i, (line, _chat, par, *_rest) in enumerate(rows):
        if par != -1:
            if par not in index:
                raise TraceError(f"{path}:{line}: parent_chat_id {par!r} is not a chat_id of this trace")
            parent[i] = index[par]
    session = np.arange(n)
    for i in range(n):  # follow parents to the root (parents may appear in any order)
        j, hops = i, 0
        while parent[j] >= 0:
            j, hops = int(parent[j]), hops + 1
            if hops > n:
                raise TraceError(f"{path}: parent_chat_id links form a cycle at line {rows[i][0]}")
        session[i] = j
    arrival = [r[3] for r in rows]
    inp = [r[4] for r in rows]
    hashes = [r[6] for r in rows]
    prefix = _prefix_in_arrival_order(arrival, inp, hashes, BAILIAN_BLOCK_TOKENS)
    return _finish(path, arrival, inp, [r[5] for r in rows], session, parent, prefix, hashes, BAILIAN_BLOCK_TOKENS)


SCHEMAS = "Azure 2023 CSV, Mooncake JSONL, SWE-bench agent CSV or per-session JSONL (file or folder), Bailian JSONL"


def _first_line(path: Path) -> str:
    for _, text in _text_lines(path):
        if text.strip():
            return text
    raise TraceError(f"{path}: no requests (the file is empty)")


def load_trace(path: str | os.PathLike) -> Trace:
    """Load any supported trace, choosing the schema from the header (CSV), the first object (JSONL), or,
    for a folder, its per-session JSONL files."""
    p = resolve(path)
    if p.is_dir():
        return load_swebench_jsonl(p)
    first = _first_line(p)
    if first.lstrip().startswith("{"):
        keys = set(next(_read_jsonl(p))[1])
        if "chat_id" in keys:
            return load_bailian_jsonl(p)
        if {"timestamp", "input", "output", "session_id"} <= keys:
            return load_swebench_jsonl(p)
        if {"timestamp", "input_length", "output_length"} <= keys:
            return load_mooncake_jsonl(p)
    else:
        header = {h.strip() for h in first.split(",")}
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
            return load_azure_csv(p)
        if {"session_id", "timestamp_us", "input_chars"} <= header:
            return load_swebench_csv(p)
    raise TraceError(f"{p}: unknown trace schema (first line {first[:80]!r}); supported: {SCHEMAS}")
