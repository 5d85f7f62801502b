"""Every keyword argument of hvd.DistributedOptimizer is accepted by every sync mode (hetsync/algorithms/
horovod_kwargs.py): applied with Horovod's meaning, or accepted with one warning on rank 0.

Single process with real TensorFlow and Horovod (not initialised); the wrapper is tested through a stub algorithm
whose after_update counts its calls in tf.Variables.  One short 2-rank MPI job checks the real ripples modes.
"""
import inspect
import warnings

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_ok, run_mpi

from hetsync import algorithms, marks
from hetsync.algorithms import horovod_kwargs as hk
from hetsync.algorithms._wrap import wrap_post_update
from hetsync.algorithms.options import defaults
from hetsync.algorithms.base import SyncAlgorithm

# A value other than Horovod's default for every kwarg (process_set: the global one, the only valid one here).
NON_DEFAULT = dict(
    name="my_opt", device_dense="/cpu:0", device_sparse="/cpu:0", compression=hvd_keras.Compression.fp16,
    sparse_as_dense=True, gradient_predivide_factor=2.0, op=hvd_tf.Sum, backward_passes_per_step=2,
    average_aggregated_gradients=True, num_groups=2, groups=2, process_set=hvd_tf.global_process_set,
    scale_local_gradients=False,
)
DEFAULTS = dict(
    name=None, device_dense="", device_sparse="", compression=hvd_keras.Compression.none, sparse_as_dense=False,
    gradient_predivide_factor=1.0, op=hvd_tf.Average, backward_passes_per_step=1,
    average_aggregated_gradients=False, num_groups=0, groups=None, process_set=hvd_tf.global_process_set,
    scale_local_gradients=True,
)
# Modes that resolve Horovod's kwargs themselves (the others, allreduce and od-sgd, hand them to Horovod unchanged)
DECENTRALIZED = [m for m in algorithms.available_modes() if not algorithms._REGISTRY[m].HOROVOD_PASSTHROUGH]


def ours(caught):
    return [w for w in caught if issubclass(w.category, hk.HorovodKwargWarning)]


