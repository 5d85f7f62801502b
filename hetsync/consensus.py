"""Consensus: one Horovod average of all workers' parameters, so decentralized training yields one model.

Decentralized methods (Ripples, Hop, ...) leave workers with different parameters.  Before evaluation,
checkpointing, a mode switch and the end of training, the job averages them with Horovod (ARCHITECTURE.md).

A consensus round is a global collective, so it must not wait on a worker that still trains alone, nor make a
training worker wait on one that is in the round: the algorithm withdraws the worker from hetsync's own collectives
for the duration (``on_consensus_begin``) and rejoins afterwards.  Each round also carries a "finished" flag: a
worker whose training has ended keeps joining the others' rounds (``finish``) until every worker has finished, so
workers that run different numbers of steps or epochs all end with the same model, without a hang.
"""

def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def _algorithm_of(model):
    optimizer = getattr(model, "optimizer", None)
    return getattr(optimizer, "_hetsync_algorithm", None)


def _averageable(variables):
    return [v for v in variables if v.dtype.is_floating]


def consensus(model, finished=False, algorithm=None, name="hetsync_consensus"):
    """Averages ``model``'s float variables over all workers; returns True when every worker says finished.

    Collective over all Horovod ranks: every rank must call it the same number of times (``finish`` keeps a finished
    worker in step with the others).
    """
    import tensorflow as tf

    hvd = _hvd()
    algorithm = algorithm if algorithm is not None else _algorithm_of(model)
    if algorithm is not None:
        algorithm.on_consensus_begin()
    variables = _averageable(model.variables)
    if variables:
        averaged = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables], op=hvd.Average,
                                         name=f"{name}.params")
        for var, value in zip(variables, averaged):
            var.assign(value)
    flag = hvd.allreduce(tf.constant(1.0 if finished else 0.0), op=hvd.Min, name=f"{name}.finished")
    all_finished = bool(flag.numpy() >= 1.0)
    if algorithm is not None:
        # Once every worker has finished, all rejoin together: the next fit() starts with everyone in.
        algorithm.on_consensus_end(finished and not all_finished)
    return all_finished


def sync_point(model, algorithm, finished, weight=1.0, average=True, name="hetsync.sync"):
    """One global sync point (hetsync/fit_hook.py): leave hetsync's collectives, ``hvd.join()``, average, rejoin.

    Every rank calls it the same number of times.  ``hvd.join()`` first: a rank that arrives early (end of its
    epoch or of its training) lets the others' Horovod collectives complete without it while it waits -- their
    gradient allreduce in a synchronous mode, a user's ``hvd.allreduce`` in a callback -- so no rank waits on one
    that is not coming.  Then, with every rank here, the models are averaged weighted by ``weight`` (1 for a rank
    that trained since its last sync point, 0 for a finished one: the newest models make the consensus; if every
    weight is 0 all count equally), which leaves every rank with the same model.  ``average=False`` skips the
    average (``Consensus(every=None)``).  Returns True when every rank says ``finished``.
    """
    import tensorflow as tf

    hvd = _hvd()
    if algorithm is not None:
        algorithm.on_consensus_begin()
    hvd.join()
    if average:
        _weighted_average(model, weight, name)
    flag = hvd.allreduce(tf.constant(1.0 if finished else 0.0), op=hvd.Min, name=f"{name}.finished")
    all_finished = bool(flag.numpy() >= 1.0)
    if algorithm is not None:
        algorithm.on_consensus_end(finished and not all_finished)
    return all_finished


def _weighted_average(model, weight, name):
    """sum(w_r x_r) / sum(w_r) over ranks with Horovod Sum (joined ranks would contribute zeros: exact anyway)."""
    import tensorflow as tf

    hvd = _hvd()
    variables = _averageable(model.variables)
    if not variables:
        return
    w = tf.constant(float(weight), tf.float64)
    scaled = [tf.cast(v, tf.float64) * w for v in variables] + [tf.reshape(w, [1])]
    sums = hvd.grouped_allreduce(scaled, op=hvd.Sum, name=f"{name}.params")
    total = float(sums[-1].numpy()[0])
    if total <= 0:  # nobody trained since the last sync point (e.g. fit with no steps): plain average
        sums = hvd.grouped_allreduce([tf.cast(v, tf.float64) for v in variables] + [tf.ones([1], tf.float64)],
                                     op=hvd.Sum, name=f"{name}.params_all")
        total = float(sums[-1].numpy()[0])
    for var, value in zip(variables, sums[:-1]):
        var.assign(tf.cast(value / total, var.dtype))


def finish(model, algorithm=None, name="hetsync_consensus"):
    """Ends training on this worker: joins consensus rounds until every worker has finished; returns the round count."""
    rounds = 1
    while not consensus(model, finished=True, algorithm=algorithm, name=name):
        rounds += 1
    return rounds
