"""Which front door a hetsync train step came through, and the refusal of the one that cannot work.

hetsync trains through ``hetsync.keras.fit(model, ...)`` (the training layer's epochs, sync points and agreed stop
around Keras' ``Model.fit``), a ``hetsync.job_steps`` loop, or a bare custom loop.  Plain ``model.fit`` of a model
compiled with a hetsync optimizer would train without the training layer -- no agreed stop, no job epochs, ranks
that finish early leaving the others waiting -- so it is refused, on every rank, at its first train step (Keras
traces it on every rank before any collective of the step runs).  Nothing global is replaced to find out: each
hetsync optimizer carries a guard on its own ``apply_gradients`` (:func:`guard`), and the training layer says
which front door is open (:func:`entering`, :func:`leaving`).

In a ``job_steps`` loop the guard also refuses ``hvd.DistributedGradientTape`` in a mode whose ranks step at their
own pace (its allreduce of every step's gradients would pair steps of different ranks: a hang), read from the
gradients' graph (Horovod's tape builds its allreduce under the name scope ``DistributedGradientTape_Allreduce``).
That needs a traced step (``tf.function``, as Horovod's TF2 example has it); an eager loop is not checked.

This module imports nothing from hetsync but the compatibility messages.
"""
import os
import sys

from hetsync import compat

_OPEN = {"fit": 0, "loop": 0}
_KERAS_TRAINING = os.path.join("keras", "src", "engine", "training.py")
_KERAS_STEP_FUNCTIONS = ("run_step", "train_step", "step_function")
_TAPE_SCOPE = "DistributedGradientTape_Allreduce"

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


def horovod_tape_gradients(gradients):
    """True when a gradient (a graph tensor) comes out of ``hvd.DistributedGradientTape``'s allreduce."""
    seen, todo = set(), [g.values if hasattr(g, "values") and hasattr(g, "indices") else g for g in gradients]
    todo = [t for t in todo if t is not None and hasattr(t, "op") and hasattr(t.op, "inputs")]
    depth = 0
    while todo and depth < 8:
        ops = [t.op for t in todo if id(t.op) not in seen]
        for op in ops:
            seen.add(id(op))
            if _TAPE_SCOPE in op.name:
                return True
        todo = [t for op in ops for t in op.inputs]
        depth += 1
    return False


def problem(algorithm, gradients):
    """Why this train step may not run (a string), or None: plain ``Model.fit``; a Horovod tape in a loop."""
    if not _OPEN["fit"] and not _OPEN["loop"] and _in_keras_fit():
        return FIT_REFUSAL
    if _OPEN["loop"] and horovod_tape_gradients(gradients):
        return compat.tape_problem(algorithm)
    return None


def guard(optimizer, algorithm):
    """Puts the front-door check on ``optimizer``'s own ``apply_gradients`` (an attribute of this instance only:
    Keras' ``minimize`` and a custom loop both call it)."""
    apply = optimizer.apply_gradients

    def apply_gradients(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        refusal = problem(algorithm, [g for g, _ in grads_and_vars])
        if refusal:
            raise ValueError(refusal)
        return apply(grads_and_vars, *args, **kwargs)

    apply_gradients.__doc__ = apply.__doc__
    optimizer.apply_gradients = apply_gradients
    return optimizer
