"""``sync="allreduce"``: Horovod's own gradient allreduce, the baseline every hetsync method is compared with.

It is exactly ``horovod.tensorflow.keras.DistributedOptimizer``: same numbers, same options, so a benchmark that
compares a mode against "allreduce" compares it against plain Horovod in the same run.
"""
from hetsync.algorithms import register
from hetsync.algorithms.base import SyncAlgorithm

_UNSET = object()


@register
class HorovodAllreduce(SyncAlgorithm):
    name = "allreduce"
    # Horovod's DistributedOptimizer keyword arguments; unset ones keep Horovod's defaults.
    OPTIONS = {
        key: _UNSET
        for key in (
            "compression", "sparse_as_dense", "gradient_predivide_factor", "op", "backward_passes_per_step",
            "average_aggregated_gradients", "num_groups", "groups", "process_set", "device_dense",
            "device_sparse", "scale_local_gradients",
        )
    }

    def wrap(self, optimizer):
        import horovod.tensorflow.keras as hvd_keras

        kwargs = {k: v for k, v in self.options.items() if v is not _UNSET}
        return hvd_keras.DistributedOptimizer(optimizer, **kwargs)
