"""hetsync: heterogeneity-aware synchronization for Horovod + Keras.

A Horovod Keras script changes one line::

    hvd.init(); hetsync.init()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="ripples-static")

and trains with a method that does not wait for its slowest worker at every step.  ``sync="allreduce"`` is plain
Horovod, the baseline every other mode is measured against.  See README.md for the modes and their options.
"""
import importlib

from hetsync._version import __version__

# Nothing happens at import: no MPI call, no TensorFlow, no environment change (tests/test_conventions.py).  The
# public names are imported on first use (PEP 562), so that `import hetsync` stays light: `python -m hetsync
# --version` and the `hetsync` command load no TensorFlow.  `hetsync.init`, `from hetsync import
# DistributedOptimizer` and `hetsync.algorithms` (any submodule) work as if imported here.  A new public name goes
# into this table (name -> module), not into an import at the top of this file.
_PUBLIC = {
    "init": "hetsync._runtime",
    "shutdown": "hetsync._runtime",
    "is_initialized": "hetsync._runtime",
    "rank": "hetsync._runtime",
    "size": "hetsync._runtime",
    "local_rank": "hetsync._runtime",
    "local_size": "hetsync._runtime",
    "available_modes": "hetsync.algorithms",
    "consensus": "hetsync.training.consensus",
    "DistributedOptimizer": "hetsync.optimizer",
    "load_model": "hetsync.saving",
    "job_steps": "hetsync.training.loop",
    "metrics": "hetsync.observe",
    "switch_history": "hetsync.observe",
    "current_mode": "hetsync.observe",
}


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "DistributedOptimizer",
    "load_model",
    "available_modes",
    "consensus",
    "job_steps",
    "metrics",
    "switch_history",
    "current_mode",
]
