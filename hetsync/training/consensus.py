"""Consensus: one Horovod average of all workers' parameters, so decentralized training yields one model.

Decentralized methods (Ripples, Hop, ...) leave workers with different parameters.  Before evaluation,
checkpointing, a mode switch and the end of training, the job averages them with Horovod (ARCHITECTURE.md); inside
``Model.fit`` the sync points of hetsync/training/ call :func:`sync_point`.

A consensus round is a global collective, so it must not wait on a worker that still trains alone, nor make a
training worker wait on one that is in the round: the algorithm withdraws the worker from hetsync's own collectives
for the duration (``on_consensus_begin``) and rejoins afterwards (``on_consensus_end``), unless it is idle.
"""
from hetsync import marks


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def _algorithm_of(model):
    optimizer = getattr(model, "optimizer", None)
    return marks.algorithm_of(optimizer)


def _averageable(variables):
    return [v for v in variables if v.dtype.is_floating]


def consensus(model, finished=False, algorithm=None, name="hetsync_consensus"):
    """Averages ``model``'s float variables over all workers; returns True when every worker says ``finished``.

    For custom training loops (``Model.fit`` does this by itself, hetsync/training/).  Collective over all Horovod
    ranks: every rank must call it the same number of times; a worker that has finished keeps calling it (with
    ``finished=True``, weight 0 in the average) until it returns True.
    """
    algorithm = algorithm if algorithm is not None else _algorithm_of(model)
    return sync_point(model, algorithm, idle=finished, weight=0.0 if finished else 1.0, name=name)


def sync_point(model, algorithm, idle, weight=1.0, average=True, name="hetsync.sync"):
    """One global sync point (hetsync/training/): leave hetsync's collectives, average, say who is idle, rejoin.

    Every rank calls it the same number of times -- idle ranks (stopped early) too, since they step through the
    same epochs.  The models are averaged weighted by ``weight`` (1 for a rank that trained since its last sync
    point, 0 for an idle one: the newest models make the consensus; if every weight is 0 all count equally), which
    leaves every rank with the same model.  ``average=False`` skips the average (``ConsensusCallback(every=None)``).
    Returns True when every rank is idle.  Idle ranks stay withdrawn from hetsync's collectives afterwards.
    The idle flags travel in the average's allreduce: each Horovod collective is a negotiation that waits for the
    slowest rank's background thread (a CFS period on a throttled node), so one fewer per sync point.
    """
    import tensorflow as tf

    hvd = _hvd()
    if algorithm is not None:
        algorithm.on_consensus_begin()
    idle_ranks = None
    if average:
        idle_ranks, _ = weighted_average(model, weight, name, idle=idle,
                                         exclude=algorithm.local_vars if algorithm is not None else ())
    if idle_ranks is None:  # no average, or nothing to average: the flags alone
        flag = hvd.allreduce(tf.constant(1.0 if idle else 0.0), op=hvd.Min, name=f"{name}.idle")
        all_idle = bool(flag.numpy() >= 1.0)
    else:
        all_idle = idle_ranks >= hvd.size()
    if algorithm is not None:
        algorithm.on_consensus_end(idle)
    return all_idle


def weighted_average(model, weight, name, exclude=(), idle=False, carry=()):
    """sum(w_r x_r) / sum(w_r) over ranks, in float64 with Horovod Sum: identical models stay bit-identical.
    ``exclude``: refs of worker-local variables (Horovod's register_local_var), which keep their own values.
    ``carry``: float64 tensors summed over the ranks in the same collective (a switch's optimizer state: each Horovod
    collective is a negotiation that waits for the slowest rank's background thread).  Returns (how many ranks are
    ``idle``, summed with the weights, or None when there is nothing to average; the sums of ``carry``, a list)."""
    import tensorflow as tf

    hvd = _hvd()
    carry = list(carry)
    variables = [v for v in _averageable(model.variables) if v.ref() not in exclude]
    if not variables:
        carried = hvd.grouped_allreduce(carry, op=hvd.Sum, name=f"{name}.carried") if carry else []
        return None, list(carried)
    w = tf.constant(float(weight), tf.float64)
    flag = tf.constant(1.0 if idle else 0.0, tf.float64)
    scaled = [tf.cast(v, tf.float64) * w for v in variables] + [tf.stack([w, flag])]
    sums = hvd.grouped_allreduce(scaled + carry, op=hvd.Sum, name=f"{name}.params")
    sums, carried = sums[:len(scaled)], list(sums[len(scaled):])
    total, idle_ranks = (float(x) for x in sums[-1].numpy())
    if total <= 0:  # nobody trained since the last sync point (e.g. fit with no steps): plain average
        sums = hvd.grouped_allreduce([tf.cast(v, tf.float64) for v in variables] + [tf.ones([1], tf.float64)],
                                     op=hvd.Sum, name=f"{name}.params_all")
        total = float(sums[-1].numpy()[0])
    for var, value in zip(variables, sums[:-1]):
        var.assign(tf.cast(value / total, var.dtype))
    return round(idle_ranks), carried
