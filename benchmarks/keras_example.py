"""The benchmark's training script: Horovod's Keras example as a user runs it, with the optimizer line as the only
difference between plain Horovod and hetsync.

    horovodrun -np 4 -H localhost:4 python benchmarks/keras_example.py --sync horovod   # plain Horovod: hetsync
                                                                                         # is not even imported
    horovodrun -np 4 -H localhost:4 python benchmarks/keras_example.py --sync esync     # one line changed

The shape of Horovod's ``tensorflow2_keras_mnist.py``: Adam with the learning rate scaled by the number of workers
(``--optimizer sgd``: plain SGD with momentum, where the size of each averaged gradient is the size of the step),
``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback()``, ``LearningRateWarmupCallback``, real epochs of
``--steps`` train steps per rank, and a user's own ``hvd.allreduce`` every ``--allreduce-every`` batches.  The data
is scikit-learn's bundled 8x8 digits (nothing is downloaded) for a small CNN; every step is real compute, nothing is
emulated: a slow rank is slow because of its CPU quota (benchmarks/quota.py), not a sleep.  The one exception is
the sleep-emulated "slow GPU" scenarios (``--device-ms``): there each training forward pass also sleeps an
accelerator's device time, per sample of the batch, longer on a slow rank (``--device-factors``) or, with
``--device-random P,F``, F times longer at a random P of each rank's steps (seeded: a shared GPU, variable input
lengths), with every rank at the same CPU quota.

Clocks (each rank's own ``time.monotonic``; nothing is compared across ranks): every rank meets the others in one
Horovod allreduce just before ``fit`` (``clock`` "common-start" in its record), and ``train_s`` runs from there to
fit's ``on_train_end`` (``fit`` itself may return much later: tf.data's autotuning can hold a rank at the end of
fit).  The start is the same point of the job for every mode: what a mode does before Keras' ``on_train_begin`` (the
training layer's gather and broadcast, building the mode) is in its time, and no mode's time holds the ranks'
different start-up (imports, the model built under a slow node's quota).  Runs stored before this clock
(``clock`` absent) timed from ``on_train_begin``: plain Horovod's first step then waited out the ranks' start-up
skew, while hetsync's training layer had waited it out in its gather before ``on_train_begin``
(docs/benchmarks.md, "The clock").  ``fit_begin_s`` is the time from the start to ``on_train_begin``.  Rank 0
evaluates its own model on the held-out set every ``--eval-every`` of its batches and at the end; ``curve`` holds
(seconds since the start, accuracy, loss), so the time to a target accuracy is read off it.  ``cpu_s`` and
``epoch_cpu`` are the rank's process CPU seconds (every thread) from the start to the end of training and to each
epoch's end: what its quota let it use.  Each rank writes
``rank<R>.json`` under ``--out``.
"""
import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

from common import digit_images_split  # noqa: E402  (examples/common.py: the digits, without scikit-learn)
from user_callbacks import PeriodicAllreduce  # noqa: E402  (no hetsync import)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sync", default="horovod", help="'horovod' (plain hvd.DistributedOptimizer) or a hetsync mode")
    p.add_argument("--sync-options", default="{}", help="the hetsync mode's options, as JSON")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=50, help="train steps per rank per epoch (Keras steps_per_epoch)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="adam (Horovod's example) or sgd (plain SGD with momentum 0.9, as ResNet recipes train)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate per worker, scaled by size (default: 0.001 for adam, 0.01 for sgd)")
    p.add_argument("--allreduce-every", type=int, default=7, help="a user's hvd.allreduce every N batches (0: none)")
    p.add_argument("--eval-every", type=int, default=10, help="rank 0 evaluates its model every N of its batches")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device-ms", type=float, default=0.0,
                   help="emulated device time per sample of a training batch, in ms (0: none, real compute only)")
    p.add_argument("--device-factors", default="",
                   help="comma list, one per rank: how many times the normal device time each rank's GPU takes")
    p.add_argument("--device-random", default="",
                   help="P,F: at a random P of its training steps (seeded per rank) a rank's device time is F times "
                        "longer")
    p.add_argument("--out", required=True, help="directory for rank<R>.json")
    p.add_argument("--started-file", default="",
                   help="rank 0 creates this file when training time starts (the driver's quota changes count from it)")
    return p.parse_args(argv)


