"""Data, model and logging shared by the examples.  Nothing is downloaded: scikit-learn ships the digits data set,
and the hyperplane regression (eager-SGD §6.2.1) is generated from a seed."""
import csv
import time

import numpy as np
import tensorflow as tf


def digits(seed=0):
    """scikit-learn's bundled 8x8 digits: (x_train, y_train, x_test, y_test), features scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    y = data.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def hyperplane(n=4096, dim=256, noise=0.1, seed=0):
    """y = a . x + noise with a fixed random ``a`` (eager-SGD §6.2.1, smaller): (x_train, y_train, x_test, y_test)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, 1)).astype("float32")
    x = rng.normal(size=(n, dim)).astype("float32")
    y = x @ a + noise * rng.normal(size=(n, 1)).astype("float32")
    cut = int(0.8 * n)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def task(name, seed=0, hidden=64):
    """(data, model builder, loss, metrics) for ``digits`` (an MLP with ``hidden`` units) or ``hyperplane``."""
    if name == "digits":
        data = digits(seed)

        def build():
            return tf.keras.Sequential([
                tf.keras.layers.Input((64,)),
                tf.keras.layers.Dense(hidden, activation="relu"),
                tf.keras.layers.Dense(10),
            ])

        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return data, build, loss, ["accuracy"]
    if name == "hyperplane":
        data = hyperplane(seed=seed)

        def build():
            return tf.keras.Sequential([tf.keras.layers.Input((data[0].shape[1],)), tf.keras.layers.Dense(1)])

        return data, build, tf.keras.losses.MeanSquaredError(), []
    raise ValueError(f"unknown task {name!r}; valid: digits, hyperplane")


def shard(x, y, rank, size, batch_size, seed):
    """This rank's shard, shuffled and repeated, in batches."""
    ds = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size]))
    return ds.shuffle(len(x), seed=seed + rank).repeat().batch(batch_size, drop_remainder=True)


class EvalLogger(tf.keras.callbacks.Callback):
    """Every ``every`` steps evaluates this worker's *local* model on a fixed test set and records
    (wall time since ``t0``, step, loss[, accuracy]); written as CSV at the end of training."""

    def __init__(self, x, y, loss, every, t0, path, rank):
        super().__init__()
        self.x, self.y, self.loss, self.every, self.t0, self.path, self.rank = x, y, loss, every, t0, path, rank
        self.rows = []
        self.step = 0
        self.last_step_time = None  # wall time (since t0) when this worker's last step ended

    def _eval(self):
        logits = self.model(self.x, training=False)
        loss = float(self.loss(self.y, logits))
        acc = float(np.mean(np.argmax(logits, axis=1) == self.y)) if logits.shape[-1] > 1 else float("nan")
        self.rows.append((time.time() - self.t0, self.step, loss, acc))

    def on_train_begin(self, logs=None):
        self._eval()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self.last_step_time = time.time() - self.t0
        if self.step % self.every == 0:
            self._eval()

    def on_train_end(self, logs=None):
        self._eval()
        if self.path:
            with open(self.path, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["rank", "time_s", "step", "loss", "accuracy"])
                writer.writerows((self.rank,) + row for row in self.rows)
