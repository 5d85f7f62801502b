"""The user's ``hvd.callbacks.BroadcastGlobalVariablesCallback(root)``, honoured before the fit's first step.

Horovod's callback broadcasts rank ``root``'s model and optimizer variables at the end of the first batch: in
plain Horovod the first step only averages gradients computed at different weights, and the broadcast then makes
the ranks one model.  In a mode that averages *models* inside a step (Ripples' P-Reduce, Hop's neighbours, ESync's
w_t at a fit's first round) that first step would already have mixed the root's weights -- a checkpoint loaded on
rank 0 (Horovod's resume recipe) -- with the other ranks' fresh initialisations, and the batch-end broadcast would
then hand everyone the mixture.  So when every rank passes the callback, the training layer broadcasts the same
variables from the same root at ``on_train_begin``, before any step, and sets the callback's own
``broadcast_done`` once the optimizer's variables went too: its broadcast at the first batch's end would repeat the
same values, and pairs its collectives by variable name -- a loaded optimizer's (Keras names a loaded Adam's slots
``m/dense/kernel``) differ from a built one's (``Adam/m/dense/kernel``), and Horovod then waits forever: plain
Horovod's resume recipe (``hvd.load_model`` on rank 0) hangs there under TensorFlow 2.15.  The training layer's
broadcast pairs variables by position.

A model that is not built yet on some rank (no variables before its first step) is left to Horovod's callback
alone: there is nothing to broadcast before the step that creates the variables.  When only the optimizer's variables
differ between ranks (not built alike), the model's are broadcast and Horovod's callback still runs at the first
batch's end.
"""
import logging

import tensorflow as tf

from hetsync.algorithms._wrap import optimizer_variables

log = logging.getLogger("hetsync.training")


def _horovod_callback_class():
    from horovod._keras.callbacks import BroadcastGlobalVariablesCallbackImpl

    return BroadcastGlobalVariablesCallbackImpl


def broadcast_callback(user_callbacks):
    """The user's Horovod broadcast callback that has not broadcast yet, or None."""
    cls = _horovod_callback_class()
    found = [cb for cb in user_callbacks if isinstance(cb, cls) and not cb.broadcast_done]
    return found[0] if found else None


def root_of(callback):
    """The callback's root rank (-1: none), a column of fit's agreement across ranks."""
    return -1 if callback is None else int(callback.root_rank)


def check_roots(roots):
    """Every rank passes the callback with the same root, or none does: raised on every rank before any
    collective could hang (Horovod's own callback would wait forever for the ranks that lack it)."""
    if len(set(roots)) == 1:
        return
    have = [r for r, root in enumerate(roots) if root >= 0]
    raise ValueError(f"BroadcastGlobalVariablesCallback is passed on ranks {have} with roots "
                     f"{[roots[r] for r in have]}, but every rank must pass it with the same root_rank "
                     f"(ranks without it: {[r for r, root in enumerate(roots) if root < 0]})")


def _variables(model, callback):
    """(model variables the callback does not hold local, optimizer variables), empty while the model is not
    built.  (register_local_var: kept per rank, as Horovod does.)"""
    if not model.built:
        return [], []
    local = getattr(callback, "_local_vars", set()) if callback is not None else set()
    return [v for v in model.variables if v.ref() not in local], optimizer_variables(model.optimizer)


def shape_row(model, callback):
    """This rank's [built, model variables, optimizer variables]: its part ("shapes") of fit's one agreement across
    ranks (keras_fit._prepare), which :func:`broadcast_before_first_step` reads instead of a gather of its own."""
    model_vars, optimizer_vars = _variables(model, callback)
    return [int(model.built), len(model_vars), len(optimizer_vars)]


def broadcast_before_first_step(model, callback, rows):
    """Collective when every rank agreed on a root (check_roots): rank ``root``'s model variables (those the
    callback does not hold local) and, when every rank has built them alike, its optimizer variables (step count
    and slots), before the fit's first step, in one broadcast (:func:`_broadcast`).  ``rows``: every rank's
    :func:`shape_row`, as gathered.  Returns what was broadcast: "model+optimizer", "model" or None."""
    import horovod.tensorflow as hvd

    model_vars, optimizer_vars = _variables(model, callback)
    if not all(row[0] for row in rows) or len({row[1] for row in rows}) > 1:
        log.info("model not built alike on every rank before the first step: rank %d's variables are broadcast "
                 "by Horovod's callback at the first batch's end only", callback.root_rank)
        return None
    if len({row[2] for row in rows}) > 1 or not optimizer_vars:
        _broadcast(hvd, model_vars, callback.root_rank, "model")
        return "model"
    _broadcast(hvd, model_vars + optimizer_vars, callback.root_rank, "model_optimizer")
    callback.broadcast_done = True  # done, for everything it broadcasts: see the module's docstring
    return "model+optimizer"


def _broadcast(hvd, variables, root, what):
    """Each variable from ``root``, paired by position, not by the variable's name: a model or an optimizer loaded
    from a file names its variables differently from one built in the script (Keras' loaded Adam slots are
    ``m/dense/kernel``, a built one's ``Adam/m/dense/kernel``), and Horovod pairs collectives by name.

    The values go flattened into one tensor of bytes (``tf.bitcast``), one broadcast for the weights (float32) and
    the optimizer's step count (int64) together; a dtype that has no byte view (bool) gets one of its own.  One
    eager broadcast per variable waited for a Horovod negotiation each: a rank at a twentieth of a core took 16 s
    for the benchmark model's 25 variables while the others waited, 8 s with all of them in one ``tf.function`` (its
    trace), and under 3 s flattened into one per dtype (8 ranks, ``benchmarks/run.py --scenarios 8-workers``, one
    job each).  The ranks' shapes come with fit's one agreement: each collective less is a negotiation less with a
    throttled rank."""
    groups = {}
    for v in variables:  # in position order, alike on every rank
        value = v.read_value()
        groups.setdefault(tf.uint8 if value.dtype in BYTE_VIEWS else value.dtype, []).append((v, value))
    for dtype, pairs in groups.items():
        parts = [_as(value, dtype) for _, value in pairs]
        flat = hvd.broadcast(tf.concat(parts, 0), root, name=f"hetsync.initial.{what}.{dtype.name}")
        for (v, value), part in zip(pairs, tf.split(flat, [p.shape[0] for p in parts])):
            v.assign(_back(part, value))


BYTE_VIEWS = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32,
              tf.uint32, tf.int64, tf.uint64)  # dtypes tf.bitcast views as bytes


def _as(value, dtype):
    """``value`` flattened, as bytes when ``dtype`` is uint8 (the byte view) and as itself otherwise."""
    if dtype == tf.uint8 and value.dtype != tf.uint8:
        value = tf.bitcast(value, tf.uint8)  # [..., itemsize] bytes per element
    return tf.reshape(value, [-1])


def _back(part, value):
    """The inverse of :func:`_as` for ``value``'s dtype and shape."""
    if part.dtype != value.dtype:
        part = tf.bitcast(tf.reshape(part, [-1, value.dtype.size]), value.dtype)
    return tf.reshape(part, value.shape)
