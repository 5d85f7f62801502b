"""Run under mpirun: one short job as a user writes it, then the process exits (issue 18, "Exits").

    exit_job.py MODE              trains 2 short epochs in MODE and exits normally: exit code 0, no signal;
    exit_job.py MODE fail RANK    RANK raises a RuntimeError in a callback in the middle of epoch 2 while the
                                  others train on: the job must end (non-zero) within the engine timeout, with that
                                  traceback, and no process may die of a signal of its own (segfault).
The model is built lazily; Horovod's callbacks are in the list, as in Horovod's Keras example.
"""
import faulthandler
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
from common import digits, shard  # noqa: E402


class Bug(tf.keras.callbacks.Callback):
    def __init__(self, rank):
        super().__init__()
        self.rank, self.epoch = rank, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 3 and hvd.rank() == self.rank:
            print(f"rank {self.rank}: raising at {time.time():.3f}", flush=True)  # the test times the exit from here
            raise RuntimeError(f"user bug on rank {self.rank}")


def main():
    faulthandler.enable(all_threads=True)  # a rank dying of a signal (an abort at exit) prints every thread's stack
    mode = sys.argv[1]
    fail = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "fail" else None
    hvd.init()
    hetsync.init()
    x, y, _, _ = digits(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()), sync=mode)
    model.compile(opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    if fail is not None:
        callbacks.append(Bug(fail))
    hetsync.keras.fit(model, shard(x, y, hvd.rank(), hvd.size(), 32, 0), steps_per_epoch=8, epochs=2 if fail is None else 4,
              callbacks=callbacks, verbose=0)
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
