"""Idle ranks in the synchronous modes (``allreduce``, ``od-sgd``): they keep stepping with weight 0.

A rank that stopped early (hetsync/training/) must still take part in every gradient allreduce of the others, or
their collectives would never complete.  So its steps run as usual, with its gradients scaled by a contribution of
0 (Horovod's ``join`` semantics; ``hvd.join`` itself cannot be called twice in a process in Horovod 0.28).
"""
import tensorflow as tf


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
