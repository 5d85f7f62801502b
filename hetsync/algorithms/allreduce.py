"""``sync="allreduce"``: Horovod's own gradient allreduce, the baseline every hetsync method is compared with.

It is exactly ``horovod.tensorflow.keras.DistributedOptimizer``: same numbers, same options (every keyword of
horovod_kwargs.NAMES, handed over unchanged; unset ones keep Horovod's defaults and Horovod validates them), so a
benchmark that compares a mode against "allreduce" compares it against plain Horovod in the same run.
"""
from hetsync.algorithms import horovod_kwargs, register
from hetsync.algorithms._synchronous import IdleContribution, ReducedOnce, horovod_optimizer, loss_scale_parts
from hetsync.algorithms.base import SyncAlgorithm


@register
class HorovodAllreduce(IdleContribution, SyncAlgorithm):
    name = "allreduce"
    STEPPING = "lockstep"
    BARE_LOOP = True  # a lockstep allreduce of every step, as Horovod's own optimizer in a loop
    OPTIONS = {}
    HOROVOD_APPLIED = frozenset(horovod_kwargs.NAMES)
    HOROVOD_PASSTHROUGH = True

    def wrap(self, optimizer):
        import types

        import horovod.tensorflow.keras as hvd_keras
        import tensorflow as tf

        optimizer, loss_scaled = loss_scale_parts(optimizer)
        wrapped = horovod_optimizer(hvd_keras, optimizer, self.horovod_kwargs)
        # This rank's weight in the gradient average: 1, or 0 while it is idle (it stopped early; its steps still
        # take part in the others' allreduce, as Horovod's join would make them).  g * 1.0 == g exactly, so an
        # active rank computes what hvd.DistributedOptimizer computes, bit for bit.  Patched on the instance:
        # Horovod's class calls super(self.__class__, self), which a subclass would turn into a recursion.
        contribution = self.make_contribution()
        inner, apply = wrapped._allreduce, wrapped.apply_gradients
        once = ReducedOnce()  # a custom loop's gradients are allreduced in apply_gradients
        algorithm = self

        @tf.autograph.experimental.do_not_convert
        def _allreduce(opt, grads, variables):
            once.reduced()
            grads = algorithm.mark_compute_done(list(grads))
            return inner([_scaled(g, contribution) for g in grads], variables)

        def apply_gradients(grads_and_vars, *args, **kwargs):
            return apply(once.ready(wrapped, grads_and_vars), *args, **kwargs)

        wrapped._allreduce = types.MethodType(_allreduce, wrapped)
        wrapped.apply_gradients = apply_gradients
        return loss_scaled(wrapped)


def _scaled(grad, factor):
    import tensorflow as tf

    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)
