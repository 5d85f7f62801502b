"""hetsync's Keras front door: ``hetsync.keras.fit(model, ...)``.

A Horovod Keras script keeps its ``model.fit`` call and writes it ``hetsync.keras.fit(model, ...)``, with the same
arguments; the callbacks (Horovod's, Keras', hetsync's ``*Callback``) stay as they are.  Nothing of Keras or Horovod
is replaced for the process: a model trained with plain Horovod beside it still uses its own ``model.fit``.
"""
from hetsync.training import keras_fit


def fit(model, *args, **kwargs):
    """``model.fit(*args, **kwargs)`` with hetsync's training layer for a model compiled with a
    ``hetsync.DistributedOptimizer``; any other model's own ``fit``, unchanged.

    What hetsync adds (README "Job epochs", docs/guarantees.md): the ranks plan each fit's epochs together (every
    rank runs the same Keras steps; with uneven ``steps_per_epoch`` a finite dataset is repeated), every epoch and
    the fit end with one model on every rank, and a rank that stops early (``EarlyStopping``, a time budget, a short
    shard) keeps taking part until every rank stops at one agreed step.  Returns Keras' ``History``.  Plain
    ``model.fit`` of such a model is refused with a ValueError on every rank, naming this function.
    """
    return keras_fit.fit(model, args, kwargs)
