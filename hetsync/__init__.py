"""hetsync: heterogeneity-aware synchronization for Horovod + Keras.

A Horovod Keras script changes one line::

    hvd.init(); hetsync.init()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="ripples-static")

and trains with a method that does not wait for its slowest worker at every step.  ``sync="allreduce"`` is plain
Horovod, the baseline every other mode is measured against.  See README.md for the modes and their options.
"""
from hetsync import _mpi_early

_mpi_early.init_before_horovod()  # noqa: E402 (before anything can call hvd.init(): see _mpi_early.py)

from hetsync._runtime import (  # noqa: E402
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from hetsync.algorithms import available_modes  # noqa: E402
from hetsync.training.consensus import consensus  # noqa: E402
from hetsync.optimizer import DistributedOptimizer  # noqa: E402
from hetsync.training.loop import job_steps  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "DistributedOptimizer",
    "available_modes",
    "consensus",
    "job_steps",
]
