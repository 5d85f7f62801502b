"""What the Horovod-based synchronous modes (``allreduce``, ``od-sgd``) share.

Idle ranks keep stepping with weight 0: a rank that stopped early (hetsync/training/) must still take part in every
gradient allreduce of the others, or their collectives would never complete.  So its steps run as usual, with its
gradients scaled by a contribution of 0 (Horovod's ``join`` semantics; ``hvd.join`` itself cannot be called twice
in a process in Horovod 0.28).

Every step's gradients are allreduced once, whichever door the step came through (:class:`ReducedOnce`).
"""
import tensorflow as tf


def horovod_optimizer(hvd_keras, optimizer, horovod_kwargs):
    """``hvd_keras.DistributedOptimizer(optimizer, **horovod_kwargs)``, its gradient allreduce traced without
    AutoGraph.  Horovod builds that allreduce as a ``tf.function`` with AutoGraph on; its code is graph code already
    (lists of tensors, an explicit ``tf.cond``), so the same function without AutoGraph builds the same ops, and a
    process's first trace of it is seconds shorter (AutoGraph converts Horovod's functions one by one: measured on
    2 loaded cores, ~8 of the first fit's ~10 s of tracing).  The instance's own attribute, nothing of Horovod's
    module is changed."""
    wrapped = hvd_keras.DistributedOptimizer(optimizer, **horovod_kwargs)
    python = getattr(getattr(wrapped, "_allreduce_grads", None), "python_function", None)
    if python is not None:  # (built eagerly, as Keras optimizers are: a tf.function)
        wrapped._allreduce_grads = tf.function(python, autograph=False)
        helper = wrapped._agg_helper  # backward_passes_per_step > 1: Horovod's aggregation calls it
        if helper is not None:
            for name in ("_allreduce_grads", "allreduce_grads"):
                if hasattr(helper, name):
                    setattr(helper, name, wrapped._allreduce_grads)
    return wrapped


class IdleContribution:
    """Mixin for a SyncAlgorithm: ``self.contribution`` (1.0, or 0.0 while idle) and the idle hooks."""

    def make_contribution(self):
        with tf.init_scope():
            self.contribution = tf.Variable(1.0, trainable=False, name="hetsync_contribution")
        return self.contribution

    def on_idle(self):
        self.contribution.assign(0.0)

    def idle_step(self, train_function, iterator):
        return train_function(iterator)

    def on_resume(self):
        self.contribution.assign(1.0)


_TAPE_SCOPE = "DistributedGradientTape_Allreduce"


def horovod_tape_gradients(gradients):
    """True when a gradient (a graph tensor) comes out of ``hvd.DistributedGradientTape``'s allreduce (Horovod's
    tape builds it under the name scope ``DistributedGradientTape_Allreduce``).  Eager tensors: False."""
    seen, todo = set(), [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    todo = [t for t in todo if t is not None and tf.is_symbolic_tensor(t)]
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


class ReducedOnce:
    """Every step's gradients through Horovod's allreduce exactly once, whichever door the step came through.

    Horovod's Keras ``DistributedOptimizer`` allreduces in ``compute_gradients`` (Keras' ``minimize``: the path of
    ``fit``), not in ``apply_gradients``.  A custom loop (``tape.gradient``, then ``apply_gradients``: Horovod's
    TF2 loop with its ``DistributedGradientTape`` dropped, as hetsync's README has it) never calls the former, and
    would train each rank on its own gradients.  So the mode's ``_allreduce`` marks the step (:meth:`reduced`: a
    Python flag, set while the step runs eagerly or is traced) and its ``apply_gradients`` passes the gradients
    through :meth:`ready`: those that came neither through ``_allreduce`` nor out of Horovod's own tape are
    allreduced there, by the mode's ``_allreduce`` (its idle weight, its compute stamp, Horovod's allreduce)."""

    def __init__(self):
        self._marked = False

    def reduced(self):
        self._marked = True

    def ready(self, optimizer, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        marked, self._marked = self._marked, False
        if marked or horovod_tape_gradients([g for g, _ in grads_and_vars]):
            return grads_and_vars
        present = [(g, v) for g, v in grads_and_vars if g is not None]
        if not present:
            return present
        reduced = optimizer._allreduce([g for g, _ in present], [v for _, v in present])
        self._marked = False  # (that call marked itself)
        return list(zip(reduced, [v for _, v in present]))


def loss_scale_parts(optimizer):
    """(inner optimizer, rewrap) for a Keras ``LossScaleOptimizer`` (mixed precision), else (optimizer, identity).

    Horovod 0.28's DistributedOptimizer cannot wrap Keras 2.15's loss-scale optimizer (it rebuilds the optimizer
    from its config, which that class does not allow), so the Horovod-based modes wrap the inner optimizer and put
    the same loss scaling back around it: the allreduce then sees unscaled gradients, as Horovod's mixed-precision
    guide has it.  A step whose gradients overflow on one rank only is skipped there alone, as with Horovod.

    The loss-scale wrapper is of a class made for it whose ``from_config`` rebuilds the same mode (as every
    hetsync optimizer's does): Keras' own would rebuild the inner optimizer from its config alone, a plain one
    that exchanges nothing."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None or not hasattr(optimizer, "get_scaled_loss"):
        return optimizer, lambda wrapped: wrapped
    settings = {"dynamic": optimizer.dynamic, "initial_scale": float(optimizer.initial_scale)}
    if optimizer.dynamic:
        settings["dynamic_growth_steps"] = optimizer.dynamic_growth_steps
    base = type(optimizer)

    def rewrap(wrapped):
        cls = type(base.__name__, (base,), {"__module__": base.__module__})  # its from_config: switching.Family
        return cls(wrapped, **settings)

    return inner, rewrap
