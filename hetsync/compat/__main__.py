"""``python -m hetsync.compat [--check] [--out FILE]``: writes docs/compatibility.md from the table."""
import sys

from hetsync.compat.render import main

sys.exit(main())
