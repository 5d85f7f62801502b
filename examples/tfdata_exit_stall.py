"""TensorFlow 2.15 alone (no MPI, Horovod or hetsync): how long Model.fit takes to return after its last callback.

Deleting fit's tf.data iterator can wait for tf.data's autotune thread to finish its current optimization period
(the period doubles from 10 ms up to 60 s), which shows as a return seconds after ``on_train_end``
(docs/limitations.md).  Run several at once on a loaded machine to see it:

    for s in 33 43 53 63; do .venv/bin/python examples/tfdata_exit_stall.py $s & done; wait
    .venv/bin/python examples/tfdata_exit_stall.py 45 off     # autotune disabled: returns at once

argv: seconds of training (50 ms per step), then "off" to disable tf.data autotuning; HVD=1 also runs hvd.init().
"""
import os
import sys
import time

import numpy as np
import tensorflow as tf


class _LastCallback(tf.keras.callbacks.Callback):
    """50 ms of emulated compute per step; notes when fit's last callback ran."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)

    def on_train_end(self, logs=None):
        self.end = time.time()


def main(argv):
    seconds = float(argv[0]) if argv else 40.0
    autotune = not (len(argv) > 1 and argv[1] == "off")
    if os.environ.get("HVD"):
        import horovod.tensorflow.keras as hvd

        hvd.init()
    x = np.random.rand(1000, 64).astype("float32")
    y = np.random.randint(0, 10, 1000)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).repeat().batch(32, drop_remainder=True)
    if not autotune:
        options = tf.data.Options()
        options.autotune.enabled = False
        ds = ds.with_options(options)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    last = _LastCallback()
    began = time.time()
    model.fit(ds, steps_per_epoch=int(seconds / 0.05), epochs=1, verbose=0, callbacks=[last])
    print(f"autotune={autotune} train {last.end - began:.1f}s, fit returned {time.time() - last.end:.2f}s after "
          "its last callback", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
