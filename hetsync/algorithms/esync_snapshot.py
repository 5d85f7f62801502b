"""ESync's snapshots of what one local iteration changes: the RUN-BATCH-DATA-TEST's iterations are undone (§3.1,
Algorithm 1 line 6: round 0 starts from w_0), and so is an iteration during which a READY answer arrived under
``on_ready="abort"`` (§4.2) (hetsync/algorithms/esync.py)."""
import tensorflow as tf

from hetsync.algorithms._wrap import build_slots, optimizer_variables


def state_variables(model):
    """What one local iteration changes: the model's variables, the optimizer's (slots, iterations: created
    first if the optimizer has not run yet) and the metrics' accumulators."""
    optimizers = [model.optimizer]
    inner = getattr(model.optimizer, "inner_optimizer", None)  # mixed precision: the loss-scale wrapper's
    if inner is not None:
        optimizers.append(inner)
    build_slots(optimizers[-1], model.trainable_variables)
    opt_vars = [v for o in optimizers for v in optimizer_variables(o)]
    found, seen = [], set()
    for v in list(model.variables) + opt_vars + [v for m in model.metrics for v in m.variables]:
        if id(v) not in seen:
            seen.add(id(v))
            found.append(v)
    return found


def snapshot(model):
    """(variable, its value) of every variable one local iteration of ``model`` changes."""
    return [(v, tf.identity(v.read_value())) for v in state_variables(model)]


def restore(saved):
    for v, value in saved:
        v.assign(value)
