"""The compatibility matrix (hetsync/compat/table.py, docs/compatibility.md) and the public observability API
(hetsync/observe.py), in one process without MPI: the page matches the table, the table covers every mode, kwarg
and named feature and names tests that exist, and each refusal's check names what is not supported.  The refusals
inside real multi-rank fits and loops are in tests/mpi/kwargs_ripples.py."""
import os
import re
import types
import warnings

import horovod.tensorflow as hvd
import pytest
import tensorflow as tf

import hetsync
import hetsync.marks
from hetsync import algorithms, compat
from hetsync.algorithms import horovod_kwargs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES = ["steps_per_execution > 1", "Elastic Horovod", "hvd.load_model", "DistributedGradientTape",
            "SyncBatchNormalization", "LossScaleOptimizer", "process sets", "Gloo controller", "GPU / NCCL", "Keras 3"]
CALLBACKS = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
             "LearningRateScheduleCallback"]


def test_the_page_is_generated_from_the_table():
    assert not compat.stale(), "docs/compatibility.md is stale: run python -m hetsync.compat"


def test_the_table_covers_every_mode_kwarg_callback_and_feature_and_names_real_tests():
    modes = algorithms.available_modes()
    assert set(compat.WRAPPED) | {"allreduce", "od-sgd", "balanced"} == set(modes), "a mode missing from the table"
    assert set(compat.OWN_PACE) == {m for m in modes if algorithms._REGISTRY[m].STEPPING != "lockstep"}
    names = [r.name for r in compat.ROWS]
    assert [r.name for r in compat.ROWS if r.kind == "kwarg"] == list(horovod_kwargs.NAMES)
    assert set(CALLBACKS + FEATURES) <= set(names) and len(names) == len(set(names))
    for row in compat.ROWS:
        for mode in compat.modes():
            cell = compat.cell(row, mode)
            assert cell.status in compat.STATUSES and cell.note, (row.name, mode)
            assert cell.status != compat.OK or cell.test, f"{row.name} / {mode}: ✓ without a test"
            if cell.test:
                path, name = cell.test.split("::")
                with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                    assert re.search(rf"^def {re.escape(name)}\(", f.read(), re.M), cell.test
    # the kwargs a mode ignores (with its warning) are "warned" in the table, never ✓
    support = horovod_kwargs.support_table()
    for mode in compat.WRAPPED:
        for key in support[mode]["ignored"]:
            assert compat.cell(next(r for r in compat.ROWS if r.name == key), mode).status == compat.WARNED


