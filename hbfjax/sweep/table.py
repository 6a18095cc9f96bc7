"""The sweep's tidy table: a CSV with one row per grid point, written as each point finishes, that an
interrupted sweep resumes with no row lost or written twice.

Every row is one line (values never hold a line break), appended with one ``write`` and flushed to
disk (``fsync``), so a sweep killed at any moment leaves whole rows and at most one partial last line,
which :meth:`ResultTable.open` cuts off. When a row brings columns the header lacks, the file is
rewritten with the wider header into a temporary file and renamed over the old one (atomic on POSIX).
Each row carries its sweep's ``sweep_id``: a table holding another sweep's rows is refused.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

from hbfjax.validate import ConfigError

FIRST_COLUMNS = ("sweep_id", "row_kind", "point", "key")
ROW_KINDS = ("point", "stream", "probe", "capacity")  # what a sweep writes (runner, capacity)


def flatten(result: dict, prefix: str = "") -> dict:
    """A JSON result as flat columns: nested dicts joined with ``.``; lists as JSON text."""
    flat = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value, separators=(",", ":"))
        else:
            flat[name] = value
    return flat


def cell(value) -> str:
    """One CSV cell: floats at full precision (repr), None and NaN empty, no line breaks."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return " ".join(str(value).splitlines())


def _line(columns: list[str], row: dict) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([cell(row.get(c)) for c in columns])
    return buf.getvalue()


class ResultTable:
    """The CSV at ``path``; ``rows`` holds what is on disk, by key (``row_kind`` + ``key``)."""

    def __init__(self, path: str | os.PathLike, sweep_id: str):
        self.path = Path(path)
        self.sweep_id = sweep_id
        self.columns: list[str] = []
        self.rows: dict[tuple[str, str], dict] = {}

    def open(self, retry_failed: bool = False) -> "ResultTable":
        """Read the rows already on disk (cutting a partial last line); refuse another sweep's table.
        With ``retry_failed`` the failed rows are dropped (rewritten away) so they run again."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return self
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):  # killed inside a write: the last line is partial
            data = data[: data.rfind(b"\n") + 1]
            with open(self.path, "r+b") as fh:
                fh.truncate(len(data))
                os.fsync(fh.fileno())
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"--out {self.path}: not UTF-8 text (byte {data[err.start:err.start + 1]!r} at offset "
                              f"{err.start}): garbled, so it cannot be resumed; move it away or delete it") from None
        reader = csv.reader(io.StringIO(text))
        self.columns = next(reader, [])
        if self.columns[: len(FIRST_COLUMNS)] != list(FIRST_COLUMNS):
            raise ConfigError(f"--out {self.path}: not a sweep table (its first columns are {self.columns[:4]}); "
                              "choose another file")
        for row in self._records(reader):
            if row["sweep_id"] != self.sweep_id:
                raise ConfigError(f"--out {self.path}: holds the rows of another sweep (sweep_id {row['sweep_id']}, "
                                  f"this one is {self.sweep_id}: another subcommand, fixed options or axes, or another "
                                  "hbfjax source); write to another file or delete it")
            self.rows[row["row_kind"], row["key"]] = row
        if retry_failed and any(r.get("status") == "failed" for r in self.rows.values()):
            self.rows = {k: r for k, r in self.rows.items() if r.get("status") != "failed"}
            self._rewrite(self.columns)
        return self

    def _records(self, reader):
        """The rows as dicts, each checked whole: as many cells as the header and a key that is a point's
        JSON (a row cut inside, or bytes that are not this table's, would be read as some other row)."""
        for cells in reader:
            where = f"--out {self.path}: line {reader.line_num}"
            if len(cells) != len(self.columns):
                raise ConfigError(f"{where}: {len(cells)} cells under a header of {len(self.columns)} (a row cut "
                                  "inside, or edited): the table cannot be resumed; move it away or delete it")
            row = dict(zip(self.columns, cells))
            try:
                ok = isinstance(json.loads(row["key"]), dict) and row["row_kind"] in ROW_KINDS
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"{where}: row_kind {row['row_kind']!r}, key {row['key']!r} are not a sweep row's: "
                                  "the table cannot be resumed; move it away or delete it")
            yield row

    def done(self, row_kind: str) -> set[str]:
        return {key for kind, key in self.rows if kind == row_kind}

    def append(self, rows: list[dict]) -> None:
        """Write ``rows`` (dicts of columns; ``row_kind`` and ``key`` set) and flush them to disk; a row
        whose kind and key the table holds already is not written again."""
        rows = [{"sweep_id": self.sweep_id, **r} for r in rows if (r["row_kind"], r["key"]) not in self.rows]
        if not rows:
            return
        new = [c for r in rows for c in r if c not in self.columns]
        if new:
            columns = list(FIRST_COLUMNS) if not self.columns else list(self.columns)
            for c in new:
                if c not in columns:
                    columns.append(c)
            for r in rows:
                self.rows[r["row_kind"], r["key"]] = r
            self._rewrite(columns)
            return
        text = "".join(_line(self.columns, r) for r in rows)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        for r in rows:
            self.rows[r["row_kind"], r["key"]] = r

    def set_cells(self, cells: dict[tuple[str, str], dict]) -> None:
        """Give rows (by row kind and key) the values of ``cells``' columns (new columns appended, other
        rows empty there) and rewrite the table once."""
        for where, values in cells.items():
            self.rows[where] = {**self.rows[where], **values}
        new = [c for values in cells.values() for c in values if c not in self.columns]
        self._rewrite(list(self.columns) + list(dict.fromkeys(new)))

    def _rewrite(self, columns: list[str]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(_line(columns, {c: c for c in columns}))
            fh.write("".join(_line(columns, r) for r in self.rows.values()))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self.columns = columns
