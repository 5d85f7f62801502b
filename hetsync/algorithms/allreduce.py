"""``sync="allreduce"``: Horovod's own gradient allreduce, the baseline every hetsync method is compared with.

It is exactly ``horovod.tensorflow.keras.DistributedOptimizer``: same numbers, same options (every keyword of
horovod_kwargs.NAMES, handed over unchanged; unset ones keep Horovod's defaults and Horovod validates them), so a
benchmark that compares a mode against "allreduce" compares it against plain Horovod in the same run.
"""
from hetsync.algorithms import horovod_kwargs, register
from hetsync.algorithms.base import SyncAlgorithm


@register
class HorovodAllreduce(SyncAlgorithm):
    name = "allreduce"
    OPTIONS = {}
    HOROVOD_APPLIED = frozenset(horovod_kwargs.NAMES)
    HOROVOD_PASSTHROUGH = True

    def wrap(self, optimizer):
        import horovod.tensorflow.keras as hvd_keras

        return hvd_keras.DistributedOptimizer(optimizer, **self.horovod_kwargs)
