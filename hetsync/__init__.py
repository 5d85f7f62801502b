"""hetsync: heterogeneity-aware synchronization for Horovod + Keras.

A Horovod Keras script changes one line::

    hvd.init(); hetsync.init()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="ripples-static")

and trains with a method that does not wait for its slowest worker at every step.  ``sync="allreduce"`` is plain
Horovod, the baseline every other mode is measured against.  See README.md for the modes and their options.
"""
from hetsync._runtime import (
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from hetsync.algorithms import available_modes
from hetsync.training.consensus import consensus
from hetsync.optimizer import DistributedOptimizer
from hetsync.training.loop import job_steps

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
