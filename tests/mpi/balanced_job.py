"""Run under mpirun -np 4: sync="balanced" (issue 19), three properties through one job.

1. **The update is synchronous SGD on the union batch.**  Linear regression (a lazily built Dense unit, MSE, plain
   SGD), each rank's data a known stream (its own arrays, batch 8, repeated, not shuffled).  Whatever the shares
   were, replaying the job in numpy -- update u takes the next n_r(u) samples of every rank's stream, from the
   plans the mode recorded, and steps w -= lr * mean gradient over their union -- gives the model every rank ended
   with.  A per-rank average of means (Horovod's rule with unequal shares), a skipped or doubled sample at a cut
   batch, or a lost micro-batch would not.
2. **Shares follow speed.**  Every rank computes 20 ms a batch (EmulatedComputeCallback, per sample); rank 3 is 5x slower
   for the first 30 Keras steps, then rank 0 is (PhasedSlowdownCallback): the plan in force before the change gives rank 3
   the smallest share, the plan in force within ``replan_every + window`` updates of the change gives rank 0 the
   smallest, and rank 3's share grows back.
3. **A rank that stops hands its share over at once.**  A second fit, in which rank 1 sets ``stop_training`` at its
   batch 5: from the next update it computes nothing and the others' shares add up to the whole global batch; the
   fit ends on every rank with one model.
4. **With equal shares it is Horovod.**  ``max_share=1`` holds every rank at one batch per update: a lazily built
   CNN with BatchNorm and Adam ends with the weights ``sync="allreduce"`` gives.

Each rank's share over time goes to the heterogeneity report in ``argv[1]`` (the pytest side reads it).
Prints OK rank=R.
"""
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
import hetsync.callbacks  # noqa: E402
import hetsync.testing  # noqa: E402
from common import digit_images, without_autotune  # noqa: E402

LR, BATCH, DIM, STEPS, EPOCHS, CHANGE_AT = 0.05, 8, 4, 20, 3, 30
OPTIONS = {"replan_every": 4, "window": 2}


def rank_data(rank):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(40, DIM)).astype(np.float32)
    y = (x @ np.arange(1, DIM + 1, dtype=np.float32) + 0.1 * rng.normal(size=40)).astype(np.float32)[:, None]
    return x, y


def plan_at(history, update):
    """Samples per rank in update ``update`` (0-based): the first update is Horovod's split (one batch each)."""
    chosen = None
    for start, plan in history:
        if start <= update:
            chosen = plan
    return chosen


def replay(history, updates, size):
    """numpy: synchronous SGD on the union of the samples each rank computed in each update."""
    streams = [rank_data(r) for r in range(size)]
    offsets = [0] * size
    w = np.zeros((DIM, 1), np.float64)
    for u in range(updates):
        plan = plan_at(history, u) or [BATCH] * size
        xs, ys = [], []
        for r, n in enumerate(plan):
            x, y = streams[r]
            idx = [(offsets[r] + i) % len(x) for i in range(n)]
            offsets[r] += n
            xs.append(x[idx])
            ys.append(y[idx])
        x, y = np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.float64)
        w -= LR * 2.0 / len(x) * x.T @ (x @ w - y)
    return w


class StopOn(tf.keras.callbacks.Callback):
    def __init__(self, rank, batch):
        super().__init__()
        self.rank, self.batch = rank, batch

    def on_train_batch_end(self, batch, logs=None):
        if hvd.rank() == self.rank and batch == self.batch:
            self.model.stop_training = True


