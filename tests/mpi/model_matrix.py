"""Run under mpirun -np 4: real models and optimizers in every mode (argument: modes, default all), in one job.

Per mode, each a short ``fit`` with Horovod's broadcast, metric-average and learning-rate schedule callbacks (the
rate halved from the second epoch on), rank 3 2x slower:

1. ``Sequential`` built lazily (no Input layer) with Conv2D, BatchNormalization, Dropout; Adam.  After fit the
   BatchNorm moving statistics are the same on every rank (the end-of-fit consensus averages every float variable,
   trainable or not) and moved away from their initial values.
2. Functional model with an ``Embedding`` (sparse IndexedSlices gradients); SGD with momentum.
3. Subclassed model under ``mixed_float16`` with ``LossScaleOptimizer(Adam)``.
4. Legacy optimizer (``tf.keras.optimizers.legacy.SGD`` with momentum) and Horovod's ``register_local_var``: the
   registered bias stays each worker's own (different on every rank: the shards differ), every other variable is
   the same everywhere.
5. ``get_config``/``from_config``: the optimizer rebuilt from its config trains in the same mode, here with
   ``steps_per_epoch=None`` on finite shards of different lengths (the job's epoch is their sum).

Each: the loss went down and one model on every rank (checksums allgathered).  Prints OK rank=R.
"""
import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.training  # noqa: E402
import keras_callbacks  # noqa: E402
from hetsync import algorithms  # noqa: E402
from common import digit_images, without_autotune  # noqa: E402

STEPS, EPOCHS = 6, 2
_TAGS = iter(range(10 ** 6))


def digits():
    return digit_images()


def tokens(rank):
    """A learnable token task: the label is the first token mod 10."""
    rng = np.random.default_rng(rank)
    x = rng.integers(0, 64, size=(512, 12)).astype("int32")
    return x, (x[:, 0] % 10).astype("int64")


def checksum(weights):
    flat = np.concatenate([np.asarray(w, np.float32).ravel() for w in weights])
    return hashlib.sha256(flat.tobytes()).hexdigest()[:12]


def same_everywhere(what, weights):
    sums = hvd_tf.allgather_object(checksum(weights), name=f"matrix.{next(_TAGS)}")
    assert len(set(sums)) == 1, (what, sums)


def fit(model, opt, x, y, mode):
    rank = hvd.rank()
    ds = without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(256, seed=rank).batch(16))
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)
    lr = float(tf.keras.backend.get_value(model.optimizer.lr))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 # (momentum_correction=False: Horovod 0.28's correction fails on a new Keras optimizer's float
                 # momentum, in plain Horovod too)
                 hvd.callbacks.LearningRateScheduleCallback(initial_lr=lr, multiplier=lambda e: 0.5, start_epoch=1,
                                                            momentum_correction=False),
                 keras_callbacks.Slowdown("deterministic", ranks=[3], factor=2.0, base_time=0.01)]
    history = model.fit(ds, steps_per_epoch=STEPS, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] * 1.05 or losses[-1] < 1.0, (mode, losses)
    now = float(tf.keras.backend.get_value(model.optimizer.lr))  # Horovod's schedule: halved from epoch 1 on
    assert abs(now - 0.5 * lr) < 1e-7, (mode, lr, now)
    return model


def hetsync_opt(base, mode):
    options = {"hop": {"max_ig": 12, "backup_workers": 1}}.get(mode, {})
    return hetsync.DistributedOptimizer(base, sync=mode, **options)


def lazy_batchnorm(mode, x, y):
    model = tf.keras.Sequential([tf.keras.layers.Conv2D(8, 3), tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.ReLU(), tf.keras.layers.Flatten(), tf.keras.layers.Dropout(0.2),
                                 tf.keras.layers.Dense(10)])
    fit(model, hetsync_opt(tf.keras.optimizers.Adam(0.01), mode), x, y, mode)
    bn = model.layers[1]
    same_everywhere((mode, "batchnorm"), model.get_weights())
    assert np.abs(bn.moving_mean.numpy()).max() > 0, (mode, "moving statistics never updated")


