"""The command line of a generated page (docs/options.md, docs/compatibility.md): write it, print it, or check it.

Both generators (``python -m hetsync.docs``, ``python -m hetsync.compat``) take ``--out FILE|-`` and ``--check``;
this is that shared part, so a test and a user see the same staleness rule.
"""
import argparse
import sys


def stale(path, text):
    """True when the file at ``path`` is missing or differs from ``text``."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() != text
    except FileNotFoundError:
        return True


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def main(argv, prog, description, output, render, also=()):
    """``render()`` -> ``--out`` (default ``output``); ``--check``: exit 1 when it is stale.  ``also``: (path,
    render) pairs of pages generated and checked with this one when ``--out`` is the default."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", default=output, help="file to write ('-': standard output; default %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    pages = [(args.out, render)] + (list(also) if args.out == output else [])
    if args.check:
        bad = [path for path, fn in pages if stale(path, fn())]
        for path in bad:
            print(f"{path} is stale: run {prog}", file=sys.stderr)
        return 1 if bad else 0
    if args.out == "-":
        sys.stdout.write(render())
        return 0
    for path, fn in pages:
        print(f"wrote {write(path, fn())}")
    return 0


if __name__ == "__main__":
    sys.exit("hetsync/_generated.py is used by python -m hetsync.docs and python -m hetsync.compat")
