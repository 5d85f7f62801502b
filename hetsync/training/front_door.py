"""Which front door a hetsync train step came through, and the refusal of the one that cannot work.

hetsync trains through ``hetsync.keras.fit(model, ...)`` (the training layer's epochs, sync points and agreed stop
around Keras' ``Model.fit``), a ``hetsync.job_steps`` loop, or a bare custom loop.  Plain ``model.fit`` of a model
compiled with a hetsync optimizer would train without the training layer -- no agreed stop, no job epochs, ranks
that finish early leaving the others waiting -- so it is refused, on every rank, at its first train step (Keras
traces it on every rank before any collective of the step runs).

A bare custom loop (the optimizer's ``apply_gradients`` called outside both) gives hetsync no way to tell when a
rank's loop is over, or where a round of local iterations ends.  A lockstep mode that is Horovod's allreduce in
every step (``SyncAlgorithm.BARE_LOOP``: allreduce, OD-SGD) trains there as Horovod's optimizer does, with
Horovod's rule that every rank runs the same steps; every other mode is refused at the loop's first step, on every
rank (each traces or runs that step before any collective of it), naming ``hetsync.job_steps``.

Nothing global is replaced to find out: each hetsync optimizer carries a guard on its own ``apply_gradients``
(:func:`guard`), and the training layer says which front door is open (:func:`entering`, :func:`leaving`).

In a ``job_steps`` loop the guard also refuses ``hvd.DistributedGradientTape`` in a mode whose ranks step at their
own pace (its allreduce of every step's gradients would pair steps of different ranks: a hang), read from the
gradients' graph (Horovod's tape builds its allreduce under the name scope ``DistributedGradientTape_Allreduce``).
That needs a traced step (``tf.function``, as Horovod's TF2 example has it); an eager loop is not checked.

This module imports nothing from hetsync but the compatibility messages and the recognition of Horovod's tape.
"""
import os
import sys

import tensorflow as tf

from hetsync import compat
from hetsync.algorithms._synchronous import horovod_tape_gradients

_OPEN = {"fit": 0, "loop": 0}
_KERAS_TRAINING = os.path.join("keras", "src", "engine", "training.py")
_KERAS_STEP_FUNCTIONS = ("run_step", "train_step", "step_function")

FIT_REFUSAL = ("model.fit of a model compiled with a hetsync.DistributedOptimizer: train it with "
               "hetsync.keras.fit(model, ...) (the same arguments), which keeps hetsync's epochs, sync points and "
               "agreed stop on every rank; plain model.fit would let ranks that finish early leave the others waiting")


def entering(door):
    """``door`` ("fit" or "loop") is open in this process until :func:`leaving`."""
    _OPEN[door] += 1


def leaving(door):
    _OPEN[door] = max(0, _OPEN[door] - 1)


def is_open(door):
    return _OPEN[door] > 0


def _in_keras_fit():
    """True when Keras' compiled train step is on the call stack (``Model.fit`` tracing or running it)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _KERAS_STEP_FUNCTIONS and code.co_filename.endswith(_KERAS_TRAINING):
            return True
        frame = frame.f_back
    return False


def bare_loop_problem(optimizer, algorithm):
    """Why ``algorithm``'s mode may not train in a bare custom loop (a string), or None."""
    if algorithm.NO_CUSTOM_LOOPS:
        return algorithm.NO_CUSTOM_LOOPS
    auto = compat.loop_problem(optimizer)
    if auto:
        return auto
    if algorithm.BARE_LOOP:
        return None
    return (f"sync={algorithm.name!r} in a custom loop that is not a hetsync.job_steps loop: its ranks train at "
            "their own pace, and only hetsync.job_steps(dataset, steps, model, optimizer) tells hetsync where each "
            "rank's loop ends, so that no rank waits on one that is done.  Iterate over "
            "hetsync.job_steps(...) instead of the dataset (README, 'Quickstart: a custom TF2 loop'), or use "
            "sync='allreduce' or sync='od-sgd' in a bare loop")


def problem(optimizer, algorithm, gradients):
    """Why this train step may not run (a string), or None: plain ``Model.fit``; a bare loop of a mode that needs
    ``job_steps``; a Horovod tape in a loop."""
    if not _OPEN["fit"] and not _OPEN["loop"]:
        return FIT_REFUSAL if _in_keras_fit() else bare_loop_problem(optimizer, algorithm)
    if _OPEN["loop"] and horovod_tape_gradients(gradients):
        return compat.tape_problem(algorithm)
    return None


def guard(optimizer, algorithm):
    """Puts the front-door check on ``optimizer``'s own ``apply_gradients`` (an attribute of this instance only:
    Keras' ``minimize`` and a custom loop both call it)."""
    apply = optimizer.apply_gradients

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        refusal = problem(optimizer, algorithm, [g for g, _ in grads_and_vars])
        if refusal:
            raise ValueError(refusal)
        return apply(grads_and_vars, *args, **kwargs)

    apply_gradients.__doc__ = apply.__doc__
    optimizer.apply_gradients = apply_gradients
    return optimizer
