"""Run under mpirun -np 4: real models and optimizers in every mode (arguments: ``[quick] [modes]``, modes default
all), in one job.  ``quick`` (`make test`) runs one fit per mode of a two-input model that carries what the two fits
below carry between them, with the legacy optimizer inside the LossScaleOptimizer (every_feature_in_one_fit: a new
Keras optimizer under loss scaling is fit 1's alone); without it (`make test-full`), the two fits:

Per mode, two short ``fit`` calls with Horovod's broadcast, metric-average and learning-rate schedule callbacks
(the rate halved from the second epoch on), rank 3 2x slower:

1. Under ``mixed_float16``, a subclassed model (built lazily) with Conv2D, BatchNormalization, Dropout;
   ``LossScaleOptimizer(Adam)``, rebuilt by ``get_config``/``from_config`` (it trains in the same mode);
   ``steps_per_epoch=None`` on finite shards of different lengths (the job's epoch is their sum).  After fit the
   BatchNorm moving statistics are the same on every rank (the end-of-fit consensus averages every float variable,
   trainable or not) and moved away from their initial values.
2. Under ``mixed_float16`` too: a functional model with an ``Embedding`` (sparse IndexedSlices gradients), a legacy
   optimizer (``tf.keras.optimizers.legacy.SGD`` with momentum) inside a ``LossScaleOptimizer`` and Horovod's
   ``register_local_var``: the registered bias
   stays each worker's own (different on every rank: the shards differ), every other variable is the same
   everywhere.

Each: the loss on a fixed probe of the rank's data fell below LOSS_FRACTION of an untrained model's (ln 10), and one
model on every rank (checksums allgathered).  Prints OK rank=R.
"""
import hashlib
import math
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
import hetsync.marks  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.training  # noqa: E402
import hetsync.testing  # noqa: E402
from hetsync import algorithms  # noqa: E402
from common import digit_images, without_autotune  # noqa: E402

STEPS, EPOCHS = 6, 2
# After fit, the probe loss is below this fraction of an untrained model's (ln 10).  Measured (2026-11-26, every
# mode): mixed-batchnorm 0.083-0.210 (fractions 0.04-0.09), the token task 0.001-0.039 (up to 0.017).
LOSS_FRACTION = {"mixed-batchnorm": 0.25, "embedding": 0.1, "every-feature": 0.25}
LOSSES = []
_TAGS = iter(range(10 ** 6))


def digits():
    return digit_images()


def tokens(rank):
    """A learnable token task: the label is the first of 12 tokens (10 of them), the others are noise."""
    rng = np.random.default_rng(rank)
    x = rng.integers(0, 10, size=(512, 12)).astype("int32")
    return x, x[:, 0].astype("int64")


def checksum(weights):
    flat = np.concatenate([np.asarray(w, np.float32).ravel() for w in weights])
    return hashlib.sha256(flat.tobytes()).hexdigest()[:12]


def same_everywhere(what, weights):
    sums = hvd_tf.allgather_object(checksum(weights), name=f"matrix.{next(_TAGS)}")
    assert len(set(sums)) == 1, (what, sums)


def callbacks_for(lr):
    return [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
            # (momentum_correction=False: Horovod 0.28's correction fails on a new Keras optimizer's float
            # momentum, in plain Horovod too)
            hvd.callbacks.LearningRateScheduleCallback(initial_lr=lr, multiplier=lambda e: 0.5, start_epoch=1,
                                                       momentum_correction=False),
            hetsync.testing.SlowdownCallback("deterministic", ranks=[3], factor=2.0, base_time=0.01)]


def fit(model, opt, ds, probe, mode, steps_per_epoch=STEPS, what=""):
    """Compiles and fits with Horovod's callbacks; checks the loss on ``probe`` (the rank's first 256 training
    samples) fell well below an untrained model's, ln 10 on ten balanced classes (a model that does not train, or
    diverges, misses the bound), and that Horovod's schedule halved the learning rate from epoch 1 on."""
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)
    lr = float(tf.keras.backend.get_value(model.optimizer.lr))
    hetsync.keras.fit(model, ds, steps_per_epoch=steps_per_epoch, epochs=EPOCHS, callbacks=callbacks_for(lr), verbose=0)
    after = model.evaluate(*probe, batch_size=64, verbose=0)
    LOSSES.append((mode, what, round(after, 3)))
    if hvd.rank() == 0:
        print(f"{mode} {what}: probe loss {after:.3f} after fit", flush=True)
    assert after < LOSS_FRACTION[what] * math.log(10), (mode, what, after, LOSS_FRACTION[what] * math.log(10))
    now = float(tf.keras.backend.get_value(model.optimizer.lr))  # Horovod's schedule: halved from epoch 1 on
    assert abs(now - 0.5 * lr) < 1e-7, (mode, lr, now)
    return model


