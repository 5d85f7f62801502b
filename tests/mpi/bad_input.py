"""Run under mpirun -np 2: bad input that needs the other ranks to be seen (README "Bad input").

    bad_input.py ranks     different sync modes on the two ranks, then an option invalid on rank 1 only: each
                           raises the same ValueError on every rank (no rank left in a collective), as does a fit
                           with Horovod's broadcast callback on rank 0 only; then a correct DistributedOptimizer and
                           a short fit work in the same job.  Prints OK rank=R.
    bad_input.py absent    HETSYNC_TIMEOUT=5, sync="ripples-smart": rank 1 sits in a callback for 120 s after its
                           first step (a hung user callback) while rank 0 trains on and asks for a switch.  Rank 0
                           reaches the switch and raises a RuntimeError naming rank 1 within the timeout (the job
                           then ends non-zero).  Rank 0 prints the time.time() of its request and of its fit's end.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402


def expect(fragment, **kwargs):
    try:
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **kwargs)
    except ValueError as exc:
        assert fragment in str(exc), f"rank {hvd.rank()}: {exc!s}"
        return str(exc)
    raise AssertionError(f"rank {hvd.rank()}: {kwargs} was accepted")


def data():
    x = np.random.default_rng(hvd.rank()).normal(size=(256, 8)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).repeat().batch(16)


def ranks():
    rank = hvd.rank()
    expect("ranks [1] were given other arguments than rank 0", sync="hop" if rank == 1 else "allreduce")
    expect("hetsync.DistributedOptimizer failed on rank(s) [1]: sync='eager-solo': option timeout='5' (str)",
           sync="eager-solo", timeout="5" if rank == 1 else 5.0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), sync="ripples-smart"), loss="mse")
    one_sided = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if rank == 0 else []
    try:
        hetsync.keras.fit(model, data(), steps_per_epoch=5, epochs=2, verbose=0, callbacks=one_sided)
        raise AssertionError(f"rank {rank}: a broadcast callback on rank 0 only was accepted")
    except ValueError as exc:
        assert "BroadcastGlobalVariablesCallback is passed on ranks [0] with roots [0], but every rank must pass it " \
               "with the same root_rank" in str(exc), f"rank {rank}: {exc!s}"
    switch_on_one = [hetsync.callbacks.SyncModeCallback()] if rank == 0 else []
    try:
        hetsync.keras.fit(model, data(), steps_per_epoch=5, epochs=2, verbose=0, callbacks=switch_on_one)
        raise AssertionError(f"rank {rank}: a SyncModeCallback on rank 0 only was accepted")
    except ValueError as exc:
        assert "ranks [1] differ from rank 0 in having a hetsync.callbacks.SyncModeCallback" in str(exc), \
            f"rank {rank}: {exc!s}"
    try:  # rank 1 would leave fit an epoch early, while rank 0 waits in the epoch's collectives
        hetsync.keras.fit(model, data(), steps_per_epoch=5, epochs=3 if rank == 0 else 2, verbose=0)
        raise AssertionError(f"rank {rank}: different epochs on the ranks were accepted")
    except ValueError as exc:
        assert "fit's epochs and initial_epoch must be the same ints on every rank, got (epochs, initial_epoch) " \
               "[(3, 0), (2, 0)] by rank" in str(exc), f"rank {rank}: {exc!s}"
    hetsync.keras.fit(model, data(), steps_per_epoch=5, epochs=2, verbose=0,
                      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    print(f"OK rank={rank}", flush=True)


class Stuck(tf.keras.callbacks.Callback):
    """Rank 1 sits in this callback for 120 s after its first step (mpirun ends it when rank 0 fails); rank 0 asks
    for esync after its second."""

    def __init__(self, switch):
        super().__init__()
        self.switch = switch

    def on_train_batch_end(self, batch, logs=None):
        if batch == 1 and hvd.rank() == 0:
            print(f"rank 0: asked for esync at {time.time():.3f}", flush=True)
            self.switch.request("esync")
        if batch == 0 and hvd.rank() == 1:
            time.sleep(120)


def absent():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), sync="ripples-smart"), loss="mse")
    switch = hetsync.callbacks.SyncModeCallback()
    began = time.monotonic()
    try:
        hetsync.keras.fit(model, data(), steps_per_epoch=50, epochs=1, verbose=0, callbacks=[switch, Stuck(switch)])
    finally:
        print(f"rank {hvd.rank()}: fit ended after {time.monotonic() - began:.1f} s, at {time.time():.3f}",
              flush=True)


def main():
    hvd.init()
    hetsync.init()
    {"ranks": ranks, "absent": absent}[sys.argv[1]]()


if __name__ == "__main__":
    main()
