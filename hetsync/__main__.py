"""``python -m hetsync``: the ``hetsync`` command (hetsync/cli.py)."""
import sys

from hetsync.cli import main

if __name__ == "__main__":
    sys.exit(main())
