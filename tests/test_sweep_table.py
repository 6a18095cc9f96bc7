"""The sweep table: whole rows on disk, a partial last line cut on resume, a wider header rewritten
atomically, another sweep's table refused."""

import csv

import pytest

from hbfjax.sweep.table import ResultTable, cell, flatten
from hbfjax.validate import ConfigError


def _row(i, **extra):
    return {"row_kind": "point", "point": i, "key": f'{{"x":"{i}"}}', "x": i, "status": "ok", "y": i / 3, **extra}


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_flatten_and_cells_keep_full_precision_on_one_line():
    assert flatten({"a": 1, "u": {"hbm": 0.5, "deep": {"x": 2}}, "l": [1, 2]}) == {"a": 1, "u.hbm": 0.5,
                                                                                   "u.deep.x": 2, "l": "[1,2]"}
    third = 1 / 3
    assert float(cell(third)) == third  # repr round-trips a float64 exactly
    assert cell(None) == "" and cell(float("nan")) == "" and cell(True) == "True"
    assert cell("two\nlines") == "two lines"


def test_rows_append_resume_and_widen(tmp_path):
    path = tmp_path / "t.csv"
    table = ResultTable(path, "abc").open()
    table.append([_row(0), _row(1)])
    table.append([_row(2, z="new")])  # a new column: the file is rewritten with it
    rows = _read(path)
    assert [r["point"] for r in rows] == ["0", "1", "2"] and [r["z"] for r in rows] == ["", "", "new"]
    assert list(rows[0])[:4] == ["sweep_id", "row_kind", "point", "key"] and rows[0]["sweep_id"] == "abc"
    assert float(rows[1]["y"]) == 1 / 3
    again = ResultTable(path, "abc").open()
    assert again.done("point") == {'{"x":"0"}', '{"x":"1"}', '{"x":"2"}'} and again.done("probe") == set()
    again.append([_row(3), _row(1)])  # a row the table holds is not written twice
    assert [r["point"] for r in _read(path)] == ["0", "1", "2", "3"]
    assert not (tmp_path / "t.csv.tmp").exists()


def test_a_partial_last_line_from_a_kill_is_cut_and_its_point_runs_again(tmp_path):
    path = tmp_path / "t.csv"
    ResultTable(path, "abc").open().append([_row(0), _row(1)])
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # killed inside the write of row 1
    table = ResultTable(path, "abc").open()
    assert table.done("point") == {'{"x":"0"}'}
    assert path.read_bytes() == whole[: whole.rstrip(b"\n").rfind(b"\n") + 1]
    table.append([_row(1)])
    assert path.read_bytes() == whole


def test_another_sweeps_table_or_a_foreign_csv_is_refused_and_failed_rows_can_be_retried(tmp_path):
    path = tmp_path / "t.csv"
    ResultTable(path, "abc").open().append([_row(0), _row(1, status="failed", error="boom")])
    with pytest.raises(ConfigError, match="holds the rows of another sweep"):
        ResultTable(path, "xyz").open()
    assert ResultTable(path, "abc").open().done("point") == {'{"x":"0"}', '{"x":"1"}'}
    retry = ResultTable(path, "abc").open(retry_failed=True)
    assert retry.done("point") == {'{"x":"0"}'} and [r["point"] for r in _read(path)] == ["0"]
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a sweep table"):
        ResultTable(other, "abc").open()
