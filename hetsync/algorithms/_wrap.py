"""Wraps a Keras optimizer so a parameter-averaging method runs right after each local update.

Like Horovod's DistributedOptimizer, the wrapper is a dynamic subclass of the user's optimizer class built from its
config, so it keeps the class name, hyper-parameters, learning-rate schedule and slots.  It works for the Keras 2.15
optimizers and the legacy ones, eagerly and inside Keras' compiled train step.

It applies Horovod's optimizer keyword arguments that the algorithm resolved (base.SyncAlgorithm):
``sparse_as_dense``, ``backward_passes_per_step`` with ``average_aggregated_gradients`` (local gradient
accumulation), and ``name`` (the name scope of the ops it adds).
"""
import tensorflow as tf

from hetsync import marks


class _Accumulation:
    """Gradient accumulators and the pass counter of one wrapped optimizer.

    A plain object (not a Trackable), so the accumulators stay out of the optimizer's checkpoints and its
    ``variables``, as Horovod's LocalGradientAggregationHelper keeps them.
    """

    def __init__(self):
        self.counter = None  # passes accumulated since the last update (int64 tf.Variable)
        self.sums = {}  # model variable ref -> tf.Variable holding the sum of its gradients

    def ensure(self, optimizer, pairs):
        """Creates what is missing, lifted out of any tf.function (so only on its first trace)."""
        with tf.init_scope():
            if self.counter is None:
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_backward_passes")
            for grad, var in pairs:
                if var.ref() not in self.sums:
                    self.sums[var.ref()] = tf.Variable(tf.zeros(var.shape, dtype=grad.dtype), trainable=False,
                                                       name="hetsync_accumulated_gradient")
        build_slots(optimizer, [v for _, v in pairs])

    def clear(self, sums=None):
        """Zero passes and zero ``sums`` (default: all of them); graph code in the train step, or eagerly at a
        switch's flush."""
        for total in self.sums.values() if sums is None else sums:
            total.assign(tf.zeros_like(total))
        self.counter.assign(0)


def build_slots(optimizer, variables):
    """Creates ``optimizer``'s iteration counter and slots for ``variables`` as its first update would, lifted out of
    any tf.function or cond branch (an update that runs inside a ``tf.cond`` would otherwise create them there, with
    the cond's scope in their names, or fail to).  A ``LossScaleOptimizer``'s wrapped optimizer too."""
    with tf.init_scope():
        _ = optimizer.iterations  # legacy optimizers create it lazily
        if hasattr(optimizer, "_create_all_weights"):  # legacy (OptimizerV2)
            with tf.name_scope(optimizer._name):
                optimizer._create_all_weights(variables)
        elif hasattr(optimizer, "build"):
            with tf.name_scope(getattr(optimizer, "name", None) or "optimizer"):  # (a LossScaleOptimizer has none)
                optimizer.build(variables)
    inner = getattr(optimizer, "inner_optimizer", None)  # a LossScaleOptimizer's build leaves its optimizer's slots
    if inner is not None:
        build_slots(inner, variables)


def optimizer_variables(optimizer):
    """The optimizer's variables as a list: ``variables`` is a method of legacy Keras optimizers and of Horovod's
    wrappers, a property of the new ones."""
    found = optimizer.variables
    return list(found() if callable(found) else found)


_EXCHANGE = {"listener": None}  # what hears, from the graph, that a step's exchange is over (a custom loop's driver)


def on_exchange_done(listener):
    """``hetsync.job_steps`` asks to hear when each step's exchange is over (training/loop.py); None: it stops.
    The graph calls whatever listens when the step runs, so a traced step serves every loop."""
    _EXCHANGE["listener"] = listener


def _exchange_done():
    listener = _EXCHANGE["listener"]
    if listener is not None:
        listener()
    return 0


def _left_exchange(after):
    """Graph code, after this step's exchange (P-Reduce, partial allreduce, Hop's Recv): in a custom loop driven by
    ``hetsync.job_steps`` the rank will not come to another hetsync collective before its next step, so it reports
    BETWEEN now (the lifecycle's ``left_exchange``).  A Horovod collective later in the same step (Horovod's
    first-step ``broadcast_variables``) then cannot deadlock a peer whose exchange this rank was grouped into: the
    peer goes on without it after ``away_after`` (docs/engine.md, "Availability").  ``Model.fit`` marks the step's
    end itself: nobody listens, nothing happens."""
    with tf.control_dependencies([a for a in after if a is not None]):
        return tf.py_function(_exchange_done, [], tf.int32, name="hetsync_left_exchange")