def create(mode, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        algo = algorithms.create(mode, **kw)
    return algo, ours(caught)


class Recorder(SyncAlgorithm):
    """A parameter-averaging mode that only counts: after_update records its calls and the iterations it saw."""

    name = "test-recorder"
    EXCHANGES_PARAMETERS = True

    def wrap(self, optimizer):
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.seen_iterations = tf.Variable(-1, dtype=tf.int64, trainable=False)
        return wrap_post_update(optimizer, self)

    def after_update(self, variables, iterations):
        self.calls.assign_add(1)
        self.seen_iterations.assign(tf.cast(iterations, tf.int64))


def recorder(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hk.HorovodKwargWarning)
        return Recorder(**kw)


# -- the list and the constructors ----------------------------------------------------------------------------------
def test_names_are_exactly_the_installed_horovod_keywords():
    params = list(inspect.signature(hvd_keras.DistributedOptimizer).parameters)
    assert params[0] == "optimizer"
    assert tuple(params[1:]) == hk.NAMES
    for key, value in DEFAULTS.items():
        assert hk.is_default(key, value), key
        assert not hk.is_default(key, NON_DEFAULT[key]) or key == "process_set", key


def test_distributed_optimizer_has_horovods_signature_and_a_keyword_only_sync():
    """help() and IDEs show Horovod's keywords, in Horovod's order (a positional call keeps its meaning: the second
    argument is ``name``, as in Horovod, never a sync mode); ``sync`` and ``job_epochs`` are keyword-only; the
    defaults are Horovod's (None standing for Compression.none, Average and the global process set)."""
    import hetsync

    ours = inspect.signature(hetsync.DistributedOptimizer).parameters
    theirs = inspect.signature(hvd_keras.DistributedOptimizer).parameters
    positional = [n for n, p in ours.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == list(theirs)
    for key in hk.NAMES:
        default = ours[key].default
        assert default == theirs[key].default or (default is None and hk.is_default(key, theirs[key].default)), key
    assert ours["sync"].kind is inspect.Parameter.KEYWORD_ONLY and ours["sync"].default == "allreduce"
    assert ours["job_epochs"].kind is inspect.Parameter.KEYWORD_ONLY


def test_only_the_horovod_keywords_given_are_passed_on():
    from hetsync.optimizer import _given_horovod_kwargs

    arguments = {key: inspect.signature(hvd_keras.DistributedOptimizer).parameters[key].default
                 for key in hk.NAMES}
    arguments.update(compression=None, op=None, process_set=None)
    assert _given_horovod_kwargs(arguments) == {}
    arguments.update(backward_passes_per_step=2, sparse_as_dense=True, name="opt")
    assert _given_horovod_kwargs(arguments) == {"backward_passes_per_step": 2, "sparse_as_dense": True,
                                                "name": "opt"}
    arguments.update(num_groups=False)  # not the int default 0: asked for, then refused by the mode's check
    assert "num_groups" in _given_horovod_kwargs(arguments)


@pytest.mark.parametrize("mode", algorithms.available_modes())
def test_every_mode_accepts_every_horovod_kwarg(mode):
    algo, caught = create(mode, **NON_DEFAULT)
    assert algo.horovod_kwargs == NON_DEFAULT
    assert algo.options == defaults(type(algo).OPTIONS)  # the mode's own options are untouched
    assert algo.compression is hvd_keras.Compression.fp16
    if type(algo).HOROVOD_PASSTHROUGH:  # allreduce, od-sgd: Horovod applies (and validates) them ...
        part_time = type(algo).HOROVOD_PART_TIME  # ... od-sgd in its warm-up only: those it does not apply after
        assert list(algo.ignored_horovod_kwargs) == [k for k in hk.NAMES if k in part_time]
        assert len(caught) == (1 if part_time else 0)
        if part_time:
            assert "op=Sum applies only while Horovod's optimizer runs sync='od-sgd'" in str(caught[0].message)
    else:
        assert (algo.backward_passes_per_step, algo.average_aggregated_gradients, algo.sparse_as_dense,
                algo.scope_name) == (2, True, True, "my_opt")
        applied = type(algo).HOROVOD_APPLIED  # the wrapper's, plus what the mode applies itself (balanced: op)
        assert list(algo.ignored_horovod_kwargs) == [k for k in hk.NAMES if k not in applied]
        assert len(caught) == 1
    # Horovod's defaults, passed explicitly, ask for nothing: accepted silently, same as not passing them
    algo, caught = create(mode, **DEFAULTS)
    assert caught == [] and algo.ignored_horovod_kwargs == {}
    assert algo.compression is hvd_keras.Compression.none and algo.backward_passes_per_step == 1
    # and one at a time, mixed with the mode's own options
    own = defaults(type(algo).OPTIONS)
    for key, value in NON_DEFAULT.items():
        algo, _ = create(mode, **own, **{key: value})
        assert algo.horovod_kwargs == {key: value}


@pytest.mark.parametrize("mode", algorithms.available_modes())
def test_unknown_kwarg_is_a_value_error_listing_the_valid_names(mode):
    with pytest.raises(ValueError) as err:
        algorithms.create(mode, backward_passes=2)
    text = str(err.value)
    assert "backward_passes" in text and mode in text
    for key in (*hk.NAMES, *algorithms._REGISTRY[mode].OPTIONS):
        assert key in text, key


@pytest.mark.parametrize("mode", DECENTRALIZED)
def test_bad_values_are_value_errors_naming_the_kwarg(mode):
    class Custom(hvd_keras.Compression.none):
        pass

    bad = [
        ({"compression": Custom}, "compression"), ({"compression": "fp16"}, "compression"),
        ({"process_set": hvd_tf.ProcessSet([0])}, "global process set"),
        ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
        ({"backward_passes_per_step": 1.5}, "backward_passes_per_step"),
        ({"average_aggregated_gradients": 1}, "average_aggregated_gradients"),
        ({"sparse_as_dense": "yes"}, "sparse_as_dense"), ({"op": "sum"}, "op"),
        ({"gradient_predivide_factor": 0}, "gradient_predivide_factor"), ({"name": "bad name!"}, "name"),
        ({"groups": -1}, "groups"), ({"num_groups": -2}, "num_groups"),
    ]
    for kw, needle in bad:
        with pytest.raises(ValueError, match=needle):
            algorithms.create(mode, **kw)


def test_allreduce_hands_every_kwarg_to_horovod_unchanged(monkeypatch):
    calls = []

    class FakeHorovodOptimizer:  # what hvd.DistributedOptimizer returns; hetsync adds its idle-step scaling and
        def _allreduce(self, grads, variables):  # the allreduce of a custom loop's gradients
            return grads

        def apply_gradients(self, grads_and_vars):
            return None

    made = FakeHorovodOptimizer()

    def fake(optimizer, **kw):
        calls.append((optimizer, kw))
        return made

    monkeypatch.setattr(hvd_keras, "DistributedOptimizer", fake)
    opt = tf.keras.optimizers.SGD(0.1)
    assert algorithms.create("allreduce", **NON_DEFAULT).wrap(opt) is made
    assert calls[-1][0] is opt and calls[-1][1] == NON_DEFAULT
    algorithms.create("allreduce").wrap(opt)
    assert calls[-1][1] == {}  # unset ones keep Horovod's defaults
    algo, caught = create("allreduce", compression=type("MyCompressor", (hvd_keras.Compression.none,), {}))
    assert caught == []  # allreduce leaves validation to Horovod, which accepts custom compressors


# -- the warning ----------------------------------------------------------------------------------------------------
def test_ignored_kwargs_warn_once_on_rank0_naming_them(monkeypatch):
    algo, caught = create("ripples-static", op=hvd_tf.Adasum, device_dense="/gpu:0", node_size=2)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "op=Adasum" in text and "device_dense='/gpu:0'" in text and "sync='ripples-static'" in text, text
    assert "P-Reduce" in text and "not gradients" in text, text
    assert caught[0].filename == __file__  # points at the caller's line, not into hetsync
    assert algo.options["node_size"] == 2
    # the optimizer is wrapped without a second warning
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        algo = recorder(op=hvd_tf.Sum)
        algo.wrap(tf.keras.optimizers.SGD(0.1))
    assert ours(again) == []
    # Horovod initialised: rank 0 warns, other ranks do not
    monkeypatch.setattr(hvd_tf, "is_initialized", lambda: True)
    monkeypatch.setattr(hvd_tf, "rank", lambda: 1)
    assert create("ripples-static", op=hvd_tf.Sum)[1] == []
    monkeypatch.setattr(hvd_tf, "rank", lambda: 0)
    assert len(create("ripples-static", op=hvd_tf.Sum)[1]) == 1


def test_support_table_per_mode():
    table = hk.support_table()
    assert sorted(table) == algorithms.available_modes()
    assert set(table["allreduce"]["applied"]) == set(hk.NAMES) and table["allreduce"]["ignored"] == {}
    for mode in DECENTRALIZED:
        applied = set(algorithms._REGISTRY[mode].HOROVOD_APPLIED)
        assert set(hk.APPLIED) <= applied and set(table[mode]["applied"]) == applied
        assert set(table[mode]["ignored"]) == set(hk.NAMES) - applied
        assert all(mode in why for why in table[mode]["ignored"].values())
    md = hk.markdown_table()
    assert all(f"`{k}`" in md for k in hk.NAMES) and all(f"`{m}`" in md for m in table)


def test_compression_is_recorded_on_the_algorithm():
    assert create("ripples-static", compression=hvd_keras.Compression.fp16)[0].compression \
        is hvd_keras.Compression.fp16
    assert create("ripples-smart")[0].compression is hvd_keras.Compression.none
    algo = recorder(compression=hvd_keras.Compression.fp16)
    plain = tf.keras.optimizers.SGD(0.1)
    opt = algo.wrap(plain)
    assert marks.algorithm_of(opt).compression is hvd_keras.Compression.fp16
    # the record is of the optimizer hetsync built, not of the user's (or of anything else), and wrapping an
    # optimizer hetsync built again is refused, naming why
    assert marks.algorithm_of(plain) is None and not marks.is_hetsync(plain) and marks.is_hetsync(opt)
    assert marks.algorithm_of(None) is None and marks.family_of("sgd") is None
    with pytest.raises(ValueError, match="already a hetsync.DistributedOptimizer"):
        recorder().wrap(opt)


# -- backward_passes_per_step in the wrapper ------------------------------------------------------------------------
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("average", [False, True], ids=["sum", "mean"])
@pytest.mark.parametrize("make", [tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD], ids=["keras", "legacy"])
def test_backward_passes_accumulate_then_update_and_sync_once(compiled, average, make):
    algo = recorder(backward_passes_per_step=2, average_aggregated_gradients=average)
    opt = algo.wrap(make(1.0))
    w = tf.Variable(np.array([1.0, -2.0, 0.5], np.float32))
    b = tf.Variable(np.float32(3.0))

    def step(gw, gb):
        applied = opt.apply_gradients([(gw, w), (gb, b)])
        if isinstance(applied, tf.Operation):  # a legacy optimizer's own kind in a graph (a LossScaleOptimizer
            assert make is tf.keras.optimizers.legacy.SGD  # needs it): an operation, the new ones a tensor
            with tf.control_dependencies([applied]):
                return tf.identity(opt.iterations)
        return applied

    if compiled:
        step = tf.function(step)
    rng = np.random.default_rng(0)
    gws, gbs = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=6).astype(np.float32)
    want_w, want_b = w.numpy().copy(), b.numpy().copy()
    for i in range(6):
        result = step(tf.constant(gws[i]), tf.constant(gbs[i]))
        if i % 2 == 1:  # every second pass: one update with the sum (or mean) of the two gradients
            scale = 0.5 if average else 1.0
            want_w = want_w - scale * (gws[i - 1] + gws[i])
            want_b = want_b - scale * (gbs[i - 1] + gbs[i])
        np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-6, atol=1e-6, err_msg=f"pass {i + 1}")
        np.testing.assert_allclose(b.numpy(), want_b, rtol=1e-6, atol=1e-6, err_msg=f"pass {i + 1}")
        updates = (i + 1) // 2
        assert int(opt.iterations.numpy()) == updates, f"pass {i + 1}"
        assert int(algo.calls.numpy()) == updates, f"pass {i + 1}"
        assert int(result.numpy()) == updates
        if updates:
            assert int(algo.seen_iterations.numpy()) == updates  # the sync sees the incremented counter
    # the accumulators are not optimizer variables (checkpoints unchanged), and slots keep their usual names
    names = [v.name for v in (opt.variables() if callable(opt.variables) else opt.variables)]
    assert not any("hetsync" in n or "cond" in n for n in names), names


