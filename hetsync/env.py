"""Every ``HETSYNC_*`` environment variable, declared once: its name, default, meaning and who reads it.

hetsync's Python code reads them through :func:`get` (one parse, one error message naming the variable), and
docs/options.md's table of environment variables comes from :data:`VARS` (``python -m hetsync.docs``).  A variable
read outside Python (the C++ engine, a shell script) is declared here all the same, naming its reader;
tests/test_docs.py fails when the source reads a ``HETSYNC_*`` name that is not declared here.

Imports nothing from hetsync.
"""
import os


class Var:
    """One environment variable.

    Args:
      name: ``HETSYNC_...``.
      default: the value when it is unset (None: nothing is set, see ``meaning``).
      kind: how its text is read: ``float``, ``int`` or ``str``.
      meaning: one line for docs/options.md.
      read_by: where it is read (a module, function or file).
      init_arg: the ``hetsync.init`` argument it is the default of, or None.
    """

    def __init__(self, name, default, kind, meaning, read_by, init_arg=None):
        self.name, self.default, self.kind = name, default, kind
        self.meaning, self.read_by, self.init_arg = meaning, read_by, init_arg


VARS = {v.name: v for v in (
    Var("HETSYNC_TIMEOUT", 120.0, float,
        "seconds any blocking hetsync wait may last before it fails naming the ranks it waited for",
        "hetsync.init (hetsync/_runtime.py)", init_arg="timeout"),
    Var("HETSYNC_COMM_CACHE_SIZE", 64, int,
        "bound of the engine's communicator cache (Ripples §6.1)",
        "hetsync.init (hetsync/_runtime.py); the C++ engine when ops.engine_start gets cache_size=None "
        "(tf_ops/engine/engine.cc)", init_arg="comm_cache_size"),
    Var("HETSYNC_AWAY_AFTER", 0.2, float,
        "seconds a rank may stay between two train steps before its peers go on without it",
        "hetsync.init (hetsync/_runtime.py)", init_arg="away_after"),
    Var("HETSYNC_LOG_LEVEL", None, str,
        "level of the 'hetsync' logger on every rank (DEBUG, INFO, WARNING, ERROR, CRITICAL or a number; "
        "unset: INFO on rank 0, WARNING elsewhere)",
        "hetsync.init (hetsync/_logging.py)"),
    Var("HETSYNC_GG_HOST", None, str,
        "address the Group Generator binds in a multi-host job (unset: this host's first non-loopback IPv4 address)",
        "rank 0's coordinator services (hetsync/coordinator/server.py)"),
    Var("HETSYNC_GG_SECRET", None, str,
        "shared secret of a standalone Group Generator (unset: a random one, printed)",
        "python -m hetsync.coordinator.server (hetsync/coordinator/server.py)"),
    Var("HETSYNC_CLUSTER_DIR", "/tmp/hetsync-cluster", str,
        "folder of the emulated cluster's hosts file, rsh agent and settings",
        "scripts/cluster.sh (make test, make test-cluster)"),
    Var("HETSYNC_WHEEL_CACHE", "~/.cache/hetsync/wheels", str,
        "where the set-up keeps the Horovod wheel it built, by Horovod, TensorFlow, Python and Open MPI version",
        "scripts/install.sh (make install, make test, make demo)"),
)}


def get(name, default=None):
    """The value of the declared variable ``name`` read as its kind, else ``default`` if given, else its declared
    default.  ValueError names the variable when its text is not of its kind."""
    var = VARS[name]
    value = os.environ.get(name)
    if value is None or (value == "" and var.kind is not str):
        return var.default if default is None else default
    try:
        return var.kind(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a {var.kind.__name__}") from None