def update_result(optimizer, iterations):
    """What a replaced ``apply_gradients`` returns, given the tensor it would return (the optimizer's
    ``iterations`` read after the update): the kind the optimizer's own would.  A legacy Keras optimizer returns
    an Operation (its ``iterations.assign_add``), the new ones a tensor; a ``LossScaleOptimizer`` puts the call in a
    ``tf.cond`` beside a branch of the optimizer's own kind, and the two must match (mixed precision with a legacy
    optimizer failed there to trace)."""
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer) and not tf.executing_eagerly():
        return tf.group(iterations)
    return iterations


def _densify(grads_and_vars):
    return [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v) for g, v in grads_and_vars]


def wrap_post_update(optimizer, algorithm):
    """Returns a copy of ``optimizer`` whose ``apply_gradients`` calls ``algorithm.after_update(vars, iterations)``
    when the algorithm declares ``EXCHANGES_PARAMETERS``.

    A gradient-exchanging method (eager-SGD) declares ``EXCHANGES_GRADIENTS`` instead (or as well): its
    ``before_update(grads, variables)`` returns the gradients the local update applies (dense tensors in; None
    gradients never reach it).

    ``after_update`` runs after the local update and after ``iterations`` was incremented, so iteration k's sync
    sees ``iterations == k + 1`` on every worker.

    With ``algorithm.backward_passes_per_step == N > 1``, each call adds its gradients to local accumulators; every
    N-th call applies the accumulated gradients (their sum, or their mean with
    ``algorithm.average_aggregated_gradients``) in ONE local update, increments ``iterations`` once and calls
    ``after_update`` once.  The other calls change no model variable, do not sync and leave ``iterations``
    unchanged, so ``iterations`` counts updates (the step a schedule or the Group Generator sees).  Sparse
    (IndexedSlices) gradients are accumulated into dense sums, so their update is dense.

    ``algorithm`` is a SyncAlgorithm (its resolved Horovod settings: base.SyncAlgorithm).
    """
    base = optimizer.__class__
    if marks.algorithm_of(optimizer) is not None:
        raise ValueError("this optimizer is already a hetsync.DistributedOptimizer; wrap the plain one")
    passes = int(algorithm.backward_passes_per_step or 1)
    average = bool(algorithm.average_aggregated_gradients)
    sparse_as_dense = bool(algorithm.sparse_as_dense)
    scope = algorithm.scope_name or f"Distributed{base.__name__}"

    def _sync(self, variables):
        variables = algorithm.shared(variables)
        if algorithm.EXCHANGES_PARAMETERS and variables:
            with tf.name_scope(scope):
                algorithm.after_update(variables, self.iterations)
                # reads of the variables come after the exchange's assignments (automatic control dependencies)
                _left_exchange([v.read_value() for v in variables])

    def _exchange(self, grads_and_vars):
        if not algorithm.EXCHANGES_GRADIENTS:
            return grads_and_vars
        local = algorithm.local_vars
        kept = [(g, v) for g, v in grads_and_vars if g is not None and v.ref() in local]  # worker-local: as is
        present = [(tf.convert_to_tensor(g), v) for g, v in grads_and_vars if g is not None and v.ref() not in local]
        if not present:
            return grads_and_vars
        with tf.name_scope(scope):
            exchanged = algorithm.before_update([g for g, _ in present], [v for _, v in present])
            if not algorithm.EXCHANGES_PARAMETERS:
                _left_exchange([e for e in exchanged if isinstance(e, tf.Tensor)])
        return list(zip(exchanged, [v for _, v in present])) + kept

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        stamped = algorithm.mark_compute_done([g for g, _ in grads_and_vars])
        grads_and_vars = list(zip(stamped, [v for _, v in grads_and_vars]))
        if sparse_as_dense:
            grads_and_vars = _densify(grads_and_vars)
        if passes == 1:
            result = base.apply_gradients(self, _exchange(self, grads_and_vars), *args, **kwargs)
            _sync(self, [v for g, v in grads_and_vars if g is not None])
            return result
        return _accumulate_or_apply(self, grads_and_vars, args, kwargs)

    def _accumulate_or_apply(self, grads_and_vars, args, kwargs):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        variables = [v for _, v in pairs]
        state = self._hetsync_accumulation
        state.ensure(self, pairs)
        sums = [state.sums[v.ref()] for v in variables]
        with tf.name_scope(scope):
            with tf.name_scope("accumulate"):
                for total, (grad, _) in zip(sums, pairs):
                    if isinstance(grad, tf.IndexedSlices):
                        total.scatter_add(grad)
                    else:
                        total.assign_add(grad)
                ready = tf.greater_equal(state.counter.assign_add(1), passes)

        def update():
            grads = [t.read_value() for t in sums]
            if average:
                grads = [g / tf.cast(passes, g.dtype) for g in grads]
            base.apply_gradients(self, _exchange(self, list(zip(grads, variables))), *args, **kwargs)
            _sync(self, variables)
            with tf.name_scope(scope):
                state.clear(sums)
            return tf.constant(True)

        applied = tf.cond(ready, update, lambda: tf.constant(False))
        with tf.control_dependencies([applied]):
            return update_result(self, tf.identity(self.iterations))

    cls = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "__module__": base.__module__})
    wrapped = base.from_config.__func__(cls, optimizer.get_config())
    wrapped._hetsync_accumulation = _Accumulation()
    marks.record(wrapped, algorithm=algorithm)
    return wrapped


