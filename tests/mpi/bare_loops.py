"""Run under mpirun -np 4 (in the training layer's job, tests/test_training_layer.py): a bare custom loop --
Horovod's TF2 step with the optimizer line changed, over the dataset itself, without ``hetsync.job_steps`` -- in
every mode and ``auto``.

* The lockstep modes that declare it (allreduce; od-sgd in its warm-up) train there: the held-out loss falls
  below a tenth, and every rank holds the same model without a consensus.  Each step's gradients were allreduced:
  Horovod's Keras optimizer does it in ``compute_gradients``, which a custom loop never calls, so hetsync's
  ``apply_gradients`` does it there (without that, each rank trains on its own gradients: models differ).
* Every other mode raises a ValueError on every rank at the loop's first step, traced or eager, naming
  ``hetsync.job_steps`` (balanced and auto: ``Model.fit``), before any collective of the step; the job goes on (a
  Horovod collective after it completes on every rank).
Prints OK rank=R.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
from hetsync import algorithms  # noqa: E402
from front_doors import data, model_with  # noqa: E402
from tf2_loop import horovod_training_step  # noqa: E402

# (od-sgd: the 20-step loop stays in its warm-up, Horovod's synchronous SGD, where every rank holds the same
# model after every step; its training stage in a loop is tests/mpi/custom_loops.py's, under hetsync.job_steps)
BARE_OPTIONS = {"od-sgd": {"warmup_steps": 100}}


def bare_loop(mode, rank, traced):
    """Horovod's TF2 step over the dataset itself: returns the held-out loss before and after 20 steps, or the
    ValueError's text when the first step is refused."""
    model = model_with(hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), sync=mode,
                                                    **BARE_OPTIONS.get(mode, {})))
    opt = model.optimizer
    step = horovod_training_step(model, opt, lambda y, p: tf.reduce_mean(tf.square(p - y)), traced=traced)
    first = model.evaluate(data(100), steps=4, verbose=0)
    try:
        for batch, (x, y) in enumerate(data(rank).take(20)):
            step(x, y, batch == 0)
    except ValueError as exc:
        assert batch == 0, (mode, batch)
        return str(exc)
    return first, model.evaluate(data(100), steps=4, verbose=0), model


def check_bare_loops(rank):
    for mode in [*algorithms.available_modes(), "auto"]:
        trains = mode != "auto" and algorithms._REGISTRY[mode].BARE_LOOP
        result = bare_loop(mode, rank, traced=True)
        if trains:
            first, last, model = result
            assert last < 0.1 * first, (mode, first, last)
            weights = np.concatenate([w.numpy().ravel() for w in model.weights])
            every = hvd.allgather(tf.constant(weights[None, :]), name=f"bare.{mode}").numpy()
            np.testing.assert_allclose(every, np.repeat(every[:1], len(every), axis=0), rtol=0, atol=1e-6)
        else:
            assert isinstance(result, str), (mode, "a bare loop trained", result)
            door = "Model.fit" if mode in ("balanced", "auto") else "hetsync.job_steps"
            assert door in result, (mode, result)
        if rank == 0:
            print(f"bare-loops: bare loop in {mode}: {'trains' if trains else 'refused'}", flush=True)
    assert "hetsync.job_steps" in bare_loop("ripples-smart", rank, traced=False)  # an eager loop as well
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="bare.after")) == hvd.size()


def main():
    hvd.init()
    hetsync.init()
    check_bare_loops(hvd.rank())
    hetsync.shutdown()


if __name__ == "__main__":
    main()
    print(f"OK rank={hvd.rank()}", flush=True)
