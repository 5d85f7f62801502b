"""Wraps a Keras optimizer so a parameter-averaging method runs right after each local update.

Like Horovod's DistributedOptimizer, the wrapper is a dynamic subclass of the user's optimizer class built from its
config, so it keeps the class name, hyper-parameters, learning-rate schedule and slots.  It works for the Keras 2.15
optimizers and the legacy ones, eagerly and inside Keras' compiled train step.
"""


def wrap_post_update(optimizer, algorithm):
    """Returns a copy of ``optimizer`` whose ``apply_gradients`` calls ``algorithm.after_update(vars, iterations)``.

    ``after_update`` runs after the local update and after ``iterations`` was incremented, so iteration k's sync
    sees ``iterations == k + 1`` on every worker.
    """
    base = optimizer.__class__
    if getattr(optimizer, "_hetsync_algorithm", None) is not None:
        raise ValueError("this optimizer is already a hetsync.DistributedOptimizer; wrap the plain one")

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        result = base.apply_gradients(self, grads_and_vars, *args, **kwargs)
        variables = [v for g, v in grads_and_vars if g is not None]
        self._hetsync_algorithm.after_update(variables, self.iterations)
        return result

    cls = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "__module__": base.__module__})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._hetsync_algorithm = algorithm
    return wrapped
