"""A live switch's new Keras train step, traced while the mode in force trains on.

The first switch into a mode traces Keras' train step for that mode's optimizer (hetsync/switching.py, ``perform``).
Done at the agreed step, every rank stalls on it at once, and on a node with a CPU quota -- where Horovod's background
thread and the MPI progress of every collective spin on the same quota -- a fraction of a second of tracing is seconds
of wall time in which no rank trains.

A rank hears of a Switch Board decision at one of its reports, up to ``report_every`` steps before the agreed step,
and of a schedule's switch from the start (traced from the first step of the epoch before: training/callbacks.py).
From there :func:`start` traces the new mode's train step in a thread of its own, on a view of the model whose
optimizer is the new mode's: the model, the optimizer in force and its compiled step, with which the rank trains on
meanwhile, are untouched.  The switch :func:`claim`s the traced function after its roll call and consensus round,
before it activates the new mode, waiting for the thread if it is still tracing.  A trace that failed leaves the
switch to trace the step itself, as without this.  ``sync="auto"``'s ``pretrace=True`` traces every candidate
after the first step instead.
"""
import logging
import threading
import types

from hetsync.algorithms._wrap import build_slots

log = logging.getLogger("hetsync.switching")


class _ModelView:
    """The model as Keras' train step sees it, with the new mode's ``optimizer``: every other attribute is the
    model's, and ``train_step`` is the model class's own (a user's override included) bound to the view, so
    ``self.optimizer`` inside it is the new mode's while ``model.optimizer`` stays the one in force."""

    def __init__(self, model, optimizer):
        self.__dict__.update(_model=model, optimizer=optimizer,
                             train_step=types.MethodType(type(model).train_step, self))

    @property
    def __class__(self):
        """The model's class: zero-argument ``super()`` in a user's ``train_step`` override (the usual Keras
        pattern) accepts an object whose ``__class__`` is a subclass of the method's class, as ``isinstance`` does,
        and then finds Keras' own ``train_step`` bound to this view."""
        return type(self._model)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)


class _Trace:
    """One mode's train step being traced in a thread; ``function`` is Keras' ``tf.function``, ``error`` what the
    trace raised, as text: the exception itself would hold, through its traceback's frames, this object, the model
    and the fit's data iterator in a reference cycle that only Python's cyclic collector frees, at a moment of its
    choosing -- and freeing a tf.data iterator waits for its threads, seconds in the middle of a later step."""

    def __init__(self, mode, function, iterator):
        self.mode, self.function, self.error = mode, function, None
        self.thread = threading.Thread(target=self._run, args=(iterator,), name="hetsync-trace", daemon=True)
        self.thread.start()

    def _run(self, iterator):
        try:
            self.function.get_concrete_function(iterator)
        except Exception as exc:  # the switch traces it instead: say why there
            self.error = f"{type(exc).__name__}: {exc}"


def start(family, mode, options, model, iterator):
    """A decision to switch to ``mode`` with ``options`` was heard before its step: wrap the mode (not
    activated: no coordinator service is touched, as a pretraced candidate) and trace its Keras train step in a thread
    for ``iterator``'s element spec.  Nothing when the mode's step is traced already, or being traced, or the mode
    runs no Keras step of its own (balanced's micro-batches: traced at the switch).  Returns whether it started."""
    if iterator is None:
        return False
    entry = family.entry(mode, options)  # (the family's own if the mode was used before)
    if entry.key in family.ahead or entry.train_function is not None or not entry.algorithm.KERAS_TRAIN_STEP:
        return False
    build_slots(entry.optimizer, model.trainable_variables)  # variables are created here, on the training thread
    entry.algorithm.build(model.trainable_variables)
    view = _ModelView(model, entry.optimizer)
    function = type(model).make_train_function(view, force=True)
    family.ahead[entry.key] = _Trace(entry.mode, function, iterator)
    return True


def tracing(family):
    """Whether a trace of this rank's is running: a step that shares the rank with it is no sample of the worker's
    speed (the trace's CPU starves it; StepClock.step, ``own_work``)."""
    return family is not None and any(t.thread.is_alive() for t in family.ahead.values())


def claim(family, entry, timeout):
    """Inside the switch into ``entry``'s mode, before the mode is activated: the step :func:`start` traced becomes
    the entry's train function, once the thread ends (waiting up to ``timeout`` seconds, hetsync's timeout).  Returns
    whether it did; False leaves the switch to trace it."""
    trace = family.ahead.pop(entry.key, None)
    if trace is None:
        return False
    trace.thread.join(timeout)
    if trace.thread.is_alive() or trace.error is not None:
        log.debug("the train step of %s traced ahead was not ready (%s): traced at the switch", trace.mode,
                  trace.error or "still tracing")
        return False
    entry.train_function = trace.function
    return True


def settle(family, timeout):
    """The fit ends: wait for traces still running, and keep each finished one as its mode's train function (a
    decision for a step past the end of ``fit`` is carried out in the next one)."""
    for key in list(family.ahead):
        claim(family, family.entries[key], timeout)  # (start wrapped it)
