"""A user's own Keras callback, as Horovod users write them: no hetsync import, so plain-Horovod runs
(benchmarks/keras_example.py --sync horovod) use it as they are.  Shared by examples/horovod_keras_mnist.py, the
benchmark's script and the tests that put a user's collective between hetsync's steps."""
import horovod.tensorflow.keras as hvd
import tensorflow as tf


class PeriodicAllreduce(tf.keras.callbacks.Callback):
    """A user's own global collective between steps: the batch loss averaged with Horovod every ``every`` batches
    (``calls``: how many it made -- every rank must make the same number, or a Horovod collective would hang)."""

    def __init__(self, every):
        super().__init__()
        self.every, self.calls, self.count = int(every), 0, 0

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        if self.every and self.count % self.every == 0:
            hvd.allreduce(tf.constant(float((logs or {}).get("loss", 0.0))), name=f"user.loss.{self.calls}")
            self.calls += 1
