"""Run under mpirun -np 4: one 100,000-step epoch per mode (argument: modes, default all and auto), every rank
stopping on its own clock (rank r after 1 + 0.3 r seconds of its fit; rank 3 also 5x slower), a user callback
calling ``hvd.allreduce`` every 7 batches.

Without an agreed stop step the job would run the whole epoch (about 1,000 s per mode here) or hang.  Checks, per
mode, on every rank: ``fit`` returns within 30 s of this rank's own stop (the last rank stops 0.9 s after the
first: the rest is the job's last steps and the end round, a few seconds on this machine); every rank ran the same
Keras steps and the same user collectives; one model everywhere.  First, a bad ``steps_per_epoch`` on one rank is
refused on every rank, naming it, before any collective could hang.  Prints OK rank=R.
"""
import hashlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.training  # noqa: E402
import hetsync.testing  # noqa: E402
from hetsync import algorithms  # noqa: E402
from common import digit_images, without_autotune  # noqa: E402
from user_callbacks import PeriodicAllreduce  # noqa: E402

SLACK_S = 30.0


class Budget(tf.keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.t0, self.stopped_at, self.end = seconds, None, None, None

    def on_train_begin(self, logs=None):
        self.t0 = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.stopped_at is None and time.monotonic() - self.t0 > self.seconds:
            self.stopped_at = time.monotonic()
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.end = time.monotonic()


def bad_steps_are_refused_everywhere(x, y):
    """Bad input on one rank: rank 2 passes steps_per_epoch=0.  Every rank gets a ValueError naming rank 2, and
    nobody is left in a collective (the next fits run)."""
    model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="ripples-smart"))
    ds = without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32))
    try:
        hetsync.keras.fit(model, ds, steps_per_epoch=0 if hvd.rank() == 2 else 5, epochs=1, verbose=0)
    except ValueError as e:
        assert "ranks [2]" in str(e), str(e)
    else:
        raise AssertionError("a bad steps_per_epoch on rank 2 was accepted")


def main():
    hvd.init()
    hetsync.init()
    rank = hvd.rank()
    x, y = digit_images()
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else algorithms.available_modes() + ["auto"]
    bad_steps_are_refused_everywhere(x, y)
    for i, mode in enumerate(modes):
        tf.keras.utils.set_random_seed(rank)
        ds = without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(500, seed=rank).batch(32))
        model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=hetsync.DistributedOptimizer(tf.keras.optimizers.Adam(0.004), sync=mode))
        budget, user = Budget(1.0 + 0.3 * rank), PeriodicAllreduce(7)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hetsync.testing.SlowdownCallback("deterministic", ranks=[3], factor=5.0, base_time=0.005), budget, user]
        before = hetsync.training.position()
        hetsync.keras.fit(model, ds, steps_per_epoch=100000, epochs=1, callbacks=callbacks, verbose=0)
        late = budget.end - budget.stopped_at
        assert late < SLACK_S, (mode, f"fit ended {late:.1f} s after this rank stopped")
        keras_steps = hetsync.training.position() - before
        flat = np.concatenate([w.ravel() for w in model.get_weights()])
        row = (keras_steps, user.calls, hashlib.sha256(flat.tobytes()).hexdigest()[:12])
        rows = hvd_tf.allgather_object(row, name=f"long.{i}")
        assert len(set(rows)) == 1, (mode, rows)
        if rank == 0:
            print(f"{mode}: every rank left after {keras_steps} Keras steps, {late:.1f} s after rank 0's stop",
                  flush=True)
    assert hetsync.ops.engine_stats()["failed"] == 0
    hetsync.shutdown()
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