def test_backward_passes_in_keras_fit_against_numpy():
    """Compiled Keras train step, linear model and mse: the update is lr x (sum of the batch gradients) / 2."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.layers.Input((3,)), tf.keras.layers.Dense(1)])
    algo = recorder(backward_passes_per_step=2, average_aggregated_gradients=True)
    model.compile(optimizer=algo.wrap(tf.keras.optimizers.SGD(0.1)), loss="mse")
    w0, b0 = [a.copy() for a in model.get_weights()]

    def grads(xb, yb, w, b):  # d/dw mean((xw + b - y)^2)
        err = xb @ w + b - yb
        return 2 * xb.T @ err / len(xb), 2 * err.sum(axis=0) / len(xb)

    model.fit(x[:8], y[:8], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 2 passes -> 1 update
    g1, g2 = grads(x[:4], y[:4], w0, b0), grads(x[4:8], y[4:8], w0, b0)  # both at w0: pass 1 changed nothing
    w1, b1 = w0 - 0.1 * (g1[0] + g2[0]) / 2, b0 - 0.1 * (g1[1] + g2[1]) / 2
    np.testing.assert_allclose(model.get_weights()[0], w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.get_weights()[1], b1, rtol=1e-5, atol=1e-6)
    assert int(model.optimizer.iterations.numpy()) == 1 and int(algo.calls.numpy()) == 1
    after_first = [a.copy() for a in model.get_weights()]
    model.fit(x[8:12], y[8:12], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 1 pass: pending, no update
    assert int(model.optimizer.iterations.numpy()) == 1 and int(algo.calls.numpy()) == 1
    for a, b in zip(model.get_weights(), after_first):
        np.testing.assert_array_equal(a, b)
    before = [a.copy() for a in model.get_weights()]
    model.fit(x[12:], y[12:], batch_size=4, epochs=1, shuffle=False, verbose=0)  # completes the pending pair
    assert int(model.optimizer.iterations.numpy()) == 2 and int(algo.calls.numpy()) == 2
    g3, g4 = grads(x[8:12], y[8:12], *before), grads(x[12:], y[12:], *before)
    np.testing.assert_allclose(model.get_weights()[0], before[0] - 0.1 * (g3[0] + g4[0]) / 2, rtol=1e-5,
                               atol=1e-6)


class RecordingSGD(tf.keras.optimizers.SGD):
    """Records the gradient types the wrapped optimizer's own apply_gradients receives."""

    seen = []

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        RecordingSGD.seen.append([type(g).__name__ for g, _ in grads_and_vars])
        return super().apply_gradients(grads_and_vars, *args, **kwargs)