def functional_embedding(mode):
    inputs = tf.keras.Input((12,), dtype="int32")
    h = tf.keras.layers.Embedding(64, 8)(inputs)
    h = tf.keras.layers.Flatten()(h)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(h))
    x, y = tokens(hvd.rank())
    fit(model, hetsync_opt(tf.keras.optimizers.SGD(0.05, momentum=0.9), mode), x, y, mode)
    same_everywhere((mode, "embedding"), model.get_weights())


class Net(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.conv = tf.keras.layers.Conv2D(8, 3, activation="relu")
        self.flat = tf.keras.layers.Flatten()
        self.out = tf.keras.layers.Dense(10, dtype="float32")  # logits in float32, as the mixed-precision guide says

    def call(self, x, training=False):
        return self.out(self.flat(self.conv(x)))


def subclassed_mixed(mode, x, y):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = Net()
        opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(0.01))
        fit(model, hetsync_opt(opt, mode), x, y, mode)
        same_everywhere((mode, "mixed"), model.get_weights())
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def legacy_local_var(mode, x, y):
    model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model(x[:1])  # built, so its bias exists to register
    opt = hetsync_opt(tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), mode)
    local = model.layers[-1].bias
    opt.register_local_var(local)
    ranks = hvd.rank()
    lo = ranks * len(x) // 4
    fit(model, opt, x[lo:lo + len(x) // 4], y[lo:lo + len(x) // 4], mode)  # shards differ
    shared = [w for w in model.weights if w is not local]
    same_everywhere((mode, "shared"), [w.numpy() for w in shared])
    biases = hvd_tf.allgather_object(checksum([local.numpy()]), name=f"matrix.local.{next(_TAGS)}")
    assert len(set(biases)) == hvd.size(), (mode, "a worker-local variable was exchanged or averaged", biases)


def rebuilt_from_config_on_finite_shards(mode, x, y):
    """from_config; and steps_per_epoch=None with finite shards of 10, 12, 14, 16 batches: every rank runs 16 Keras
    steps per epoch, and an "own" mode's epoch is the sum of the shards (train steps shared by speed)."""
    opt = hetsync_opt(tf.keras.optimizers.Adam(0.01), mode)
    config = opt.get_config()
    assert abs(float(config["learning_rate"]) - 0.01) < 1e-7, config
    again = type(opt).from_config(config)
    assert again._hetsync_algorithm.name == mode, (mode, again)
    model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
    rank = hvd.rank()
    batches = 10 + 2 * rank
    ds = tf.data.Dataset.from_tensor_slices((x[:16 * batches], y[:16 * batches])).batch(16)
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=again)
    before = hetsync.training.position()
    model.fit(ds, epochs=EPOCHS, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert hetsync.training.position() - before == EPOCHS * 16, (mode, hetsync.training.position() - before)
    same_everywhere((mode, "from_config"), model.get_weights())
    trained = hvd_tf.allgather_object(int(model.optimizer.iterations.numpy()), name=f"matrix.it.{next(_TAGS)}")
    if again._hetsync_algorithm.STEPPING == "own":
        # (iterations: Horovod's first-batch broadcast copies rank 0's count to every rank, a few off at most)
        assert abs(sum(trained) - EPOCHS * 52) <= 8, (mode, trained)


def main():
    hvd.init()
    hetsync.init()
    tf.keras.utils.set_random_seed(hvd.rank())
    x, y = digits()
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else algorithms.available_modes()
    for mode in modes:
        lazy_batchnorm(mode, x, y)
        functional_embedding(mode)
        subclassed_mixed(mode, x, y)
        legacy_local_var(mode, x, y)
        rebuilt_from_config_on_finite_shards(mode, x, y)
        if hvd.rank() == 0:
            print(f"{mode}: batchnorm, embedding, mixed precision, legacy + local var, from_config ok", flush=True)
    assert hetsync.ops.engine_stats()["failed"] == 0
    hetsync.shutdown()
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
