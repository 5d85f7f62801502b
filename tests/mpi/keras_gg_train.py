"""Run under horovodrun -np 4.  ripples-random and ripples-smart (Group Generator started by hetsync.init) train a
Keras model to a target loss; with rank 3 made 10x slower the other ranks keep making progress.  ripples-smart runs
on emulated machines of unequal size (node_size=[3, 1]); the GG's request counters survive the end-of-fit sync
point.
Args: MODE TARGET_LOSS."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import keras_callbacks  # noqa: E402
from common import digits, shard  # noqa: E402

SLOW = 3


class ProgressProbe(tf.keras.callbacks.Callback):
    """At this worker's last batch (before hetsync's end-of-fit sync points), reads how many syncs each worker
    requested."""

    def __init__(self, algorithm, steps):
        super().__init__()
        self.algorithm, self.steps, self.requests = algorithm, steps, None

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.steps:
            self.requests = self.algorithm.client.metrics()["requests"]


def main():
    mode, target = sys.argv[1], float(sys.argv[2])
    hvd.init()
    hetsync.init(timeout=60)
    rank, size = hvd.rank(), hvd.size()
    x, y, xt, yt = digits(0)
    tf.keras.utils.set_random_seed(3)
    m = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
    options = {"node_size": [3, 1]} if mode == "ripples-smart" else {}  # machines of unequal size (§5.2)
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.2), sync=mode, **options)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    m.compile(optimizer=opt, loss=loss, metrics=["accuracy"])
    steps = 80 if rank == SLOW else 160
    probe = ProgressProbe(opt._hetsync_algorithm, steps)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 keras_callbacks.Slowdown("deterministic", ranks=[SLOW], factor=10, base_time=0.01),
                 probe, keras_callbacks.Consensus(every=None)]
    m.fit(shard(x, y, rank, size, 32, 0), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    final = m.evaluate(xt, yt, verbose=0, return_dict=True)
    flat = np.concatenate([w.ravel() for w in m.get_weights()])
    spread = float(np.max(np.abs(hvd.allgather(tf.constant(flat[None, :])).numpy() - flat)))
    metrics = opt._hetsync_algorithm.metrics()
    # The end of fit was a sync point (a consensus round; the GG resumed every worker): the §5.3 request counters
    # survived it (a generator installed afresh there would report 0 requests).
    after = opt._hetsync_algorithm.client.metrics()["requests"]
    resets = opt._hetsync_algorithm.services._phase
    assert resets >= 2 and all(a >= p > 0 for a, p in zip(after, probe.requests)), (resets, after, probe.requests)
    print(f"rank {rank}: {mode} steps={steps} loss {final['loss']:.4f} acc {final['accuracy']:.3f} "
          f"requests-at-my-end {probe.requests} spread {spread:g} metrics {metrics}", flush=True)
    assert spread < 1e-6, f"workers ended with different models ({spread})"
    assert final["loss"] <= target, f"consensus loss {final['loss']:.3f} above target {target}"
    if mode == "ripples-smart" and rank == 0:
        # When rank 0 had done its 160 steps, the 10x slower rank (80 steps to do) had done far fewer than 80:
        # rank 0 did not run at its pace (under allreduce it would have done exactly as many as rank 0).
        assert probe.requests[SLOW] < 0.5 * probe.requests[rank], probe.requests
    if rank == 0:
        assert metrics["gg_groups_formed"] > 0, metrics
    hetsync.shutdown()
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