def embedding_model():
    tf.keras.utils.set_random_seed(5)
    return tf.keras.Sequential([tf.keras.layers.Input((4,), dtype="int32"), tf.keras.layers.Embedding(20, 3),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(1)])


def test_sparse_as_dense_makes_embedding_gradients_dense():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 20, size=(8, 4)).astype(np.int32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    results = {}
    for dense in (False, True):
        RecordingSGD.seen = []
        model = embedding_model()
        model.compile(optimizer=recorder(sparse_as_dense=dense).wrap(RecordingSGD(0.1)), loss="mse")
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        kinds = {k for call in RecordingSGD.seen for k in call}
        assert ("IndexedSlices" in kinds) is not dense, kinds
        results[dense] = model.get_weights()
    for a, b in zip(*results.values()):  # same update either way
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # with accumulation, sparse gradients are summed into dense accumulators (Horovod refuses them there)
    accumulated = {}
    for dense in (False, True):
        model = embedding_model()
        model.compile(optimizer=recorder(sparse_as_dense=dense, backward_passes_per_step=2).wrap(
            tf.keras.optimizers.SGD(0.1)), loss="mse")
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 2
        accumulated[dense] = model.get_weights()
    for a, b in zip(*accumulated.values()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_name_scopes_the_wrapper_ops():
    for name, prefix in (("my_sync", "my_sync/"), (None, "DistributedSGD/")):
        algo = recorder(name=name) if name else recorder()
        opt = algo.wrap(tf.keras.optimizers.SGD(0.1))
        w = tf.Variable([1.0, 2.0])
        graph = tf.function(lambda g: opt.apply_gradients([(g, w)])).get_concrete_function(
            tf.TensorSpec([2], tf.float32)).graph
        assert any(op.name.startswith(prefix) for op in graph.get_operations()), prefix


# -- real ripples modes, 2 ranks ------------------------------------------------------------------------------------
def test_horovod_kwargs_and_compatibility_under_mpi():
    """ripples-static syncs every second pass with backward_passes_per_step=2, warns on rank 0 only;
    ripples-random trains with accumulation and sparse_as_dense; the compatibility matrix's multi-rank cells
    (steps_per_execution, SyncBatchNormalization, DistributedGradientTape: tests/mpi/kwargs_ripples.py)."""
    proc = run_mpi(2, "tests/mpi/kwargs_ripples.py", timeout=180)
    assert_ok(proc, 2)
