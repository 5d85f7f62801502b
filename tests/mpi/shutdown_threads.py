"""Run under mpirun -np 1: hetsync.shutdown() stops every thread, channel and server hetsync started (issue 18).

Trains a few steps in ripples-smart (its Group Generator away watcher is a thread) and switches to esync (a State
Server client), then calls hetsync.shutdown(): no thread named hetsync-* is left, rank 0's coordinator server no
longer answers, and a second shutdown() is a no-op.  Prints OK rank=0.
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
import keras_callbacks  # noqa: E402
from hetsync import _runtime  # noqa: E402


def hetsync_threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("hetsync"))


def main():
    hvd.init()
    hetsync.init()
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), sync="ripples-smart"), loss="mse")
    switch = keras_callbacks.SyncMode(schedule={1: "esync"}, verbose=False)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[switch])
    assert [h["to"] for h in switch.history] == ["esync"], switch.history
    assert "hetsync-gg-away" in hetsync_threads(), hetsync_threads()
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
