"""Run under mpirun, 2 ranks or more (in the training layer's job, tests/test_training_layer.py): the epoch-end
stop vote and the fit's initial broadcast.

Horovod's ``allreduce`` and ``broadcast`` are wrapped to record the names hetsync gives them (each call goes on to
Horovod's own): which collectives each fit made.

1. A fit of 2 epochs where every rank sets ``stop_training`` at the first epoch's end: the vote ends the fit
   there on every rank (1 epoch each).
2. A fit of 3 epochs where rank 1 sets ``stop_training`` at the last epoch's end only: the fit ends after 3
   epochs everywhere, with one model on every rank.  No vote is held at a fit's last epoch, where every rank leaves
   anyway (``epochs`` is agreed at the fit's start): 2 votes, at epochs 0 and 1, and rank 1's ``stop_training``
   is still set after the fit (a vote would have cleared it).
3. A fit of 1 epoch with Horovod's broadcast callback, the ranks' first weights different: rank 0's weights and
   its Adam's step count (int64) reach every rank before the first step, in one broadcast (the byte view of both
   dtypes).

Prints ``epochs rank=R fit1=E fit2=E``, ``collectives rank=R ...`` and OK rank=R.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd_tf  # noqa: E402
import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402

NAMES = []


def recorded(collective):
    """``collective`` (Horovod's own, called as is), recording the name each call gives it."""
    def call(*args, **kwargs):
        NAMES.append(kwargs.get("name") or "")
        return collective(*args, **kwargs)

    return call


def names_since(mark, prefix):
    return [n for n in NAMES[mark:] if n.startswith(prefix)]


def data():
    x = np.random.default_rng(hvd.rank()).normal(size=(256, 8)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).repeat().batch(16)


class StopAt(tf.keras.callbacks.Callback):
    """Sets ``stop_training`` at the end of epoch ``epoch`` (None: never); counts the epochs that ended."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.ended = epoch, 0

    def on_epoch_end(self, epoch, logs=None):
        self.ended += 1
        if epoch == self.epoch:
            self.model.stop_training = True


class FirstBatch(tf.keras.callbacks.Callback):
    """The first kernel and the optimizer's step count as the fit's first batch begins."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.seen = (self.model.weights[0].numpy().copy(), int(self.model.optimizer.iterations.numpy()))


def fitted(model, epochs, stop_epoch):
    """(epochs that ended, stop votes held) in one fit."""
    stop, mark = StopAt(stop_epoch), len(NAMES)
    hetsync.keras.fit(model, data(), steps_per_epoch=4, epochs=epochs, verbose=0, callbacks=[stop])
    return stop.ended, len(names_since(mark, "hetsync.stopvote."))


def same_everywhere(values, what):
    every = hvd.allgather(tf.constant(np.asarray(values)[None, :])).numpy()
    np.testing.assert_array_equal(every, np.repeat(every[:1], len(every), axis=0), err_msg=what)


def main():
    originals = hvd_tf.allreduce, hvd_tf.broadcast
    hvd_tf.allreduce, hvd_tf.broadcast = recorded(hvd_tf.allreduce), recorded(hvd_tf.broadcast)
    try:
        fits()
    finally:  # in the training layer's job the next script runs in this process
        hvd_tf.allreduce, hvd_tf.broadcast = originals


def fits():
    hvd.init()
    hetsync.init()
    rank = hvd.rank()
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), sync="ripples-static"), loss="mse")
    first = fitted(model, 2, stop_epoch=0)
    second = fitted(model, 3, stop_epoch=2 if rank == 1 else None)
    print(f"epochs rank={rank} fit1={first} fit2={second}", flush=True)
    assert (first, second) == ((1, 1), (3, 2)), (first, second)
    assert model.stop_training == (rank == 1), (rank, model.stop_training)  # no vote cleared rank 1's own stop
    same_everywhere(np.concatenate([w.numpy().ravel() for w in model.weights]), "weights after the fits")

    tf.keras.utils.set_random_seed(rank)  # different first weights on each rank
    fresh = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
    adam = tf.keras.optimizers.Adam(0.01)
    fresh.compile(hetsync.DistributedOptimizer(adam, sync="ripples-static"), loss="mse")
    fresh.optimizer.build(fresh.trainable_variables)
    if rank == 0:
        fresh.optimizer.iterations.assign(1000)  # a resumed optimizer's step count
    first_batch, mark = FirstBatch(), len(NAMES)
    hetsync.keras.fit(fresh, data(), steps_per_epoch=2, epochs=1, verbose=0,
                      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), first_batch])
    broadcasts, votes = names_since(mark, "hetsync.initial."), names_since(mark, "hetsync.stopvote.")
    print(f"collectives rank={rank} broadcasts={broadcasts} votes={votes}", flush=True)
    assert broadcasts == ["hetsync.initial.model_optimizer.uint8"] and not votes, (broadcasts, votes)
    weights, iterations = first_batch.seen
    same_everywhere(weights.ravel(), "weights before the first step")
    assert iterations == 1000, (rank, iterations)
    hetsync.shutdown()


if __name__ == "__main__":
    main()
    print(f"OK rank={hvd.rank()}", flush=True)