def hetsync_opt(base, mode):
    options = {"hop": {"max_ig": 12, "backup_workers": 1}}.get(mode, {})
    return hetsync.DistributedOptimizer(base, sync=mode, **options)


def repeated(x, y):
    rank = hvd.rank()
    return without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(256, seed=rank).batch(16))


class Net(tf.keras.Model):
    """A subclassed model (built lazily, at its first call) with Conv2D, BatchNormalization and Dropout."""

    def __init__(self):
        super().__init__()
        self.conv = tf.keras.layers.Conv2D(8, 3)
        # (momentum 0.5: the moving statistics the probe's inference uses settle within the fit's steps)
        self.bn = tf.keras.layers.BatchNormalization(momentum=0.5)
        self.flat = tf.keras.layers.Flatten()
        self.drop = tf.keras.layers.Dropout(0.2)
        self.out = tf.keras.layers.Dense(10, dtype="float32")  # logits in float32, as the mixed-precision guide says

    def call(self, x, training=False):
        h = tf.nn.relu(self.bn(self.conv(x), training=training))
        return self.out(self.drop(self.flat(h), training=training))


def subclassed_batchnorm_mixed_on_finite_shards(mode, x, y):
    """1. Under ``mixed_float16``: a subclassed model (built lazily) with Conv2D, BatchNormalization and Dropout,
    ``LossScaleOptimizer(Adam)`` rebuilt by ``get_config``/``from_config`` (it trains in the same mode),
    ``steps_per_epoch=None`` on finite shards of 10, 12, 14, 16 batches: every rank runs 16 Keras steps per epoch,
    and an "own" mode's epoch is the sum of the shards (train steps shared by speed).  After fit the BatchNorm
    moving statistics are the same on every rank (the end-of-fit consensus averages every float variable,
    trainable or not) and moved away from their initial values.  (A lazily built Sequential trains in every mode in
    tests/test_dropin.py's job: Horovod's example model.)"""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = Net()
        opt = hetsync_opt(tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(0.01)), mode)
        config = opt.get_config()
        again = type(opt).from_config(config)
        assert hetsync.marks.algorithm_of(again).name == mode, (mode, type(again).__mro__)
        assert abs(float(again.inner_optimizer.learning_rate) - 0.01) < 1e-7, config
        batches = 10 + 2 * hvd.rank()
        ds = without_autotune(tf.data.Dataset.from_tensor_slices((x[:16 * batches], y[:16 * batches])).batch(16))
        before = hetsync.training.position()
        fit(model, again, ds, (x[:256], y[:256]), mode, steps_per_epoch=None, what="mixed-batchnorm")
        assert hetsync.training.position() - before == EPOCHS * 16, (mode, hetsync.training.position() - before)
        same_everywhere((mode, "mixed-batchnorm"), model.get_weights())
        assert np.abs(model.bn.moving_mean.numpy()).max() > 0, (mode, "moving statistics never updated")
        trained = hvd_tf.allgather_object(int(model.optimizer.iterations.numpy()), name=f"matrix.it.{next(_TAGS)}")
        if hetsync.marks.algorithm_of(again).STEPPING == "own":
            # (iterations: a broadcast after a first step would copy rank 0's count to every rank: a few off at most)
            assert abs(sum(trained) - EPOCHS * 52) <= 8, (mode, trained)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def embedding_legacy_local_var(mode):
    """2. Under ``mixed_float16`` too: a functional model with an Embedding (sparse IndexedSlices gradients), a
    legacy optimizer (``tf.keras.optimizers.legacy.SGD`` with momentum) inside a ``LossScaleOptimizer`` (the legacy
    one, Keras' choice for a legacy optimizer) and Horovod's ``register_local_var``: the registered bias stays each
    worker's own (different on every rank: the shards differ), every other variable is the same everywhere.  (Both
    once failed: the Horovod-based modes allreduced a local variable's gradient under a LossScaleOptimizer, and
    balanced and OD-SGD did not trace under a legacy one.)"""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = tf.keras.Input((12,), dtype="int32")
        # (initial embeddings of unit-ish scale: the label's token moves the logits from the first steps on)
        h = tf.keras.layers.Embedding(10, 8,
                                      embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=1.0))(inputs)
        h = tf.keras.layers.Flatten()(h)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(10, dtype="float32")(h))
        opt = hetsync_opt(tf.keras.mixed_precision.LossScaleOptimizer(
            tf.keras.optimizers.legacy.SGD(0.5, momentum=0.9)), mode)
        local = model.layers[-1].bias
        opt.register_local_var(local)
        x, y = tokens(hvd.rank())  # shards differ
        fit(model, opt, repeated(x, y), (x[:256], y[:256]), mode, steps_per_epoch=2 * STEPS, what="embedding")
        shared = [w for w in model.weights if w is not local]
        same_everywhere((mode, "shared"), [w.numpy() for w in shared])
        biases = hvd_tf.allgather_object(checksum([local.numpy()]), name=f"matrix.local.{next(_TAGS)}")
        assert len(set(biases)) == hvd.size(), (mode, "a worker-local variable was exchanged or averaged", biases)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