def test_refusals_name_what_is_not_supported(monkeypatch):
    # Keras 3, at hetsync.DistributedOptimizer
    assert compat.keras_problem() is None and "Keras 3" in compat.keras_problem("3.1.0")
    monkeypatch.setattr(compat.checks, "keras_version", lambda: "3.0.5")
    with pytest.raises(ValueError, match="Keras 3.0.5 .Keras 3. is not supported"):
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="hop")
    monkeypatch.undo()
    # a process set, in every mode (allreduce included), at hetsync.DistributedOptimizer
    for mode in ("allreduce", "od-sgd", "hop"):
        with pytest.raises(ValueError, match="only the global process set"):
            hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync=mode, process_set=hvd.ProcessSet([0]))
    # Elastic Horovod and Gloo, at hetsync.init
    from hetsync import _runtime

    assert compat.runtime_problem({}) is None
    fake = types.SimpleNamespace(is_initialized=lambda: True, mpi_enabled=lambda: False,
                                 mpi_threads_supported=lambda: True)
    with pytest.raises(RuntimeError, match="not with the Gloo controller"):
        _runtime._check_horovod(fake)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    with pytest.raises(RuntimeError, match="Elastic Horovod .* is not supported"):
        _runtime._check_horovod(fake)
    monkeypatch.delenv("HOROVOD_ELASTIC")
    # steps_per_execution > 1 and SyncBatchNormalization, at fit (the check every rank runs before the fit's gather)
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse", steps_per_execution=3)
    assert compat.steps_per_execution(model) == 3
    assert compat.fit_problem(model, ["allreduce"]) is None
    for mode in compat.OWN_PACE + ("od-sgd",):
        assert f"steps_per_execution=3 is not supported by sync={mode!r}" in compat.fit_problem(model, [mode])
    assert "sync='auto' (its candidate 'esync')" in compat.fit_problem(model, ["allreduce", "esync"], auto=True)
    model.compile("sgd", "mse", steps_per_execution="auto")
    assert 'steps_per_execution="auto"' in compat.fit_problem(model, ["hop"])
    bn = tf.keras.Sequential([tf.keras.layers.Dense(2), hvd.SyncBatchNormalization(name="sbn")])
    bn.compile("sgd", "mse")
    assert compat.fit_problem(bn, ["allreduce"]) is None and compat.fit_problem(bn, ["od-sgd"]) is None
    for mode in compat.OWN_PACE:
        assert f"layer 'sbn') is not supported by sync={mode!r}" in compat.fit_problem(bn, [mode])
    # sync="auto" in a custom loop; DistributedGradientTape in one
    family = types.SimpleNamespace(auto={"candidates": {}})
    optimizer = tf.keras.optimizers.SGD()
    hetsync.marks.record(optimizer, family=family)
    assert "not supported in custom loops" in compat.loop_problem(optimizer)
    # hvd.DistributedGradientTape in a job_steps loop: an own-pace mode refuses it, a gradient-allreducing mode warns
    # once.  Recognizing the tape's gradients needs Horovod initialized: tests/mpi/kwargs_ripples.py checks it under
    # mpirun (refused, warned), and tests/mpi/custom_loops.py that a plain tape is never taken for it.
    for mode, refused in (("hop", True), ("esync", True), ("allreduce", False), ("od-sgd", False)):
        compat._TAPE["warned"] = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            problem = compat.tape_problem(algorithms.create(mode))
        if refused:
            assert f"DistributedGradientTape is not supported by sync={mode!r}" in problem
        else:
            assert problem is None and "takes the tape's allreduce for its own" in str(caught[0].message)
    # hvd.load_model's optimizer (Horovod's own) in a hetsync process: one warning
    horovod_opt = type("DistributedSGD", (), {"_allreduce": None, "__module__": "horovod._keras"})()
    compat._LOADED["warned"] = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compat.horovod_optimizer_warning(types.SimpleNamespace(optimizer=horovod_opt), False)  # no hetsync here
        compat.horovod_optimizer_warning(types.SimpleNamespace(optimizer=horovod_opt), True)
        compat.horovod_optimizer_warning(types.SimpleNamespace(optimizer=horovod_opt), True)
    assert len(caught) == 1 and "hvd.load_model" in str(caught[0].message)


def test_observability_api_answers_for_the_mode_in_force_and_refuses_anything_else():
    from hetsync.switching import Family

    assert {"metrics", "switch_history", "current_mode"} <= set(hetsync.__all__)
    family = Family(tf.keras.optimizers.SGD(0.1), {})
    opt = family.start("allreduce", {})
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(opt, loss="mse")
    for obj in (opt, model):
        assert hetsync.current_mode(obj) == "allreduce"
        assert hetsync.metrics(obj) == {} and hetsync.switch_history(obj) == []
    family.history.append({"from": "allreduce", "to": "hop", "position": 7, "reason": "test"})
    history = hetsync.switch_history(model)
    history[0]["to"] = "changed"  # a copy: the caller cannot change the family's record
    assert hetsync.switch_history(opt)[0]["to"] == "hop"
    for bad in (tf.keras.optimizers.SGD(0.1), tf.keras.Sequential(), None, "model"):
        for fn in (hetsync.metrics, hetsync.switch_history, hetsync.current_mode):
            with pytest.raises(TypeError, match=rf"hetsync.{fn.__name__}\(\) needs a Keras model compiled with"):
                fn(bad)
