"""ESync's aggregation (§3.1, eqs. 6-8), compiled: one Horovod allreduce per round (hetsync/algorithms/esync.py).

Kept apart from the worker's round loop because it is graph code with one rule of its own: every worker, idle or
not, calls it with the same shapes, so that the allreduce pairs up across ranks whatever each one did in the
round.
"""
import tensorflow as tf


class Aggregation:
    """w_t (``globals``), the variables a round exchanges, and the compiled aggregation of one model."""

    def __init__(self, trainable, others, name, compression, global_lr):
        self.trainable, self.others = list(trainable), list(others)
        with tf.init_scope():
            self.globals = [tf.Variable(v.read_value(), trainable=False, name="hetsync_esync_w_t")
                            for v in self.trainable]
        self.name, self.compression, self.global_lr = name, compression, float(global_lr)
        # (graph code with an explicit tf.cond: without AutoGraph, which would convert Horovod's allreduce function
        # by function on a process's first trace)
        self.fn = tf.function(self._aggregate, autograph=False)

    def follow_models(self):
        """w_t <- the model (after a sync point's consensus, the same on every worker)."""
        for w, v in zip(self.globals, self.trainable):
            w.assign(v)

    def _aggregate(self, active, start, steps):
        """Eqs. 6-8 in one Horovod allreduce; ``start``: w_t <- mean of the models instead (a fit's first step).
        The same allreduce sums the workers' local iterations (``steps``): the job's train steps in the round.
        An idle worker sends Δ = 0 with flag ``active`` = 0, so the mean is over the workers that trained.
        Returns (workers that trained, the job's train steps)."""
        import horovod.tensorflow as hvd

        trainable, others, globals_ = self.trainable, self.others, self.globals
        if start:
            parts = [v.read_value() for v in trainable]
        else:  # Δ_i = w_local - w_t (eq. 6)
            parts = [(v.read_value() - w.read_value()) * tf.cast(active, v.dtype)
                     for v, w in zip(trainable, globals_)]
        parts += [v.read_value() * tf.cast(active, v.dtype) for v in others]
        flat = tf.concat([tf.reshape(tf.cast(p, tf.float32), [-1]) for p in parts]
                         + [tf.reshape(tf.cast(active, tf.float32), [1]), tf.reshape(steps, [1])], 0)
        total = hvd.allreduce(flat, op=hvd.Sum, name=f"{self.name}.{'start' if start else 'delta'}",
                              compression=hvd.Compression.none if start else self.compression)
        count, job_steps = total[-2], total[-1]
        sizes = [p.shape.num_elements() for p in parts]
        pieces = tf.split(total[:-2], sizes)
        mean = [tf.reshape(p, v.shape) / tf.maximum(count, 1.0) for p, v in zip(pieces, trainable + others)]
        for v, w, m in zip(trainable, globals_, mean):  # w_{t+1} = w_t + ε·mean(Δ) (eqs. 7-8)
            new = tf.cast(m, v.dtype) if start else w.read_value() + tf.cast(self.global_lr * m, v.dtype)
            w.assign(new)
            v.assign(new)

        def take_others():  # (no worker trained: the non-trainable variables keep their values)
            for v, m in zip(others, mean[len(trainable):]):
                v.assign(tf.cast(m, v.dtype))
            return tf.constant(True)

        if others:
            tf.cond(count > 0, take_others, lambda: tf.constant(False))
        return count, job_steps
