"""The ``hetsync`` console command (setup.py entry point).

    hetsync report LOGDIR [--out DIR]   the heterogeneity report of a run (hetsync/report.py): PNG + Markdown
    hetsync bench [ARGS...]             examples/benchmark.py of this checkout, with ARGS (e.g. --preset demo)
    hetsync --version                   "hetsync X.Y.Z" (also `python -m hetsync --version`)

The benchmarks (examples/) ship with the source tree, not with the installed package: `hetsync bench` runs them
from a checkout (git clone; scripts/install.sh installs it editable) and says so elsewhere.
"""
import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report(args):
    from hetsync.report import write_report

    try:
        png, md = write_report(args.logdir, args.out)
    except FileNotFoundError as exc:
        print(f"hetsync report: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {png}\nwrote {md}")
    return 0


def _bench(rest):
    script = os.path.join(ROOT, "examples", "benchmark.py")
    if not os.path.exists(script):
        print(f"hetsync bench: the benchmarks ship with the source tree, not with the installed package "
              f"({script} does not exist).  Clone the hetsync repository, install it from there "
              f"(scripts/install.sh, an editable install) and run `hetsync bench` or `make bench` in that checkout.",
              file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(script))
    spec = importlib.util.spec_from_file_location("hetsync_benchmark", script)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    sys.argv = ["hetsync bench"] + list(rest)  # argparse's prog: the usage line reads `usage: hetsync bench ...`
    benchmark.main(list(rest))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    from hetsync._version import __version__

    parser = argparse.ArgumentParser(prog="hetsync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"hetsync {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="write LOGDIR's heterogeneity report (PNG + Markdown)")
    report.add_argument("logdir", help="the log_dir of a HeterogeneityReport / TensorBoard callback")
    report.add_argument("--out", default=None, help="where to write (default: LOGDIR)")
    sub.add_parser("bench", help="run examples/benchmark.py with the remaining arguments", add_help=False)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    args = parser.parse_args(argv)
    return _report(args)


if __name__ == "__main__":
    sys.exit(main())
