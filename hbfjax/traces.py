"""Request-trace loaders: Azure LLM 2023 CSV, Mooncake JSONL, SWE-bench agent CSV, Alibaba Bailian JSONL.

Every loader returns a :class:`Trace` of NumPy columns sorted by arrival time, and raises
:class:`TraceError` naming the file, the line and the problem for a malformed row. The real traces
live in ``../shared/traces/`` beside the repository (``HBFJAX_TRACE_DIR`` overrides it); any other
file of the same schema loads the same way.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake hash_ids cover 512-token prompt blocks
BAILIAN_BLOCK_TOKENS = 16  # Bailian hash_ids cover 16-token blocks
CHARS_PER_TOKEN = 4.0  # usual estimate for the SWE-bench character counts


class TraceError(ValueError):
    """A trace file is missing, of unknown schema, or has a malformed row."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests of one trace, one entry per request, sorted by arrival.

    ``session`` groups the turns of one conversation/agent task (the root request's index);
    ``parent`` is the index of the previous turn (−1 for a root); ``prefix_tokens`` is the prompt
    prefix already held in KV by an earlier request (0 when the schema cannot tell).
    """

    name: str
    arrival_s: np.ndarray  # [R] float64, seconds from the first request
    input_tokens: np.ndarray  # [R] int64
    output_tokens: np.ndarray  # [R] int64
    session: np.ndarray  # [R] int64, index of the session's root request
    parent: np.ndarray  # [R] int64, index of the parent request or -1
    prefix_tokens: np.ndarray  # [R] int64, reusable prefix tokens

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def context_tokens(self) -> np.ndarray:
        """Tokens of KV a request holds when it finishes: prompt + generated."""
        return self.input_tokens + self.output_tokens


def default_trace_dir() -> Path:
    env = os.environ.get("HBFJAX_TRACE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "traces"


def resolve(path_or_name: str | os.PathLike) -> Path:
    """A trace path; a bare file name is looked up in the default trace directory."""
    p = Path(path_or_name)
    if p.exists():
        return p
    candidate = default_trace_dir() / p
    if candidate.exists():
        return candidate
    raise TraceError(f"trace {str(path_or_name)!r} not found (also looked in {default_trace_dir()})")


def _int_field(path: Path, line: int, row: dict, key: str, minimum: int = 0) -> int:
    if key not in row or row[key] in (None, ""):
        raise TraceError(f"{path}:{line}: missing field {key!r}")
    try:
        value = int(float(row[key]))
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: field {key!r} = {row[key]!r} is not a number") from None
    if value < minimum:
        raise TraceError(f"{path}:{line}: field {key!r} = {value} must be >= {minimum}")
    return value


def _float_field(path: Path, line: int, row: dict, key: str) -> float:
    if key not in row or row[key] in (None, ""):
        raise TraceError(f"{path}:{line}: missing field {key!r}")
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: field {key!r} = {row[key]!r} is not a number") from None


def _finish(name, arrival, inp, out, session, parent, prefix) -> Trace:
    arrival = np.asarray(arrival, np.float64)
    order = np.argsort(arrival, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    remap = lambda idx: np.where(np.asarray(idx) >= 0, rank[np.maximum(np.asarray(idx), 0)], -1)  # noqa: E731
    t0 = arrival[order[0]] if arrival.size else 0.0
    return Trace(
        name=name,
        arrival_s=arrival[order] - t0,
        input_tokens=np.asarray(inp, np.int64)[order],
        output_tokens=np.asarray(out, np.int64)[order],
        session=remap(np.asarray(session, np.int64))[order],
        parent=remap(np.asarray(parent, np.int64))[order],
        prefix_tokens=np.asarray(prefix, np.int64)[order],
    )


def load_azure_csv(path: str | os.PathLike) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP,ContextTokens,GeneratedTokens`` (no sessions)."""
    path = resolve(path)
    arrival, inp, out = [], [], []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        for line, row in enumerate(reader, start=2):
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
    idx = np.arange(n)
    return _finish(path.stem, arrival, inp, out, idx, -np.ones(n), np.zeros(n))


def _read_jsonl(path: Path):
    with open(path) as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as err:
                raise TraceError(f"{path}:{line}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{path}:{line}: expected a JSON object")
            yield line, row


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


def load_mooncake_jsonl(path: str | os.PathLike) -> Trace:
    """Mooncake FAST'25 trace: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``."""
    path = resolve(path)
    arrival, inp, out, hashes = [], [], [], []
    for line, row in _read_jsonl(path):
        arrival.append(_float_field(path, line, row, "timestamp") / 1e3)
        inp.append(_int_field(path, line, row, "input_length", 1))
        out.append(_int_field(path, line, row, "output_length", 0))
        h = row.get("hash_ids", [])
        if not isinstance(h, list):
            raise TraceError(f"{path}:{line}: hash_ids must be a list")
        hashes.append(h)
    order = np.argsort(np.asarray(arrival), kind="stable")
    prefix_sorted = _prefix_from_hashes([hashes[i] for i in order], np.asarray(inp)[order], MOONCAKE_BLOCK_TOKENS)
    prefix = np.empty_like(prefix_sorted)
    prefix[order] = prefix_sorted
    n = len(arrival)
    return _finish(path.stem, arrival, inp, out, np.arange(n), -np.ones(n), prefix)


def load_swebench_csv(path: str | os.PathLike) -> Trace:
    """SWE-bench agent sessions: ``session_id, timestamp_us, input_chars, output_chars,
    prefix_chars_shared_with_previous_turn`` — characters converted at 4 per token."""
    path = resolve(path)
    arrival, inp, out, prefix, session_key = [], [], [], [], []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        for line, row in enumerate(reader, start=2):
            sid = (row.get("session_id") or "").strip()
            if not sid:
                raise TraceError(f"{path}:{line}: missing field 'session_id'")
            session_key.append(sid)
            arrival.append(_int_field(path, line, row, "timestamp_us") / 1e6)
            inp.append(max(1, round(_int_field(path, line, row, "input_chars", 1) / CHARS_PER_TOKEN)))
            out.append(round(_int_field(path, line, row, "output_chars", 0) / CHARS_PER_TOKEN))
            prefix.append(round(_int_field(path, line, row, "prefix_chars_shared_with_previous_turn")
                                / CHARS_PER_TOKEN))
    n = len(arrival)
    order = np.argsort(np.asarray(arrival), kind="stable")
    session = np.empty(n, np.int64)
    parent = np.empty(n, np.int64)
    root: dict[str, int] = {}
    last: dict[str, int] = {}
    for i in order:
        key = session_key[i]
        session[i] = root.setdefault(key, i)
        parent[i] = last.get(key, -1)
        last[key] = i
    prefix = np.minimum(np.asarray(prefix), np.asarray(inp))
    return _finish(path.stem, arrival, inp, out, session, parent, prefix)


def load_bailian_jsonl(path: str | os.PathLike) -> Trace:
    """Alibaba Bailian trace: ``chat_id, parent_chat_id, timestamp (s), input_length, output_length,
    type, turn, hash_ids`` (16-token blocks); ``parent_chat_id`` −1 marks a root request."""
    path = resolve(path)
    rows = []
    for line, row in _read_jsonl(path):
        chat = row.get("chat_id")
        if chat is None:
            raise TraceError(f"{path}:{line}: missing field 'chat_id'")
        rows.append((line, chat, row.get("parent_chat_id", -1), _float_field(path, line, row, "timestamp"),
                     _int_field(path, line, row, "input_length", 1), _int_field(path, line, row, "output_length"),
                     row.get("hash_ids", [])))
    index = {}
    for i, (line, chat, *_rest) in enumerate(rows):
        if chat in index:
            raise TraceError(f"{path}:{line}: duplicate chat_id {chat!r}")
        index[chat] = i
    n = len(rows)
    parent = np.full(n, -1, np.int64)
    for i, (line, _chat, par, *_rest) in enumerate(rows):
        if par not in (None, -1, "-1", ""):
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
    inp = np.asarray([r[4] for r in rows])
    order = np.argsort(np.asarray(arrival), kind="stable")
    prefix_sorted = _prefix_from_hashes([rows[i][6] for i in order], inp[order], BAILIAN_BLOCK_TOKENS)
    prefix = np.empty_like(prefix_sorted)
    prefix[order] = prefix_sorted
    return _finish(path.stem, arrival, inp, [r[5] for r in rows], session, parent, prefix)


def load_trace(path: str | os.PathLike) -> Trace:
    """Load any supported trace, choosing the schema from the header (CSV) or first object (JSONL)."""
    p = resolve(path)
    with open(p) as fh:
        first = fh.readline()
    if first.lstrip().startswith("{"):
        keys = set(json.loads(first))
        if "chat_id" in keys:
            return load_bailian_jsonl(p)
        if {"timestamp", "input_length", "output_length"} <= keys:
            return load_mooncake_jsonl(p)
    else:
        header = {h.strip() for h in first.split(",")}
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
            return load_azure_csv(p)
        if {"session_id", "timestamp_us", "input_chars"} <= header:
            return load_swebench_csv(p)
    raise TraceError(f"{p}: unknown trace schema (first line {first[:80]!r}); supported: Azure 2023 CSV, "
                     "Mooncake JSONL, SWE-bench agent CSV, Bailian JSONL")