def flush_accumulation(optimizer, variables):
    """A live switch leaves the mode of ``optimizer`` (hetsync/switching.py): gradients accumulated for
    ``backward_passes_per_step`` but not yet applied are applied now, as one local update of the user's optimizer
    (their sum, or their mean over ``backward_passes_per_step`` as the mode would have), and the accumulators are
    cleared.  The switch's consensus average that follows shares them: every gradient ends up in exactly one model
    update, none is carried, stale, into a later return to this mode.  hetsync's accumulators (``wrap_post_update``)
    and Horovod's (allreduce, OD-SGD: ``_agg_helper``) alike.  Returns the number of variables updated (0: nothing was
    pending)."""
    pairs, passes, average = _pending_accumulation(optimizer, variables)
    if not pairs:
        return 0
    grads = [g / passes if average else g for g, _ in pairs]
    apply_locally(optimizer, list(zip(grads, [v for _, v in pairs])))
    return len(pairs)


def apply_locally(optimizer, grads_and_vars):
    """One update of the user's optimizer class on this rank only: no exchange, no Horovod allreduce (the wrapper
    classes, ours and Horovod's, subclass the user's; gradient aggregation across replicas is turned off)."""
    user_class = type(optimizer).__mro__[1]
    kwargs = ({"experimental_aggregate_gradients": False} if hasattr(optimizer, "_create_all_weights")
              else {"skip_gradients_aggregation": True})
    user_class.apply_gradients(optimizer, grads_and_vars, **kwargs)


def _pending_accumulation(optimizer, variables):
    """([(sum, variable), ...], passes per update, average?) of what ``optimizer`` accumulated; clears it."""
    ours = getattr(optimizer, "_hetsync_accumulation", None)
    if ours is not None and ours.counter is not None:
        done = int(ours.counter.numpy())
        algorithm = marks.algorithm_of(optimizer)
        passes = int(algorithm.backward_passes_per_step or 1)
        average = bool(algorithm.average_aggregated_gradients)
        pairs = [(tf.identity(ours.sums[v.ref()]), v) for v in variables if v.ref() in ours.sums] if done else []
        ours.clear()
        return pairs, passes, average
    helper = getattr(optimizer, "_agg_helper", None)  # Horovod's LocalGradientAggregationHelper(Eager)
    if helper is None or not hasattr(helper, "locally_aggregated_grads"):
        return [], 1, False
    done = int(helper.counter.numpy())
    pairs = ([(tf.identity(acc), variables[i]) for i, acc in sorted(helper.locally_aggregated_grads.items())]
             if done else [])
    for acc in helper.locally_aggregated_grads.values():
        acc.assign(tf.zeros_like(acc))
    helper.counter.assign(0)
    return pairs, helper.backward_passes_per_step, helper.average_aggregated_gradients
