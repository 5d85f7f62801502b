"""A custom loop (``hetsync.job_steps``) resumed from a ``tf.train.Checkpoint`` (under mpirun -np 2; argument: modes).

Per mode, Horovod's TF2 loop shape (the first batch's broadcast inside the ``tf.function``) in two phases of 16 steps
per rank each, twice:

* uninterrupted: phase 1, then phase 2, in one process;
* restarted: phase 1, rank 0 writes ``tf.train.Checkpoint(model=..., optimizer=...)``; then the process "restarts"
  (Keras' state cleared, the model and optimizer built again from another seed) and every rank restores the
  checkpoint -- the documented recipe for a loop: restore everywhere, so nothing needs a broadcast before the first
  step -- and runs phase 2.

Checked: after the restore every rank holds rank 0's saved weights, ``iterations`` and slots (bit for bit); phase 2
counts on from the saved step; one model on every rank at the end; in ``allreduce`` (deterministic) the restarted run
ends bit-identical to the uninterrupted one.  Prints ``LOOP {json}`` per mode on rank 0 and OK rank=R.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
from hetsync.algorithms._wrap import optimizer_variables  # noqa: E402
from common import digits, without_autotune  # noqa: E402
from tf2_loop import horovod_training_step  # noqa: E402

STEPS, BATCH = 16, 32


def digest(values):
    h = hashlib.sha256()
    for v in values:
        h.update(np.ascontiguousarray(v.numpy() if hasattr(v, "numpy") else v).tobytes())
    return h.hexdigest()[:16]


def data(phase):
    """This rank's batches of ``phase`` (0 or 1): the same ones in both runs."""
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(11 + rank)
    x, y, _, _ = digits(seed=0)
    ds = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).repeat().shuffle(
        512, seed=11 + rank).batch(BATCH).skip(phase * STEPS)
    return without_autotune(ds)


def prepare(mode, seed):
    tf.keras.utils.set_random_seed(seed + hvd.rank())
    model = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    opt = hetsync.DistributedOptimizer(tf.optimizers.Adam(0.01), sync=mode)
    loss = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, opt, horovod_training_step(model, opt, loss)


def phase(model, opt, training_step, index, probe=None):
    steps = hetsync.job_steps(data(index), STEPS, model, opt)
    for batch, (images, labels) in enumerate(steps):
        training_step(images, labels, batch == 0)
        if probe is not None and batch == 0:
            probe(opt)
    steps.finish()


def optimizer_state(opt):
    return digest(optimizer_variables(opt))


def one_mode(mode, where):
    rank = hvd.rank()
    model, opt, step = prepare(mode, seed=100)
    phase(model, opt, step, 0)
    phase(model, opt, step, 1)
    straight = digest(model.weights)
    tf.keras.backend.clear_session()

    model, opt, step = prepare(mode, seed=100)
    phase(model, opt, step, 0)
    path = os.path.join(where, f"{mode}-ckpt")
    if rank == 0:
        tf.train.Checkpoint(model=model, optimizer=opt).write(path)
    # what rank 0 saved (an own-pace mode's ranks count their own steps), once it is on disk
    saved = hvd.broadcast_object((digest(model.weights), optimizer_state(opt), int(opt.iterations.numpy()))
                                 if rank == 0 else None, name=f"loop.saved.{mode}")
    tf.keras.backend.clear_session()  # "restarted": a new model and optimizer, from other initial weights

    model, opt, step = prepare(mode, seed=200)
    tf.train.Checkpoint(model=model, optimizer=opt).read(path).assert_existing_objects_matched()
    opt.build(model.trainable_variables)  # (only to check the slots now: the first update would make them)
    restored = (digest(model.weights), optimizer_state(opt), int(opt.iterations.numpy()))
    assert restored == saved, f"{mode}: rank {rank} restored {restored}, rank 0 saved {saved}"
    seen = {}

    def after_first_update(optimizer):  # the slots exist now, restored from the checkpoint, then updated once
        seen["iterations"] = int(optimizer.iterations.numpy())

    phase(model, opt, step, 1, probe=after_first_update)
    assert seen["iterations"] >= saved[2] + 1, (mode, seen, saved)  # on from the saved count, not from 0
    resumed = digest(model.weights)
    everyone = hvd.allgather_object(resumed, name=f"loop.final.{mode}")
    assert len(set(everyone)) == 1, f"{mode}: the ranks ended with different models {everyone}"
    iterations = hvd.allgather_object(int(opt.iterations.numpy()), name=f"loop.it.{mode}")
    tf.keras.backend.clear_session()
    if rank == 0:
        print("LOOP " + json.dumps({"mode": mode, "saved_iterations": saved[2], "iterations": iterations,
                                    "resumed_weights": resumed, "straight_weights": straight}), flush=True)


def main():
    hvd.init()
    hetsync.init()
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["allreduce", "ripples-smart"]
    where = hvd.broadcast_object(tempfile.mkdtemp(prefix="hetsync-loop-") if hvd.rank() == 0 else None,
                                 name="loop.dir")
    try:
        for mode in modes:
            one_mode(mode, where)
    finally:
        hvd.broadcast_object(0, name="loop.done")
        if hvd.rank() == 0:
            shutil.rmtree(where, ignore_errors=True)
    hetsync.shutdown()
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
