"""The public request traces: list the catalogue, fetch them from upstream, print where one is.

Traces are data, never part of the repository. A bare trace name is looked up in $HBFJAX_TRACE_DIR
(if set), then the per-user data folder ($XDG_DATA_HOME/hbfjax/traces, default
~/.local/share/hbfjax/traces), then shared/traces beside the repository. `fetch` downloads into
$HBFJAX_TRACE_DIR if set, else the per-user data folder, exactly as published upstream at a pinned
commit, and keeps a file only after its SHA-256 matches the catalogue. Sizes in MB (1e6 bytes).
"""

from __future__ import annotations

import argparse
import json

from hbfjax import trace_catalog
from hbfjax.commands import _choices as names


def _where(source: trace_catalog.TraceSource) -> str | None:
    from hbfjax import traces

    try:
        return str(traces.resolve(source.local))
    except traces.TraceMissing:
        return None


def _list(args) -> int:
    from hbfjax import traces

    rows = [{"name": s.name, "title": s.title, "size_mb": round(s.size_bytes / 1e6, 3), "files": len(s.files),
             "upstream": f"https://github.com/{s.repo}/tree/{s.commit}", "licence": s.licence,
             "attribution": s.attribution, "found": _where(s)} for s in trace_catalog.CATALOG]
    if args.json:
        print(json.dumps({"search_path": [str(p) for p in traces.search_path()],
                          "fetch_dir": str(traces.fetch_dir()), "traces": rows}))
        return 0
    for r in rows:
        print(f"{r['name']}  {r['size_mb']:.1f} MB in {r['files']} file(s)  {r['licence']}")
        print(f"    {r['title']}")
        print(f"    upstream: {r['upstream']}")
        print(f"    attribution: {r['attribution']}")
        print(f"    found: {r['found'] or 'missing (hbfjax traces fetch ' + r['name'] + ')'}")
    print("search path: " + ", ".join(str(p) for p in traces.search_path()))
    return 0


def _fetch(args) -> int:
    from hbfjax import trace_fetch

    sources = [trace_catalog.get(n) for n in args.names] if args.names else list(trace_catalog.CATALOG)
    results = []
    for source in sources:
        path, downloaded = trace_fetch.fetch(source, base=args.base_url)
        results.append({"name": source.name, "path": str(path), "downloaded": downloaded})
        if not args.json and not downloaded:
            print(f"{source.name}: already present and verified at {path}")
    if args.json:
        print(json.dumps({"traces": results}))
    else:
        for s in sources:
            print(f"{s.name}: {s.licence}, https://github.com/{s.repo}; attribution: {s.attribution}")
    return 0


def _path(args) -> int:
    from hbfjax import traces

    print(traces.resolve(args.name))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("traces", help="list, fetch and locate the public request traces",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    lp = sub.add_parser("list", help="the catalogue: name, size, upstream, licence, where found")
    lp.add_argument("--json", action="store_true", help="print one JSON object")
    lp.set_defaults(func=_list)
    fp = sub.add_parser("fetch", help="download traces (default: all) and verify their SHA-256")
    fp.add_argument("names", nargs="*", metavar="NAME", help="catalogued trace names (hbfjax traces list)")
    fp.add_argument("--base-url", default=None,
                    help=f"download from this base instead of raw GitHub (also ${names.TRACE_BASE_URL_ENV})")
    fp.add_argument("--json", action="store_true", help="print one JSON object")
    fp.set_defaults(func=_fetch)
    pp = sub.add_parser("path", help="print the path a trace name resolves to (exit 2 if missing)")
    pp.add_argument("name", metavar="NAME", help="a catalogued name, a trace file name, or a path")
    pp.set_defaults(func=_path)
