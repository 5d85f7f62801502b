"""The ``hetsync`` console command (setup.py entry point).

    hetsync check [--np N]              does hetsync work here? versions, ops, MPI, coordinator, a 2-rank job
    hetsync report LOGDIR [--out DIR]   the heterogeneity report of a run (hetsync/report.py): PNG + Markdown
    hetsync --version                   "hetsync X.Y.Z" (also `python -m hetsync --version`)

There is no `hetsync bench`: the benchmarks launch `mpirun` jobs of the example scripts, which ship with the source
tree, not with the package; a checkout runs them with `make demo`, `make bench` or `python examples/benchmark.py`.
"""
import argparse
import sys

from hetsync import check
from hetsync._version import __version__


def _report(args):
    # deferred: the report loads matplotlib, which `hetsync --version` and `hetsync check` do not need
    from hetsync.report import write_report

    try:
        png, md = write_report(args.logdir, args.out)
    except FileNotFoundError as exc:
        print(f"hetsync report: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {png}\nwrote {md}")
    return 0


def parser():
    """The command's parser; docs/api.md's command list is checked against its subcommands (tests)."""
    top = argparse.ArgumentParser(prog="hetsync", description=__doc__.split("\n\n")[0])
    top.add_argument("--version", action="version", version=f"hetsync {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check that hetsync works in this environment (like horovodrun --check-build)")
    check.add_argument("--np", type=int, default=2, help="ranks of the loopback job (default 2)")
    report = sub.add_parser("report", help="write LOGDIR's heterogeneity report (PNG + Markdown)")
    report.add_argument("logdir", help="the log_dir of a HeterogeneityReportCallback")
    report.add_argument("--out", default=None, help="where to write (default: LOGDIR)")
    return top


def main(argv=None):
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "check":
        return check.main(["--np", str(args.np)])
    return _report(args)


if __name__ == "__main__":
    sys.exit(main())