class TwoInputNet(tf.keras.Model):
    """The quick variant's one model: Net's image branch beside an ``Embedding`` of the token input (sparse
    IndexedSlices gradients), joined into float32 logits."""

    def __init__(self):
        super().__init__()
        self.image = Net()
        self.embed = tf.keras.layers.Embedding(10, 8,
                                               embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=1.0))
        self.flat = tf.keras.layers.Flatten()
        self.out = tf.keras.layers.Dense(10, dtype="float32")

    def call(self, inputs, training=False):
        images, tokens = inputs
        h = tf.concat([tf.cast(self.image(images, training=training), self.compute_dtype),
                       tf.cast(self.flat(self.embed(tokens)), self.compute_dtype)], axis=-1)
        return self.out(h)


def every_feature_in_one_fit(mode, x, y):
    """The quick variant (``quick``, `make test`): one fit per mode whose model and optimizer carry what the two
    long fits carry between them -- ``mixed_float16``, a subclassed model (built by its first call) with Conv2D,
    BatchNormalization and Dropout, an ``Embedding`` (sparse gradients), a legacy optimizer (SGD with momentum)
    inside a ``LossScaleOptimizer``, rebuilt by ``get_config``/``from_config``, Horovod's ``register_local_var``
    on the output bias, finite shards of 10, 12, 14, 16 batches with ``steps_per_epoch=None``.  The same checks:
    the probe loss, Horovod's halved rate, one model (the local bias apart: different on every rank), BatchNorm's
    moving statistics moved, an "own" mode's epoch the sum of the shards."""
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = TwoInputNet()
        opt = hetsync_opt(tf.keras.mixed_precision.LossScaleOptimizer(
            tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9)), mode)
        again = type(opt).from_config(opt.get_config())
        assert hetsync.marks.algorithm_of(again).name == mode, (mode, type(again).__mro__)
        rng = np.random.default_rng(hvd.rank())
        tokens_ = rng.integers(0, 10, size=(len(y), 12)).astype("int32")
        tokens_[:, 0] = y  # the label's token: the embedding's part of the task
        batches = 10 + 2 * hvd.rank()
        n = 16 * batches
        ds = without_autotune(tf.data.Dataset.from_tensor_slices(((x[:n], tokens_[:n]), y[:n])).batch(16))
        model((x[:1], tokens_[:1]))  # built here: the output bias is registered before fit
        local = model.out.bias
        again.register_local_var(local)
        before = hetsync.training.position()
        fit(model, again, ds, ((x[:256], tokens_[:256]), y[:256]), mode, steps_per_epoch=None, what="every-feature")
        assert hetsync.training.position() - before == EPOCHS * 16, (mode, hetsync.training.position() - before)
        same_everywhere((mode, "every-feature"), [w.numpy() for w in model.weights if w is not local])
        biases = hvd_tf.allgather_object(checksum([local.numpy()]), name=f"matrix.local.{next(_TAGS)}")
        assert len(set(biases)) == hvd.size(), (mode, "a worker-local variable was exchanged or averaged", biases)
        assert np.abs(model.image.bn.moving_mean.numpy()).max() > 0, (mode, "moving statistics never updated")
        trained = hvd_tf.allgather_object(int(model.optimizer.iterations.numpy()), name=f"matrix.it.{next(_TAGS)}")
        if hetsync.marks.algorithm_of(again).STEPPING == "own":
            assert abs(sum(trained) - EPOCHS * 52) <= 8, (mode, trained)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def main():
    hvd.init()
    hetsync.init()
    tf.keras.utils.set_random_seed(hvd.rank())
    x, y = digits()
    args = sys.argv[1:]
    quick = bool(args) and args[0] == "quick"
    args = args[1:] if quick else args
    modes = args[0].split(",") if args else algorithms.available_modes()
    for mode in modes:
        if quick:
            every_feature_in_one_fit(mode, x, y)
        else:
            subclassed_batchnorm_mixed_on_finite_shards(mode, x, y)
            embedding_legacy_local_var(mode)
        if hvd.rank() == 0:
            print(f"{mode}: subclassed batchnorm + mixed precision + from_config on finite shards, embedding + "
                  f"legacy + local var ok{' (one fit)' if quick else ''}", flush=True)
    print(f"rank {hvd.rank()}: probe losses after fit: highest {max(loss for _, _, loss in LOSSES):.3f}", flush=True)
    assert hetsync.ops.engine_stats()["failed"] == 0
    hetsync.shutdown()
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
