"""`hbfjax traces fetch` end to end against a local HTTP server on 127.0.0.1 (no other network)."""

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hbfjax import trace_catalog, trace_fetch, traces
from hbfjax.cli import main
from hbfjax.trace_catalog import TraceSource, UpstreamFile

COMMIT = "0123456789abcdef0123456789abcdef01234567"
AZURE = b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.5,12,3\r\n2023-11-16 18:17:05.25,7,2\r\n"
SESSION_A = b'{"timestamp": 1000000, "input": "abcd", "output": "xy", "session_id": "a"}\n'
SESSION_B = b'{"timestamp": 2000000, "input": "zzzz", "output": "", "session_id": "b"}\n'


def _file(path: str, data: bytes) -> UpstreamFile:
    return UpstreamFile(path, len(data), hashlib.sha256(data).hexdigest())


def _source(name, local, *files) -> TraceSource:
    return TraceSource(name=name, title="test", repo="owner/repo", commit=COMMIT, files=files, local=local,
                       licence="CC0", attribution="none")


class _Server:
    """Serves ``files`` (URL path -> bytes); paths in ``truncate`` send half their bytes, then close."""

    def __init__(self):
        self.files, self.truncate, self.requests = {}, set(), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                server.requests.append(self.path)
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if self.path in server.truncate else data)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def put(self, source: TraceSource, contents: dict[str, bytes]) -> None:
        for f in source.files:
            self.files[f"/owner/repo/{COMMIT}/{f.path}"] = contents[f.path]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(trace_fetch, "TIMEOUT_S", 5.0)
    s = _Server()
    yield s
    s.close()


def test_fetch_writes_the_verified_file_and_skips_a_second_time(server, tmp_path):
    source = _source("tiny", "tiny.csv", _file("data/trace.csv", AZURE))
    server.put(source, {"data/trace.csv": AZURE})
    path, downloaded = trace_fetch.fetch(source, tmp_path, base=server.url)
    assert (path, downloaded) == (tmp_path / "tiny.csv", True)
    assert path.read_bytes() == AZURE and sorted(p.name for p in tmp_path.iterdir()) == ["tiny.csv"]
    assert server.requests == [f"/owner/repo/{COMMIT}/data/trace.csv"]
    assert trace_fetch.fetch(source, tmp_path, base=server.url) == (path, False)
    assert len(server.requests) == 1  # verified copy kept, nothing downloaded
    assert list(traces.load_trace(path).input_tokens) == [12, 7]


def test_fetch_assembles_a_several_file_trace_as_one_folder(server, tmp_path):
    files = {"miniswe/a.jsonl": SESSION_A, "miniswe/b.jsonl": SESSION_B}
    source = _source("sessions", "sessions", *(_file(p, d) for p, d in files.items()))
    server.put(source, files)
    path, _ = trace_fetch.fetch(source, tmp_path, base=server.url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sessions"]
    assert sorted(p.name for p in path.iterdir()) == ["a.jsonl", "b.jsonl"] and (path / "b.jsonl").read_bytes() == SESSION_B
    t = traces.load_trace(path)
    assert list(t.input_tokens) == [1, 1] and list(t.output_tokens) == [0, 0] and list(t.arrival_s) == [0.0, 1.0]


def test_checksum_mismatch_is_refused_and_leaves_nothing(server, tmp_path):
    wrong = UpstreamFile("data/trace.csv", len(AZURE), "0" * 64)
    source = _source("tiny", "tiny.csv", wrong)
    server.put(source, {"data/trace.csv": AZURE})
    with pytest.raises(traces.TraceError, match="does not match the catalogue's 0000.*refused, nothing kept"):
        trace_fetch.fetch(source, tmp_path, base=server.url)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("several", [False, True])
def test_interrupted_download_never_leaves_a_half_written_trace(server, tmp_path, several):
    files = {"miniswe/a.jsonl": SESSION_A, "miniswe/b.jsonl": SESSION_B} if several else {"data/t.csv": AZURE}
    source = _source("tiny", "tiny" if several else "tiny.csv", *(_file(p, d) for p, d in files.items()))
    server.put(source, files)
    last = list(files)[-1]
    server.truncate.add(f"/owner/repo/{COMMIT}/{last}")
    expect = f"received {len(files[last]) // 2} of {len(files[last])} bytes"
    with pytest.raises(traces.TraceError, match=re.escape(expect)):
        trace_fetch.fetch(source, tmp_path, base=server.url)
    assert list(tmp_path.iterdir()) == []


def test_cli_fetch_of_a_missing_upstream_file_exits_2_naming_the_url(server, tmp_path, monkeypatch, capsys):
    source = _source("tiny", "tiny.csv", _file("data/trace.csv", AZURE))  # the server has no file
    monkeypatch.setattr(trace_catalog, "CATALOG", (source,))
    monkeypatch.setenv("HBFJAX_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv(trace_fetch.BASE_URL_ENV, server.url)
    assert main(["traces", "fetch", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hbfjax traces: error: could not download http://127.0.0.1:") and "data/trace.csv" in err
    server.put(source, {"data/trace.csv": AZURE})
    assert main(["traces", "fetch", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"traces": [{"name": "tiny", "path": str(tmp_path / "tiny.csv"), "downloaded": True}]}
    assert main(["traces", "path", "tiny"]) == 0 and capsys.readouterr().out.strip() == str(tmp_path / "tiny.csv")


def test_catalogue_entries_are_pinned_and_checksummed():
    names = [n for s in trace_catalog.CATALOG for n in s.names()]
    assert len(set(names)) == len(names) - 1  # unique, except swebench's name is also its folder name
    for s in trace_catalog.CATALOG:
        assert re.fullmatch(r"[0-9a-f]{40}", s.commit) and s.files
        assert all(re.fullmatch(r"[0-9a-f]{64}", f.sha256) and f.size_bytes > 0 for f in s.files)
    swe = trace_catalog.get("swebench_miniswe_agent.csv")
    assert (len(swe.files), swe.size_bytes, swe.is_folder) == (20, 10_199_594, True)
    assert swe.url(swe.files[0]) == ("https://raw.githubusercontent.com/LMCache/lmcache-agent-trace/"
                                     "271d1c02f97d68de6b500bcd9c9b25730b1d4b7f/miniswe/063925220f0d2954505eb37612b11ab3.jsonl")


@pytest.mark.parametrize("name", ["azure_llm_2023_code", "mooncake_conversation"])
def test_shared_copies_are_byte_identical_to_the_catalogued_upstream(real_trace, name):
    source = trace_catalog.get(name)
    assert trace_fetch.verified(source, real_trace(source.local))