def horovod_split(mode, optimizer=None, same_init=False, **kwargs):
    """Weights after 12 Keras steps of a CNN with BatchNorm (Adam unless ``optimizer``) in ``mode`` (balanced held at
    Horovod's split), with Horovod's ``kwargs``."""
    rank, size = hvd.rank(), hvd.size()
    x, y = digit_images()
    x, y = x[rank::size], y[rank::size]
    # (with backward_passes_per_step=2 Horovod's first-batch broadcast comes between the two passes of the first
    # update, and balanced's after it: the ranks start from one model so that the broadcast changes nothing)
    tf.keras.utils.set_random_seed(5 + (0 if same_init else rank))
    model = tf.keras.Sequential([tf.keras.layers.Conv2D(4, 3, activation="relu"), tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
    options = {"max_share": 1.0} if mode == "balanced" else {}
    opt = hetsync.DistributedOptimizer(optimizer or tf.keras.optimizers.Adam(0.01), sync=mode, **options, **kwargs)
    model.compile(opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16))
    hetsync.keras.fit(model, data, steps_per_epoch=12, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [w for w in model.get_weights()]


def main():
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    x, y = rank_data(rank)
    data = without_autotune(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat())
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(LR), sync="balanced", **OPTIONS)
    model.compile(opt, loss="mse")
    slow = hetsync.testing.PhasedSlowdownCallback([
        (CHANGE_AT, hetsync.testing.SlowdownCallback("deterministic", ranks=[3], factor=5, base_time=0.02)),
        (1000, hetsync.testing.SlowdownCallback("deterministic", ranks=[0], factor=5, base_time=0.02))])
    compute = hetsync.testing.EmulatedComputeCallback(0.02)  # every rank's per-sample compute (a GPU's), 20 ms a batch
    # each rank's share over time; on rank 0 only, as Horovod users place TensorBoard: rank 0 writes every rank's
    report = [hetsync.callbacks.HeterogeneityReportCallback(sys.argv[1], every_s=0.1)] if rank == 0 else []
    hetsync.keras.fit(model, data, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0, callbacks=[compute, slow, *report])
    algorithm = hetsync.marks.algorithm_of(model.optimizer)
    history, updates = list(algorithm.history), algorithm.updates
    assert updates == STEPS * EPOCHS, updates
    everyone = hvd_tf.allgather_object(history)
    assert all(h == everyone[0] for h in everyone), f"ranks planned differently: {everyone}"

    # 1. the union-batch replay
    w = model.get_weights()[0].astype(np.float64)
    expected = replay(history, updates, size)
    assert np.allclose(w, expected, rtol=1e-4, atol=1e-5), f"w = {w.ravel()}, replay {expected.ravel()}"
    assert len({tuple(p) for _, p in history}) >= 3, f"the shares never moved: {history}"

    # 2. shares follow speed
    before = plan_at(history, CHANGE_AT - 2)
    after = plan_at(history, CHANGE_AT + OPTIONS["replan_every"] + OPTIONS["window"] + 1)
    assert before[3] < min(before[:3]), f"rank 3 (5x slower) did not get the smallest share: {before}"
    assert after[0] == min(after) and after[0] < min(after[1:3]), \
        f"rank 0 (5x slower from step {CHANGE_AT}) did not: {after} ({history})"
    # rank 3, fast again, grows back (by a factor per plan: a share of a few samples is mostly per-step overhead)
    assert max(p[3] for u, p in history if u > CHANGE_AT) >= 3 * before[3], history
    assert all(sum(p) == size * BATCH for _, p in history), history

    # 3. a rank that stops hands its share over
    mark = len(algorithm.history)
    hetsync.keras.fit(model, data, steps_per_epoch=STEPS, epochs=1, verbose=0, callbacks=[compute, slow, StopOn(1, 5)])
    later = algorithm.history[mark:]
    handed = [p for _, p in later if p[1] == 0]
    assert handed and all(sum(p) == size * BATCH for p in handed), f"rank 1's share was not handed over: {later}"
    weights = hvd_tf.allgather_object([v.tolist() for v in model.get_weights()])
    assert all(v == weights[0] for v in weights), "ranks ended with different models"
    # 4. with the shares held at Horovod's split (max_share=1), balanced is Horovod: a lazily built CNN with
    #    BatchNorm and Adam ends where sync="allreduce" ends
    same = [horovod_split(mode) for mode in ("allreduce", "balanced")]
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*same)), \
        max(float(np.max(np.abs(a - b))) for a, b in zip(*same))
    #    ... and Horovod's keywords mean what they mean there: op=Sum (the sum of the ranks' mean gradients),
    #    backward_passes_per_step=2 (an update every 2 batches of each rank, their gradients summed; the epoch's
    #    data is Horovod's), fp16 compression -- plain SGD, so the gradient's scale shows in the weights
    kwargs = {"op": hvd_tf.Sum, "backward_passes_per_step": 2, "compression": hvd.Compression.fp16}
    same = [horovod_split(mode, tf.keras.optimizers.SGD(0.002), True, **kwargs) for mode in ("allreduce", "balanced")]
    assert all(np.allclose(a, b, rtol=2e-2, atol=2e-3) for a, b in zip(*same)), \
        max(float(np.max(np.abs(a - b))) for a, b in zip(*same))
    moved = [horovod_split("balanced", tf.keras.optimizers.SGD(0.002), True), same[1]]
    assert not all(np.allclose(a, b, rtol=2e-2, atol=2e-3) for a, b in zip(*moved)), "the keywords changed nothing"
    print(f"rank {rank}: {updates} updates, plans {history}; after rank 1 stopped: {handed[0]}", flush=True)
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
