"""hetsync/trace_ahead.py in one process: a new mode's Keras step traced in a thread, on a view of the model.

The view must give the traced step the new mode's optimizer while the model keeps the one in force (the rank trains
on with it meanwhile), and the traced function must be the one that runs later, not traced again; a user's
``train_step`` that calls ``super()`` traces on it too.  A step the view cannot trace is left to the switch, and the
failed trace holds nothing of the fit's.  The switch itself, with the thread, on 4 ranks: tests/mpi/keras_switch.py
(its warm-up scenario).
"""
import gc
import threading
import types
import weakref

import numpy as np
import tensorflow as tf

from hetsync import trace_ahead
from hetsync.algorithms._wrap import build_slots
from hetsync.training.step_clock import StepClock


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    return iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat())


def _compiled(model):
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.build((None, 4))
    return model


def _traced_on_a_view(model, iterator):
    new = tf.keras.optimizers.Adam(0.01)
    build_slots(new, model.trainable_variables)
    view = trace_ahead._ModelView(model, new)
    trace = trace_ahead._Trace("adam", type(model).make_train_function(view, force=True), iterator)
    trace.thread.join(60)
    return new, trace


def test_a_step_traced_on_the_view_trains_with_the_new_optimizer_and_is_not_traced_again():
    """Traced in its thread after a step of the mode in force (as a switch comes after the fit's first step, which
    built Keras' metrics: a trace that creates variables is traced again), the step updates with the view's
    optimizer (Adam's count moves, the model's SGD does not), the model's optimizer and train function are untouched,
    and three steps use the one trace."""
    model = _compiled(tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(2)]))
    iterator = _data()
    in_force, own_step = model.optimizer, model.make_train_function()
    own_step(iterator)
    new, trace = _traced_on_a_view(model, iterator)
    assert trace.error is None, trace.error
    assert model.optimizer is in_force and model.train_function is own_step
    before = [w.numpy().copy() for w in model.trainable_variables]
    for _ in range(3):
        logs = trace.function(iterator)
    assert int(new.iterations.numpy()) == 3 and int(in_force.iterations.numpy()) == 1
    assert any(not np.array_equal(a, w.numpy()) for a, w in zip(before, model.trainable_variables))
    assert set(logs) == {"loss", "accuracy"}, logs
    assert trace.function.experimental_get_tracing_count() == 1


class _SuperStep(tf.keras.Model):
    """A user's model whose ``train_step`` calls ``super()`` (the usual Keras override) and counts its steps."""

    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(2)
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        self.steps.assign_add(1)
        return super().train_step(data)


def test_a_train_step_override_that_calls_super_is_traced_on_the_view():
    """Zero-argument ``super()`` needs an object of the user's class: the view passes for one (its ``__class__``),
    so the override is traced ahead too, runs the user's code and Keras' step with the new optimizer, and is not
    traced again.  (Read as "any object will do", the trace fails in its thread and every switch of such a model
    traces at its step, on every rank at once.)"""
    model = _compiled(_SuperStep())
    iterator = _data()
    model.make_train_function()(iterator)
    new, trace = _traced_on_a_view(model, iterator)
    assert trace.error is None, trace.error
    for _ in range(2):
        trace.function(iterator)
    assert int(new.iterations.numpy()) == 2 and int(model.optimizer.iterations.numpy()) == 1
    assert int(model.steps.numpy()) == 3
    assert trace.function.experimental_get_tracing_count() == 1


class _Refusing(tf.keras.Model):
    """A user's model whose ``train_step`` cannot be traced (it raises)."""

    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        raise ValueError("this step cannot be traced")


def test_a_step_the_view_cannot_trace_is_left_to_the_switch_and_holds_nothing():
    """The trace fails in its thread; the switch's claim then gives nothing, and the entry keeps no train function:
    the switch traces the step itself, as without the thread.  The failure is kept as text: with the cyclic
    collector off, dropping the test's own reference frees the data iterator at once.  (An exception kept with its
    traceback holds the thread's frame, the trace and the iterator in a cycle; freed later by the collector in the
    middle of some step, the iterator's deletion waits for its tf.data threads -- seconds, seen in a later fit.)"""
    model = _compiled(_Refusing())
    iterator = _data()
    alive = weakref.ref(iterator)
    gc.collect()
    gc.disable()
    try:
        _, trace = _traced_on_a_view(model, iterator)
        del iterator
        assert alive() is None, "the failed trace keeps the data iterator alive"
    finally:
        gc.enable()
    assert trace.error.startswith("ValueError") and "cannot be traced" in trace.error, trace.error
    entry = types.SimpleNamespace(mode="adam", key=("adam", "{}"), train_function=None)
    family = types.SimpleNamespace(ahead={entry.key: trace})
    assert trace_ahead.claim(family, entry, 60) is False
    assert entry.train_function is None and not family.ahead


def test_steps_that_share_the_rank_with_its_trace_give_the_policy_no_sample():
    """While a trace of the rank's own runs, ``tracing`` says so and the step clock drops the steps' samples (the
    trace starves them: read as a throttled node's, they moved a job back out of the mode it had just chosen); the
    steps before and after give theirs."""
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    family = types.SimpleNamespace(ahead={("adam", "{}"): types.SimpleNamespace(thread=thread)})
    clock = StepClock()
    assert not trace_ahead.tracing(None)

    def step(t):
        clock.step(None, 0.0, t, t + 0.1, False, split=False, own_work=trace_ahead.tracing(family))

    step(1.0)
    thread.start()
    step(2.0)
    step(3.0)
    release.set()
    thread.join(10)
    step(4.0)
    assert [round(t) for t, _, _ in clock.take_samples()] == [1, 4]
