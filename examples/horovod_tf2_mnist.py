"""Horovod's TF2 custom training loop (``tensorflow2_mnist.py``'s shape) with hetsync: what changes, and nothing else.

Horovod's example, on scikit-learn's bundled digits (nothing is downloaded)::

    opt = tf.optimizers.Adam(0.001 * hvd.size())
    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            ...
        tape = hvd.DistributedGradientTape(tape)                  # dropped
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
    for batch, (images, labels) in enumerate(dataset.take(10000 // hvd.size())):
        ...

With hetsync::

    opt = hetsync.DistributedOptimizer(tf.optimizers.Adam(0.001 * hvd.size()), sync=args.sync)   # this line
    steps = hetsync.job_steps(dataset, 10000 // hvd.size(), model, opt)                         # the budget
    for batch, (images, labels) in enumerate(steps):
        ...
    steps.finish()                                                                              # one model

Flags beyond Horovod's example (tests/test_custom_loop.py): ``--slow-rank/--factor`` (one rank slower per step,
emulated compute ``--compute`` on every rank), ``--time-budget`` (rank r calls ``steps.stop()`` after T_r seconds),
``--uneven`` (rank r has 3r fewer steps), ``--summary-dir``.
"""
import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

import hetsync  # noqa: E402
from common import digit_images  # noqa: E402  (examples/common.py, beside this script)


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sync", default="allreduce")
    p.add_argument("--sync-options", default="{}", help="the mode's options, as JSON")
    p.add_argument("--steps", type=int, default=400, help="the job's steps: each rank gets STEPS // size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--compute", type=float, default=0.0, help="emulated compute seconds per step, every rank")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--time-budget", default=None, help="comma-separated seconds per rank")
    p.add_argument("--uneven", action="store_true")
    p.add_argument("--summary-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def digits(seed):
    x, y = digit_images()  # scikit-learn's digits (examples/common.py reads them without importing sklearn)
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order], y[order]


def main():
    args = parse()
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed + rank)
    x, y = digits(args.seed)
    cut = int(0.8 * len(x))
    dataset = (tf.data.Dataset.from_tensor_slices((x[:cut], y[:cut])).repeat()
               .shuffle(1000, seed=args.seed + rank).batch(args.batch_size))
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    loss = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Horovod: opt = tf.optimizers.Adam(0.001 * hvd.size()) and DistributedGradientTape in the step
    opt = hetsync.DistributedOptimizer(tf.optimizers.Adam(args.lr * size), sync=args.sync,
                                       **json.loads(args.sync_options))

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss_value = loss(labels, logits)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # Horovod: broadcast initial variable states from rank 0 after the first step (variables exist by then)
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss_value

    delay = 0.0
    if args.slow_rank == rank:
        delay = (args.factor - 1.0) * max(args.compute, 0.01)
    budget = float(args.time_budget.split(",")[rank]) if args.time_budget else None
    own = args.steps // size - (3 * rank if args.uneven else 0)
    t0 = time.monotonic()
    steps = hetsync.job_steps(dataset, own, model, opt)
    stopped_at = None
    for batch, (images, labels) in enumerate(steps):
        time.sleep(args.compute + delay)  # emulated GPU compute (and the slow rank's extra), before the step
        loss_value = training_step(images, labels, batch == 0)
        if batch % 50 == 0 and hvd.local_rank() == 0:
            print(f"Step #{batch}\tLoss: {float(loss_value):.6f}", flush=True)
        if budget is not None and stopped_at is None and time.monotonic() - t0 > budget:
            stopped_at = time.monotonic() - t0
            steps.stop()
    trained = steps.finish()
    loop_s = time.monotonic() - t0
    xt, yt = x[cut:], y[cut:]
    test_loss = float(loss(yt, model(xt, training=False)))
    accuracy = float(np.mean(np.argmax(model(xt, training=False).numpy(), axis=1) == yt))
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)
    summary = {"rank": rank, "sync": args.sync, "loss": test_loss, "accuracy": accuracy, "batches": steps.yielded,
               "trained": trained, "own_steps": own, "loop_s": loop_s, "stopped_at_s": stopped_at,
               "weights_checksum": hashlib.sha256(flat.tobytes()).hexdigest()[:16],
               "engine": hetsync.ops.engine_stats()}
    print(f"rank {rank}: sync={args.sync} trained {trained} of {steps.yielded} batches, test loss {test_loss:.4f} "
          f"acc {accuracy:.3f}, loop {loop_s:.1f}s", flush=True)
    if args.summary_dir:
        os.makedirs(args.summary_dir, exist_ok=True)
        with open(os.path.join(args.summary_dir, f"summary{rank}.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    hetsync.shutdown()


if __name__ == "__main__":
    main()
