"""What the training layer reads from the user's callbacks and checks across ranks.

Callbacks carry their own behaviour and declare it with class attributes, so this package never imports
``keras_callbacks`` (no import circle): ``hetsync_consensus`` (keras_callbacks.Consensus: ``every``, ``at_end``),
``hetsync_switches`` (keras_callbacks.SyncMode: ``bind(state)``, ``schedule``, ``verbose``) and
``hetsync_per_train_step`` (keras_callbacks.Slowdown and friends: ``on_local_iteration_begin/_end``, run inside
each train step).
"""
import itertools

_AGREEMENTS = itertools.count()


def consensus_options(user_callbacks, algorithm):
    """(every, at_end): a user's Consensus callback decides; else the mode's own ``consensus_every`` (eager-SGD's
    model_sync_every: batches between mid-epoch averages), else epoch ends only."""
    found = [cb for cb in user_callbacks if getattr(cb, "hetsync_consensus", False)]
    if found:
        return found[0].every, found[0].at_end
    return algorithm.consensus_every or "epoch", True


def agree(what, values, message):
    """Collective (one small Horovod allgather): raises ValueError on every rank, naming the ranks whose
    ``values`` (a list of ints) differ from rank 0's, with ``message(ranks)``."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    values = [int(v) for v in values]
    everyone = hvd.allgather(tf.constant([values], tf.int64), name=f"hetsync.agree.{what}.{next(_AGREEMENTS)}")
    rows = everyone.numpy().tolist()
    differ = [r for r, row in enumerate(rows) if row != rows[0]]
    if differ:
        raise ValueError(message(differ))
    return rows


def gather(what, values):
    """Collective: every rank's ``values`` (a list of ints), as a list of rows by rank."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    everyone = hvd.allgather(tf.constant([[int(v) for v in values]], tf.int64),
                             name=f"hetsync.gather.{what}.{next(_AGREEMENTS)}")
    return everyone.numpy().tolist()
