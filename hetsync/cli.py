"""The ``hetsync`` console command (setup.py entry point).

    hetsync report LOGDIR [--out DIR]   the heterogeneity report of a run (hetsync/report.py): PNG + Markdown
    hetsync bench [ARGS...]             examples/benchmark.py of this checkout, with ARGS (e.g. --preset demo)
"""
import argparse
import os
import runpy
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
        print(f"hetsync bench: {script} not found: run it from a checkout of hetsync (examples/ is not installed)",
              file=sys.stderr)
        return 2
    sys.argv = [script] + list(rest)
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="hetsync", description=__doc__.split("\n\n")[0])
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
