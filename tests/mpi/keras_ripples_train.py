"""Run under mpirun/horovodrun -np 4.  ripples-static trains a Keras model to a target loss; workers that stop after
different numbers of steps end cleanly with one consensus model.  Args: TARGET_LOSS."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
from common import digits, shard  # noqa: E402


def weights_identical_everywhere(m):
    flat = np.concatenate([w.ravel() for w in m.get_weights()])
    gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
    return float(np.max(np.abs(gathered - gathered[:1])))


def train(rank, size, steps, node_size, target):
    x, y, xt, yt = digits(0)
    tf.keras.utils.set_random_seed(3)
    m = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10)])
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.2), sync="ripples-static", node_size=node_size)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    m.compile(optimizer=opt, loss=loss, metrics=["accuracy"])
    initial = m.evaluate(xt, yt, verbose=0, return_dict=True)["loss"]
    consensus = hetsync.callbacks.ConsensusCallback(every=None)
    hetsync.keras.fit(m, shard(x, y, rank, size, 32, 0), steps_per_epoch=steps, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), consensus])
    final = m.evaluate(xt, yt, verbose=0, return_dict=True)
    spread = weights_identical_everywhere(m)
    print(f"rank {rank}: steps={steps} node_size={node_size} loss {initial:.3f} -> {final['loss']:.6f} "
          f"acc {final['accuracy']:.3f}, consensus rounds {consensus.rounds}, spread {spread:g}", flush=True)
    assert spread < 1e-6, f"workers ended with different models (max diff {spread})"
    assert final["loss"] <= target, f"consensus loss {final['loss']:.3f} did not reach target {target}"
    return consensus.rounds


def main():
    target = float(sys.argv[1])
    hvd.init()
    hetsync.init(timeout=60)
    rank, size = hvd.rank(), hvd.size()
    # Same number of steps, an emulated 2-node layout (the real one-host layout runs in tests/test_dropin.py).
    train(rank, size, 150, 2, target)
    # Uneven: rank r stops after 120 + 40 r steps; nobody waits on a finished worker, all end with one model.  On
    # machines of unequal size (3 + 1 workers; §4.2's rules per machine).
    rounds = train(rank, size, 120 + 40 * rank, [3, 1], target)
    assert rounds >= 1
    stats = hetsync.ops.engine_stats()
    print(f"rank {rank}: engine stats {stats}", flush=True)
    hetsync.shutdown()
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
