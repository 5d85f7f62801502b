"""``hetsync.DistributedOptimizer``: the one line a Horovod Keras script changes."""
from hetsync import algorithms


def DistributedOptimizer(optimizer, sync="allreduce", **options):  # noqa: N802 (Horovod's name)
    """Wraps a Keras optimizer so training synchronizes with the method named by ``sync``.

    Args:
      optimizer: any Keras optimizer (``tf.keras.optimizers.*``, new or legacy).
      sync: a registered mode; ``hetsync.available_modes()`` lists them.  ``"allreduce"`` is Horovod's own
        DistributedOptimizer (the baseline).
      **options: the mode's options (see README); unknown ones raise ValueError listing the valid ones.

    Returns:
      A Keras optimizer to pass to ``model.compile``; its ``_hetsync_algorithm`` is the SyncAlgorithm in use.
    """
    from hetsync import fit_hook

    fit_hook.install()  # epoch-end sync points and finished ranks, for every mode (hetsync/fit_hook.py)
    algorithm = algorithms.create(sync, **options)
    wrapped = algorithm.wrap(optimizer)
    if getattr(wrapped, "_hetsync_algorithm", None) is None:
        wrapped._hetsync_algorithm = algorithm
    return wrapped
