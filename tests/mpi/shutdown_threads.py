"""Run under mpirun -np 1: pretrace leaves the mode in force alone; hetsync.shutdown() stops every thread, channel
and server hetsync started (issue 18).

1. sync="auto" with ripples-smart as the homogeneous candidate (started in) and ripples-random as the straggler one:
   after the
   first step the candidates are pretraced (wrapped, their train steps traced) and the Group Generator still serves
   ripples-smart's configuration (wrapping ripples-random used to install its own under the running mode).
2. Trains in ripples-smart (its Group Generator away watcher is a thread), switches to esync (a State Server
   client; the watcher ends with ripples-smart) and back (it runs again), then calls hetsync.shutdown(): no thread
   named hetsync-* is left, rank 0's coordinator server no longer answers, and a second shutdown() is a no-op.
Prints OK rank=0.
"""
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import grpc  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.marks  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
from hetsync import _runtime  # noqa: E402


def hetsync_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("hetsync"))


def pretrace_leaves_the_mode_in_force(x, y):
    candidates = {"homogeneous": "ripples-smart", "straggler": ("ripples-random", {"group_size": 2}),
                  "random": "eager-solo"}
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), sync="auto", candidates=candidates,
                                               start="homogeneous", pretrace=True), loss="mse")
    services = _runtime.services()
    assert services.config[0] == "smart", services.config
    hetsync.keras.fit(model, x, y, batch_size=8, epochs=1, verbose=0)
    family = hetsync.marks.family_of(model.optimizer)
    traced = sorted(e.mode for e in family.entries.values() if e.train_function is not None)
    assert {"ripples-random", "eager-solo"} <= set(traced), f"candidates not pretraced: {traced}"
    assert family.current_entry.mode == "ripples-smart"
    assert services.config[0] == "smart" and services.config[1]["group_size"] == 3, \
        f"pretrace replaced the running mode's Group Generator configuration: {services.config}"


def main():
    hvd.init()
    hetsync.init()
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    pretrace_leaves_the_mode_in_force(x, y)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), sync="ripples-smart"), loss="mse")
    seen = []

    class Threads(tf.keras.callbacks.Callback):  # the threads running in each epoch, at its end
        def on_epoch_end(self, epoch, logs=None):
            seen.append(hetsync_threads())

    switch = hetsync.callbacks.SyncModeCallback(schedule={1: "esync", 2: "ripples-smart"}, verbose=False)
    hetsync.keras.fit(model, x, y, batch_size=8, epochs=3, verbose=0, callbacks=[switch, Threads()])
    assert [h["to"] for h in switch.history] == ["esync", "ripples-smart"], switch.history
    # the first model (step 1) is still in ripples-smart, with its watcher: this one's comes and goes on top of it
    watching = [names.count("hetsync-gg-away") for names in seen]
    assert watching == [2, 1, 2], f"the away watcher runs while ripples-smart is in force only: {seen}"
    address = _runtime.services().address
    hetsync.shutdown()
    left = hetsync_threads()
    assert not left, f"threads left running after shutdown: {left}"
    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=1.0)
        raise AssertionError(f"the coordinator server at {address} still answers after shutdown")
    except grpc.FutureTimeoutError:
        pass
    finally:
        channel.close()
    hetsync.shutdown()  # idempotent
    print("OK rank=0", flush=True)


if __name__ == "__main__":
    main()
