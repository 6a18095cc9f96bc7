"""``hbfjax plot``: a sweep table (``hbfjax sweep --out``) as a seaborn figure with its CIs."""

from __future__ import annotations

import argparse

from hbfjax.commands._common import output_file, text_file
from hbfjax.validate import ConfigError

HELP = """\
Draw a metric of a sweep table against one of its columns, one line per --hue value and one panel per
--col value, with error bars at the 95 % confidence half-widths the table carries (ci95_<metric>), or,
where several rows share an x (seeds, say), the 95 % interval of their mean. Only rows with status ok
are drawn; --kind chooses point rows (default), capacity rows or the capacity search's probes.

  hbfjax plot results.csv --x load --y p90_e2e_s --hue system --out p90.png
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="draw a sweep table as a figure with CIs", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", metavar="CSV", help="a table written by hbfjax sweep")
    p.add_argument("--x", required=True, help="column on the horizontal axis")
    p.add_argument("--y", required=True, help="metric on the vertical axis (its ci95_ column gives the error bars)")
    p.add_argument("--hue", default=None, help="column whose values are separate lines")
    p.add_argument("--col", default=None, help="column whose values are separate panels")
    p.add_argument("--kind", choices=("point", "capacity", "probe"), default="point", help="which rows (default point)")
    p.add_argument("--logx", action="store_true", help="logarithmic x axis")
    p.add_argument("--logy", action="store_true", help="logarithmic y axis")
    p.add_argument("--title", default=None, help="figure title")
    p.add_argument("--pareto", action="store_true",
                   help="draw the Pareto front of a sweep run with --pareto: y against x for every point, the front "
                        "joined with its CIs (no --hue or --col)")
    p.add_argument("--out", required=True, metavar="PNG", help="the figure file (PNG, PDF or SVG by its suffix)")
    p.set_defaults(func=run)


def run(args) -> int:
    from hbfjax.sweep import plot as sweep_plot

    table = sweep_plot.read(text_file("TABLE", args.table), args.kind)
    output_file("--out", args.out)
    if args.pareto:
        if args.hue is not None or args.col is not None:
            raise ConfigError("--pareto: draws one front (no --hue or --col)")
        fig = sweep_plot.pareto_plot(table, args.x, args.y, args.logx, args.logy, args.title)
    else:
        fig = sweep_plot.plot(table, args.x, args.y, args.hue, args.col, args.logx, args.logy, args.title)
    try:
        fig.savefig(args.out, dpi=150)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--out {args.out}: cannot write the figure ({err})") from None
    print(args.out)
    return 0