class DeviceTime(tf.keras.layers.Layer):
    """Emulated accelerator time: a training forward pass sleeps ``seconds_per_sample`` for every row of its batch.

    Device time grows with the rows a step computes, as a GPU's does, so a mode that gives a slow worker fewer rows
    (``balanced``) shortens its steps here as it would on a real slow GPU; a CPU quota does not model that, which is
    why both kinds of scenario are stored.  Evaluation (``training=False``) does not sleep.
    """

    def __init__(self, seconds_per_sample, random_slow=None, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.seconds_per_sample = seconds_per_sample
        self.random_slow, self.rng = random_slow, random.Random(seed)  # (probability, factor) of a slow step

    def _sleep(self, rows):
        factor = 1.0
        if self.random_slow and self.rng.random() < self.random_slow[0]:
            factor = self.random_slow[1]
        time.sleep(float(rows) * self.seconds_per_sample * factor)
        return np.float32(0.0)

    def call(self, x, training=None):
        if not training:
            return x
        slept = tf.py_function(self._sleep, [tf.shape(x)[0]], Tout=tf.float32)
        with tf.control_dependencies([slept]):
            return tf.identity(x)


def build_model(device_s=0.0, random_slow=None, seed=0):
    """Horovod's example CNN, sized for 8x8 images; built lazily, as there.  With ``device_s`` (seconds per sample),
    a :class:`DeviceTime` layer first (``random_slow``: its (probability, factor) of a slow step, ``seed`` its
    draws')."""
    emulated = [DeviceTime(device_s, random_slow, seed)] if device_s > 0 else []
    return tf.keras.Sequential(emulated + [
        tf.keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        tf.keras.layers.Conv2D(64, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10),
    ])


class Clock(tf.keras.callbacks.Callback):
    """This rank's training clock and train steps; on rank 0 also the accuracy curve of its own model."""

    def __init__(self, x_test, y_test, eval_every, evaluate):
        super().__init__()
        self.x_test, self.y_test, self.eval_every, self.evaluate = x_test, y_test, eval_every, evaluate
        self.t0 = self.train_s = self.fit_begin_s = self.cpu0 = self.cpu_s = None
        self.batches, self.curve, self.epoch_ends, self.epoch_cpu = 0, [], [], []
        self.batch_ends = []  # seconds since the clock's zero at each train step's end: where a run's time went

    def start(self):
        """The clock's zero: after the allreduce every rank makes just before fit (see the module docstring)."""
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()  # this rank's CPU (every thread): what its quota let it use, and on what

    def on_train_begin(self, logs=None):
        self.fit_begin_s = time.monotonic() - self.t0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        self.batch_ends.append(round(time.monotonic() - self.t0, 3))
        if self.evaluate and self.batches % self.eval_every == 0:
            self.point()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(round(time.monotonic() - self.t0, 3))  # epochs 2..N: the steady state, no first trace
        self.epoch_cpu.append(round(time.process_time() - self.cpu0, 3))

    def on_train_end(self, logs=None):
        self.train_s = time.monotonic() - self.t0
        self.cpu_s = round(time.process_time() - self.cpu0, 3)
        if self.evaluate:
            self.point()

    def point(self):
        at = time.monotonic() - self.t0
        logits = self.model(self.x_test, training=False)
        loss = tf.keras.losses.sparse_categorical_crossentropy(self.y_test, logits, from_logits=True)
        accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == self.y_test))
        self.curve.append((round(at, 3), round(accuracy, 4), round(float(tf.reduce_mean(loss)), 4)))


def main(argv=None):
    args = parse(argv)
    plain = args.sync == "horovod"
    hvd.init()
    if not plain:
        import hetsync  # deferred: plain Horovod's run must not import hetsync at all
        import hetsync.keras  # deferred: likewise

        hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed + rank)
    x, y, x_test, y_test = digit_images_split(args.seed)
    dataset = (tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).repeat()
               .shuffle(1000, seed=args.seed + rank).batch(args.batch_size))
    factors = [float(f) for f in args.device_factors.split(",")] if args.device_factors else [1.0] * size
    if len(factors) != size:
        raise SystemExit(f"--device-factors has {len(factors)} values for {size} ranks")
    random_slow = tuple(float(v) for v in args.device_random.split(",")) if args.device_random else None
    if random_slow is not None and (len(random_slow) != 2 or not 0 <= random_slow[0] <= 1 or random_slow[1] < 1):
        raise SystemExit(f"--device-random wants P,F with 0 <= P <= 1 and F >= 1, got {args.device_random!r}")
    model = build_model(args.device_ms / 1000.0 * factors[rank], random_slow, seed=1000 * args.seed + rank)
    lr = (args.lr or {"adam": 0.001, "sgd": 0.01}[args.optimizer]) * size
    opt = tf.keras.optimizers.Adam(lr) if args.optimizer == "adam" else tf.keras.optimizers.SGD(lr, momentum=0.9)
    if plain:
        opt = hvd.DistributedOptimizer(opt)
    else:
        opt = hetsync.DistributedOptimizer(opt, sync=args.sync, **json.loads(args.sync_options))
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    clock = Clock(x_test, y_test, args.eval_every, evaluate=rank == 0)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 # no momentum correction: it sets Keras 2.13+'s float momentum as a variable and fails (Adam has none)
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, momentum_correction=False, warmup_epochs=1,
                                                          verbose=0),
                 PeriodicAllreduce(args.allreduce_every), clock]
    fit = model.fit if plain else (lambda *a, **k: hetsync.keras.fit(model, *a, **k))
    hvd.allreduce(tf.constant(0.0), name="benchmark.start")  # the clock's zero, the same point for every mode
    clock.start()
    if rank == 0 and args.started_file:
        open(args.started_file, "w").close()
    began = time.monotonic()
    fit(dataset, steps_per_epoch=args.steps, epochs=args.epochs, callbacks=callbacks, verbose=0)
    fit_s = time.monotonic() - began
    os.makedirs(args.out, exist_ok=True)
    # sync="auto" and live switches: where each switch happened and the policy's evidence, so a run's time can be
    # read against what it trained in, and whether the new mode's step was traced at the switch or ahead of it
    switches = [] if plain else [{k: h[k] for k in ("position", "from", "to", "reason", "seconds", "traced",
                                                    "traced_ahead")}
                                 for h in hetsync.switch_history(model)]
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "size": size, "sync": args.sync, "clock": "common-start", "train_s": clock.train_s,
                   "fit_begin_s": clock.fit_begin_s, "fit_s": fit_s,
                   "batches": clock.batches, "curve": clock.curve,
                   "epoch_ends": clock.epoch_ends, "batch_ends": clock.batch_ends, "cpu_s": clock.cpu_s,
                   "epoch_cpu": clock.epoch_cpu, "switches": switches}, f)
    print(f"rank {rank}: {args.sync} train {clock.train_s:.1f} s, fit {fit_s:.1f} s, {clock.batches} batches"
          + (f", final accuracy {clock.curve[-1][1]:.3f}" if clock.curve else ""), flush=True)


if __name__ == "__main__":
    main()
