"""The public observability API: what a hetsync optimizer is doing, without private attributes.

Each function takes a Keras model compiled with ``hetsync.DistributedOptimizer`` or that optimizer (the one the call
returned, or ``model.optimizer`` after a live switch: they answer alike, for the job's mode in force)::

    hetsync.current_mode(model)     # "esync"
    hetsync.metrics(model)          # {"local_steps": 412, ...}: the mode in force's own counters
    hetsync.switch_history(model)   # [{"from": "allreduce", "to": "esync", "position": 57, "reason": ...}, ...]

Anything else is a TypeError naming what was given.  They are local (no collective): each rank answers for itself.
"""
from hetsync import marks

__all__ = ["metrics", "switch_history", "current_mode"]


def _resolve(obj, what):
    """(family or None, algorithm in force) of a hetsync optimizer or of a model compiled with one."""
    candidates = [obj, getattr(obj, "optimizer", None)]
    for opt in candidates:
        family = marks.family_of(opt)
        if family is not None and getattr(family, "current", None) is not None:
            return family, family.current_entry.algorithm
        algorithm = marks.algorithm_of(opt)
        if algorithm is not None:
            return family, algorithm
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    hint = " (a model not compiled yet, or compiled with another optimizer)" if hasattr(obj, "compile") else ""
    raise TypeError(f"hetsync.{what}() needs a Keras model compiled with hetsync.DistributedOptimizer, or that "
                    f"optimizer; got {kind}{hint}")


def metrics(model_or_optimizer):
    """The mode in force's own counters (a new dict of numbers and short values): Group Generator conflicts,
    eager-SGD's NAP, Hop's queue depths and staleness, ESync's local steps, OD-SGD's exposed wait, balanced's
    share...  ``{}`` for a mode without counters (``allreduce``)."""
    _, algorithm = _resolve(model_or_optimizer, "metrics")
    return dict(algorithm.metrics() or {})


def switch_history(model_or_optimizer):
    """The live switches this rank made (hetsync.callbacks.SyncModeCallback, or sync="auto"), oldest first: a list of new
    dicts with ``from``, ``to``, ``position`` (the job's train step), ``options``, ``reason`` (sync="auto": the
    policy's evidence), ``time`` (epoch seconds), ``seconds`` (the switch's duration) and ``traced``.  Switches
    refused at their roll call are not in it.  ``[]`` before any switch."""
    family, _ = _resolve(model_or_optimizer, "switch_history")
    return [dict(record) for record in (family.history if family is not None else [])]


def current_mode(model_or_optimizer):
    """The ``sync=`` name of the mode in force (after a live switch: the mode switched to)."""
    family, algorithm = _resolve(model_or_optimizer, "current_mode")
    if family is not None and family.current is not None:
        return family.current[0]
    return algorithm.name
