"""The Keras front doors (under mpirun -np 4, in the training layer's job; tests/test_training_layer.py).

1. A model compiled with a hetsync optimizer refuses plain ``model.fit``: a ValueError naming
   ``hetsync.keras.fit`` on every rank, at the first step, before any collective of it (every rank gets here and
   the job goes on).
2. ``hetsync.keras.fit`` trains it (its loss falls), and a plain ``model.fit`` afterwards is refused again (Keras
   reuses the compiled train function).
3. In the same process a model with Horovod's own ``hvd.DistributedOptimizer`` trains with its own ``model.fit`` as
   the user wrote it: ``tf.keras.Model.fit`` is Keras' own, no model carries a ``fit`` of its own, and the Horovod
   model's loss falls and its weights are the same on every rank.
4. ``hetsync.keras.fit`` traces a lazily built model's train step once (plain Keras traces it twice: the first
   trace creates the variables), without moving anything before the first batch (BatchNorm's statistics are still
   their initial values there), and it trains exactly as Horovod does: with sync="allreduce", from the same
   seed and batches, the same weights as ``hvd.DistributedOptimizer`` with ``model.fit`` (BatchNorm's statistics:
   the ranks' average, hetsync's end-of-fit consensus).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402


def data(rank):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()


def model_with(optimizer):
    tf.keras.utils.set_random_seed(7)  # the same first weights on every rank, so the first loss is known
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def refused(model, rank):
    try:
        model.fit(data(rank), steps_per_epoch=4, epochs=1, verbose=0)
    except ValueError as exc:
        assert "hetsync.keras.fit(model, ...)" in str(exc), exc
        return True
    return False


class FirstBatch(tf.keras.callbacks.Callback):
    """BatchNorm's moving mean when the first batch begins."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:  # (None: not built yet, Keras builds it in the first trace)
            mean = getattr(self.model.layers[1], "moving_mean", None)
            self.moving_mean = None if mean is None else mean.numpy().copy()


def lazy_model(optimizer):
    """A Sequential built at its first call, with BatchNorm and a metric; counts the traces of its train step."""
    tf.keras.utils.set_random_seed(11)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8), tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.Dense(1)])
    model.traces = 0
    inner = model.train_step

    def counted(data):
        model.traces += 1
        return inner(data)

    model.train_step = counted
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model


def traced_once(rank):
    """4: one trace under hetsync.keras.fit, two under Keras' own fit, and the same training."""
    first = FirstBatch()
    model = lazy_model(hetsync.DistributedOptimizer(tf.keras.optimizers.Adam(0.01), sync="allreduce"))
    hetsync.keras.fit(model, data(rank), steps_per_epoch=6, epochs=1, verbose=0, callbacks=[first])
    assert model.traces == 1, f"hetsync.keras.fit traced the train step {model.traces} times"
    assert first.moving_mean is not None and not first.moving_mean.any(), ("statistics moved before the first "
                                                                         "batch", first.moving_mean)
    plain = lazy_model(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)))
    plain.fit(data(rank), steps_per_epoch=6, epochs=1, verbose=0)
    assert plain.traces == 2, f"Keras' own fit traced the train step {plain.traces} times (expected 2)"
    for mine, theirs in zip(model.weights, plain.weights):  # (hetsync's fit ends with one model: BatchNorm's
        # statistics, each rank's own under plain Horovod, are their average over the ranks)
        want = theirs.numpy() if mine.trainable else hvd.allreduce(theirs, name=f"fd.{mine.name}").numpy()
        np.testing.assert_allclose(mine.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=mine.name)


def main():
    hvd.init()
    hetsync.init()
    rank = hvd.rank()
    model = model_with(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), sync="ripples-smart"))
    assert refused(model, rank), "plain model.fit of a hetsync model trained"
    # trained: the one model every rank ends with fits held-out data far better than the first weights did (the
    # epochs' mean losses are per rank and depend on how far apart the ranks ran, so they are not the measure)
    first = model.evaluate(data(100), steps=4, verbose=0)
    hetsync.keras.fit(model, data(rank), steps_per_epoch=10, epochs=3, verbose=0)
    last = model.evaluate(data(100), steps=4, verbose=0)
    print(f"front-doors rank={rank}: held-out loss {first:.3f} -> {last:.3f}", flush=True)
    assert last < 0.1 * first, (first, last)
    assert refused(model, rank), "plain model.fit after hetsync.keras.fit trained"

    plain = model_with(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)))
    assert tf.keras.Model.fit.__module__.startswith("keras"), tf.keras.Model.fit.__module__
    assert "fit" not in vars(plain) and "fit" not in vars(model)
    first = plain.evaluate(data(rank), steps=4, verbose=0)
    plain.fit(data(rank), steps_per_epoch=10, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert plain.evaluate(data(rank), steps=4, verbose=0) < 0.5 * first
    weights = np.concatenate([w.numpy().ravel() for w in plain.weights])
    every = hvd.allgather(tf.constant(weights[None, :])).numpy()
    np.testing.assert_allclose(every, np.repeat(every[:1], len(every), axis=0), rtol=0, atol=1e-6)
    traced_once(rank)
    hetsync.shutdown()


if __name__ == "__main__":
    main()
    print(f"OK rank={hvd.rank()}", flush=True)
