"""The benchmark profile summary: per-op totals from a hand-written trace file."""

import gzip
import json

from hbfjax.bench import _profile


def test_op_totals_sums_device_ops_and_skips_python_spans(tmp_path):
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "name": "PjitFunction(f)", "dur": 900.0, "args": {}},  # Python span: skipped
        {"ph": "X", "pid": 1, "name": "fusion.1", "dur": 10.0, "args": {"hlo_op": "fusion.1"}},
        {"ph": "X", "pid": 1, "name": "fusion.1", "dur": 5.5, "args": {"hlo_op": "fusion.1"}},
        {"ph": "X", "pid": 2, "name": "scatter_kernel", "dur": 7.0, "args": {}},  # device process: kept
        {"ph": "X", "pid": 2, "name": "fusion.1", "dur": 30.0, "args": {"hlo_op": "fusion.1"}},
        {"ph": "i", "pid": 2, "name": "marker", "args": {"hlo_op": "x"}},  # not a complete event
    ]
    path = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    ops, per_process = _profile.op_totals(str(path))
    assert [(o["process"], o["op"], o["total_us"], o["launches"]) for o in ops] == [
        ("/device:GPU:0", "fusion.1", 30.0, 1), ("/host:CPU", "fusion.1", 15.5, 2),
        ("/device:GPU:0", "scatter_kernel", 7.0, 1)]
    assert per_process == {"/device:GPU:0": 37.0, "/host:CPU": 15.5}
