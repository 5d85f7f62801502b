"""Idle ranks in the synchronous modes (``allreduce``, ``od-sgd``): they keep stepping with weight 0.

A rank that stopped early (hetsync/training/) must still take part in every gradient allreduce of the others, or
their collectives would never complete.  So its steps run as usual, with its gradients scaled by a contribution of
0 (Horovod's ``join`` semantics; ``hvd.join`` itself cannot be called twice in a process in Horovod 0.28).
"""
import tensorflow as tf

from hetsync.algorithms._wrap import rebuild_from_config


class IdleContribution:
    """Mixin for a SyncAlgorithm: ``self.contribution`` (1.0, or 0.0 while idle) and the idle hooks."""

    def make_contribution(self):
        with tf.init_scope():
            self.contribution = tf.Variable(1.0, trainable=False, name="hetsync_contribution")
        return self.contribution

    def on_idle(self):
        self.contribution.assign(0.0)

    def idle_step(self, train_function, iterator):
        return train_function(iterator)

    def on_resume(self):
        self.contribution.assign(1.0)


def loss_scale_parts(optimizer, algorithm):
    """(inner optimizer, rewrap) for a Keras ``LossScaleOptimizer`` (mixed precision), else (optimizer, identity).

    Horovod 0.28's DistributedOptimizer cannot wrap Keras 2.15's loss-scale optimizer (it rebuilds the optimizer
    from its config, which that class does not allow), so the Horovod-based modes wrap the inner optimizer and put
    the same loss scaling back around it: the allreduce then sees unscaled gradients, as Horovod's mixed-precision
    guide has it.  A step whose gradients overflow on one rank only is skipped there alone, as with Horovod.

    The loss-scale wrapper is of a class made for it whose ``from_config`` rebuilds the same mode (as every
    hetsync optimizer's does): Keras' own would rebuild the inner optimizer from its config alone, a plain one
    that exchanges nothing."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None or not hasattr(optimizer, "get_scaled_loss"):
        return optimizer, lambda wrapped: wrapped
    settings = {"dynamic": optimizer.dynamic, "initial_scale": float(optimizer.initial_scale)}
    if optimizer.dynamic:
        settings["dynamic_growth_steps"] = optimizer.dynamic_growth_steps
    base = type(optimizer)

    def rewrap(wrapped):
        cls = type(base.__name__, (base,), {"__module__": base.__module__})
        rebuild_from_config(cls, base, algorithm)
        return cls(wrapped, **settings)

    return inner, rewrap
