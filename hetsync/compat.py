"""What works with what: Horovod's keyword arguments, callbacks and features against every sync mode.

:data:`ROWS` is the one declared table (docs/compatibility.md is generated from it: ``python -m hetsync.compat``, or
``python -m hetsync.docs`` with the other references; tests/test_compat.py fails when the page is stale or a cell
names a test that does not exist).  A cell is:

* ``✓``: supported, and the test that shows it is named;
* ``warned``: accepted, with a warning saying what does not apply;
* ``refused``: a clear error at ``DistributedOptimizer``, ``fit``, ``hetsync.init`` or ``job_steps`` time;
* ``untested``: expected to work (the note says why) but no test here shows it.

The checks behind the "refused" and "warned" cells live here too (:func:`fit_problem`, :func:`call_problem`,
:func:`runtime_problem`, :func:`guard_gradient_tape`, ...), called from the places that refuse.
"""
import argparse
import collections
import os
import sys
import warnings

OK, WARNED, REFUSED, UNTESTED = "✓", "warned", "refused", "untested"
STATUSES = (OK, WARNED, REFUSED, UNTESTED)

Cell = collections.namedtuple("Cell", "status note test")
Row = collections.namedtuple("Row", "name kind doc cells")

# The modes that wrap the user's optimizer with _wrap.wrap_post_update (parameter averaging or gradient exchange of
# their own; Horovod's kwargs resolved by horovod_kwargs.resolve).  tests/test_compat.py checks that these and the
# modes named on their own below are every registered mode.
WRAPPED = ("eager-majority", "eager-solo", "esync", "hop", "ripples-random", "ripples-smart", "ripples-static")
OWN_PACE = ("balanced", *WRAPPED)  # ranks take different numbers of train steps (STEPPING "own" or "rounds")
GROUPS = {"wrapped": WRAPPED, "own-pace": OWN_PACE}

# Tests the cells name (tests/test_compat.py checks each exists).
T = {
    "kw_pass": "tests/test_horovod_kwargs.py::test_allreduce_hands_every_kwarg_to_horovod_unchanged",
    "kw_accept": "tests/test_horovod_kwargs.py::test_every_mode_accepts_every_horovod_kwarg",
    "kw_warn": "tests/test_horovod_kwargs.py::test_ignored_kwargs_warn_once_on_rank0_naming_them",
    "kw_bad": "tests/test_horovod_kwargs.py::test_bad_values_are_value_errors_naming_the_kwarg",
    "kw_passes": "tests/test_horovod_kwargs.py::test_backward_passes_accumulate_then_update_and_sync_once",
    "kw_sparse": "tests/test_horovod_kwargs.py::test_sparse_as_dense_makes_embedding_gradients_dense",
    "kw_name": "tests/test_horovod_kwargs.py::test_name_scopes_the_wrapper_ops",
    "mpi_compat": "tests/test_horovod_kwargs.py::test_horovod_kwargs_and_compatibility_under_mpi",
    "switch_conservation": "tests/test_switching.py::"
                           "test_switches_lose_no_gradient_and_a_switch_failing_on_one_rank_is_refused_everywhere",
    "balanced": "tests/test_balanced.py::test_balanced_job_replays_union_batch_sgd_follows_speed_and_reports_shares",
    "balanced_bad": "tests/test_balanced.py::test_bad_options_name_what_is_wrong",
    "od_sgd": "tests/test_keras_modes.py::test_od_sgd_warmup_is_horovod_replays_numpy_overlaps_and_names_a_dead_rank",
    "matrix": "tests/test_training_layer.py::test_real_models_and_optimizers_in_every_mode",
    "dropin": "tests/test_dropin.py::test_horovod_example_with_a_slow_rank_and_user_collectives",
    "loops": "tests/test_training_layer.py::"
             "test_horovod_tf2_loop_in_every_mode_with_a_slow_rank_uneven_shards_and_stops",
    "auto": "tests/test_switching.py::test_auto_follows_a_straggler_and_back_and_the_report_shows_it",
    "refusals": "tests/test_compat.py::test_refusals_name_what_is_not_supported",
}


def ok(note, test):
    return Cell(OK, note, T[test])


def warned(note, test=None):
    return Cell(WARNED, note, T[test] if test else None)


def refused(note, test=None):
    return Cell(REFUSED, note, T[test] if test else None)


def untested(note):
    return Cell(UNTESTED, note, None)


_OD_WARMUP = "handed to Horovod's DistributedOptimizer, which runs OD-SGD's warm-up; OD-SGD's own allreduce after it " \
             "does not apply it"
_AUTO_KW = "handed to every candidate mode (default: allreduce, esync, eager-solo), as in those columns"
_IGNORED = "accepted; one warning on rank 0 naming it and why it has no meaning for the mode (none at Horovod's " \
           "default)"
_PROCESS_SET = refused("only the global process set: ValueError \"process_set=... is not supported ...: only the "
                       "global process set\" (hetsync's sync points, job epochs and consensus average all ranks)",
                       "refusals")


def _kwarg(name, **cells):
    return Row(name, "kwarg", f"`hvd.DistributedOptimizer(..., {name}=...)`", cells)


def _ignored_kwarg(name, balanced=None):
    """A kwarg Horovod applies to its gradient allreduce: handed over by allreduce, ignored with a warning by the
    modes that exchange no Horovod gradients."""
    return _kwarg(name, allreduce=ok("handed to Horovod unchanged", "kw_pass"),
                  **{"od-sgd": untested(_OD_WARMUP)},
                  balanced=balanced or warned(_IGNORED, "kw_accept"),
                  wrapped=warned(_IGNORED, "kw_warn" if name in ("op", "device_dense") else "kw_accept"),
                  auto=untested(_AUTO_KW))


ROWS = [
    # -- Horovod DistributedOptimizer keyword arguments (horovod_kwargs.NAMES, in Horovod's order) -----------------
    _kwarg("name", allreduce=ok("handed to Horovod unchanged", "kw_pass"), **{"od-sgd": untested(_OD_WARMUP)},
           balanced=untested("the name scope of its ops"),
           wrapped=ok("the name scope of the ops the wrapper adds", "kw_name"), auto=untested(_AUTO_KW)),
    _ignored_kwarg("device_dense"),
    _ignored_kwarg("device_sparse"),
    _kwarg("compression", allreduce=ok("handed to Horovod unchanged (any compressor)", "kw_pass"),
           **{"od-sgd": untested(_OD_WARMUP + " (it sends float32)"),
              "ripples-static": ok("none or fp16 (what P-Reduce sends); any other compressor: ValueError",
                                   "mpi_compat")},
           balanced=ok("none or fp16 (what its gradient allreduce sends); any other compressor: ValueError",
                       "balanced"),
           wrapped=untested("none or fp16 (what the exchange sends) are applied; any other compressor is refused "
                            f"(ValueError, {T['kw_bad']}); fp16 is not trained with in a test of this mode"),
           auto=untested(_AUTO_KW)),
    _kwarg("sparse_as_dense", allreduce=ok("handed to Horovod unchanged", "kw_pass"),
           **{"od-sgd": untested(_OD_WARMUP)},
           balanced=untested("its gradient sums are dense anyway"),
           wrapped=ok("IndexedSlices gradients made dense before the local update (the shared wrapper); "
                      "ripples-random also under MPI in " + T["mpi_compat"], "kw_sparse"),
           auto=untested(_AUTO_KW)),
    _ignored_kwarg("gradient_predivide_factor"),
    _ignored_kwarg("op", balanced=ok("Average or Sum (the union gradient times the workers); Adasum, Min, Max, "
                                     "Product: ValueError (" + T["balanced_bad"] + ")", "balanced")),
    _kwarg("backward_passes_per_step", allreduce=ok("handed to Horovod unchanged", "switch_conservation"),
           **{"od-sgd": ok("Horovod's in the warm-up, OD-SGD's own after it", "od_sgd"),
              "ripples-static": ok("N passes accumulate, then one update and one sync", "mpi_compat"),
              "esync": ok("N passes accumulate, then one update (the shared wrapper)", "kw_passes")},
           balanced=ok("the global batch is N x Horovod's", "balanced"),
           wrapped=ok("N passes accumulate, then one update and one sync; no gradient lost across live switches",
                      "switch_conservation"),
           auto=untested(_AUTO_KW)),
    _kwarg("average_aggregated_gradients", allreduce=ok("handed to Horovod unchanged", "kw_pass"),
           **{"od-sgd": ok("Horovod's in the warm-up, OD-SGD's own after it", "od_sgd"),
              "ripples-static": ok("the accumulated gradient is divided by N", "mpi_compat")},
           balanced=untested("the union gradient is divided by N"),
           wrapped=ok("the accumulated gradient is divided by N (the shared wrapper)", "kw_passes"),
           auto=untested(_AUTO_KW)),
    _ignored_kwarg("num_groups"),
    _ignored_kwarg("groups"),
    _kwarg("process_set", **{"*": _PROCESS_SET}),
    _ignored_kwarg("scale_local_gradients"),
    # -- Horovod's Keras callbacks --------------------------------------------------------------------------------
    Row("BroadcastGlobalVariablesCallback", "callback", "`hvd.callbacks.BroadcastGlobalVariablesCallback(0)`",
        {"*": ok("rank 0's weights at the first batch; it may run while peers are in an exchange (no deadlock)",
                 "matrix"), "auto": ok("as in the modes it switches between", "dropin")}),
    Row("MetricAverageCallback", "callback", "`hvd.callbacks.MetricAverageCallback()`",
        {"*": ok("averages the epoch's metrics at the epoch end (a point every rank reaches)", "matrix"),
         "auto": ok("as in the modes it switches between", "dropin")}),
    Row("LearningRateWarmupCallback", "callback", "`hvd.callbacks.LearningRateWarmupCallback(...)`",
        {"*": ok("each rank's learning rate follows its own steps; carried over at live switches", "dropin")}),
    Row("LearningRateScheduleCallback", "callback", "`hvd.callbacks.LearningRateScheduleCallback(...)`",
        {"*": ok("each rank's learning rate follows its own epochs and steps (momentum_correction=True fails on a "
                 "new Keras optimizer with momentum in Horovod 0.28 itself: pass momentum_correction=False there)",
                 "matrix"),
         "auto": untested("the learning rate variable is carried over at live switches (LearningRateWarmupCallback "
                          "is tested with auto)")}),
    # -- features -------------------------------------------------------------------------------------------------
    Row("steps_per_execution > 1", "feature", "`model.compile(..., steps_per_execution=N)` (or \"auto\")",
        {"*": refused("ValueError at fit: \"steps_per_execution=N is not supported by sync=...\" (hetsync's exchange, "
                      "sync points and job epochs run around every Keras step)", "mpi_compat"),
         "allreduce": ok("Horovod's; with the same steps_per_epoch on every rank (uneven ones: ValueError at fit)",
                         "mpi_compat"),
         "auto": refused("ValueError at fit, naming the first candidate that refuses it", "refusals")}),
    Row("Elastic Horovod", "feature", "`horovodrun --min-np/--host-discovery-script`, `hvd.elastic.run`",
        {"*": refused("RuntimeError at hetsync.init() (HOROVOD_ELASTIC=1): hetsync's engine and coordinator are "
                      "sized for a fixed set of ranks", "refusals")}),
    Row("hvd.load_model", "feature", "`hvd.load_model(path)`",
        {"*": warned("it returns a model with Horovod's own DistributedOptimizer (plain allreduce, whatever mode the "
                     "model was trained in): its fit warns once on rank 0 that hetsync is not in it; load with "
                     "tf.keras.models.load_model(path, compile=False) and compile with hetsync.DistributedOptimizer",
                     "refusals")}),
    Row("custom loops", "feature", "`hetsync.job_steps(...)` with a plain `tf.GradientTape`",
        {"*": ok("Horovod's TF2 example step, a slow rank, uneven shards and per-rank stops", "loops"),
         "balanced": refused("ValueError at job_steps: it needs Model.fit (it cuts each batch into shares)",
                             "loops"),
         "auto": refused("ValueError at job_steps: auto switches inside Model.fit only", "refusals")}),
    Row("DistributedGradientTape", "feature", "`hvd.DistributedGradientTape(tape)` in a `hetsync.job_steps` loop",
        {"*": refused("ValueError when the tape's gradient is traced: it allreduces every step's gradients over all "
                      "ranks, which ranks stepping at their own pace never pair; use a plain tf.GradientTape",
                      "mpi_compat"),
         "allreduce": warned("gradients would be allreduced twice (the tape, then the optimizer): one warning; use "
                             "a plain tf.GradientTape", "mpi_compat"),
         "od-sgd": warned("as allreduce: the tape's allreduce comes on top of OD-SGD's; one warning", "refusals"),
         "balanced": refused("job_steps refuses sync='balanced' before any tape (it needs Model.fit)", "loops"),
         "auto": refused("job_steps refuses sync='auto' before any tape", "refusals")}),
    Row("SyncBatchNormalization", "feature", "`hvd.SyncBatchNormalization` layers in the model",
        {"own-pace": refused("ValueError at fit: its per-step allreduce of batch statistics cannot pair when ranks "
                             "take different numbers of steps; use tf.keras.layers.BatchNormalization", "mpi_compat"),
         "allreduce": ok("Horovod's own", "mpi_compat"),
         "od-sgd": untested("ranks step in lockstep, so its allreduces pair"),
         "auto": refused("ValueError at fit when a candidate steps at its own pace (the default ones do)",
                         "refusals")}),
    Row("LossScaleOptimizer", "feature", "mixed precision: `tf.keras.mixed_precision.LossScaleOptimizer(opt)`",
        {"*": ok("subclassed model under mixed_float16", "matrix"),
         "auto": untested("as in the modes it switches between")}),
    Row("process sets", "feature", "`hvd.add_process_set`, `hvd.init(process_sets=...)`",
        {"*": untested("hetsync's own collectives always span every rank; a user's collectives on a process set are "
                       "not exercised here; the process_set= keyword is refused (row above)")}),
    Row("Gloo controller", "feature", "`horovodrun --gloo`",
        {"*": refused("RuntimeError at hetsync.init(): \"hetsync needs Horovod running on MPI\" (its engine shares "
                      "the MPI job)", "refusals")}),
    Row("GPU / NCCL", "feature", "GPU training, Horovod built with NCCL",
        {"*": untested("hetsync's engine reduces host-memory tensors over MPI (no NCCL backend, docs/engine.md): GPU "
                       "variables are copied to the host at each exchange; no GPU in this project's tests"),
         "allreduce": untested("Horovod's own gradient allreduce (NCCL when built with it); hetsync's sync points "
                               "average on the host; no GPU in this project's tests")}),
    Row("Keras 3", "feature", "TensorFlow >= 2.16 with Keras 3 as `tf.keras`",
        {"*": refused("ValueError at hetsync.DistributedOptimizer: \"Keras 3 ... is not supported\" (hetsync, like "
                      "Horovod 0.28, wraps tf.keras 2 optimizers and Model.fit)", "refusals")}),
]


def modes():
    """The matrix's columns: every registered mode, then ``auto``."""
    from hetsync import algorithms

    return [*algorithms.available_modes(), "auto"]


def cell(row, mode):
    """The cell of ``row`` for ``mode``: its own entry, else its group's (WRAPPED, OWN_PACE), else ``"*"``."""
    if mode in row.cells:
        return row.cells[mode]
    for group, members in GROUPS.items():
        if mode in members and group in row.cells:
            return row.cells[group]
    if "*" in row.cells:
        return row.cells["*"]
    raise KeyError(f"compatibility row {row.name!r} has no cell for sync={mode!r}")


# -- the checks behind the refused and warned cells ----------------------------------------------------------------
def keras_version():
    """The version of the Keras ``tf.keras`` is."""
    import tensorflow as tf

    version = getattr(tf.keras, "__version__", None)
    if version is None:
        try:
            import keras

            version = keras.__version__ if tf.keras.__name__.startswith("keras") else "2"
        except ImportError:
            version = "2"
    return str(version)


def keras_problem(version=None):
    version = keras_version() if version is None else str(version)
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    if major >= 3:
        return (f"Keras {version} (Keras 3) is not supported: hetsync, like Horovod 0.28, wraps tf.keras 2 optimizers "
                "and Model.fit; use TensorFlow <= 2.15, or tf-keras with TF_USE_LEGACY_KERAS=1")
    return None


def runtime_problem(environ=None):
    """Elastic Horovod, refused at ``hetsync.init()`` (Horovod's elastic launcher sets HOROVOD_ELASTIC=1)."""
    environ = os.environ if environ is None else environ
    if str(environ.get("HOROVOD_ELASTIC", "0")).strip() not in ("", "0"):
        return ("Elastic Horovod (HOROVOD_ELASTIC=1: horovodrun --min-np/--host-discovery-script, hvd.elastic.run) "
                "is not supported: hetsync's engine, Job Clock and coordinator services are sized for a fixed set "
                "of ranks; launch with a fixed -np")
    return None


def call_problem(sync, hvd_kwargs):
    """``hetsync.DistributedOptimizer``'s own refusals (every mode): Keras 3, a process set other than the global
    one.  A string, or None."""
    problem = keras_problem()
    if problem:
        return problem
    process_set = hvd_kwargs.get("process_set")
    if process_set is not None and getattr(process_set, "process_set_id", None) != 0:
        return (f"process_set={process_set!r} is not supported by sync={sync!r}: hetsync's sync points, job epochs "
                "and consensus average all ranks of the job, so only the global process set "
                "(hvd.global_process_set, the default) is valid")
    return None


def steps_per_execution(model):
    """Keras' steps_per_execution of a compiled model: an int, or -1 for "auto"."""
    if getattr(model, "_autotune_steps_per_execution", False):
        return -1
    variable = getattr(model, "_steps_per_execution", None)
    return int(variable.numpy()) if variable is not None else 1


def _sync_batch_norms(model):
    try:
        from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
    except ImportError:  # pragma: no cover
        return []
    return [m for m in getattr(model, "submodules", ()) if isinstance(m, SyncBatchNormalization)]


def fit_modes(family, algorithm, user_callbacks):
    """The modes a fit may train in: the one in force, sync="auto"'s candidates, a SyncMode schedule's."""
    found = [family.current[0] if family is not None and family.current else algorithm.name]
    if family is not None and family.auto:
        found += [mode for mode, _ in family.auto["candidates"].values()]
    for cb in user_callbacks:
        if getattr(cb, "hetsync_switches", False):
            found += [mode for mode, _ in (getattr(cb, "schedule", None) or {}).values()]
    return list(dict.fromkeys(found))


def fit_problem(model, modes_used, auto=False):
    """This rank's reason to refuse a fit of ``model`` that may train in ``modes_used`` (a string), or None."""
    from hetsync import algorithms

    algorithms._load_all()
    where = "sync='auto' (its candidate {mode!r})" if auto else "sync={mode!r}"
    spe = steps_per_execution(model)
    if spe != 1:
        for mode in modes_used:
            if mode != "allreduce":
                shown = '"auto"' if spe < 0 else spe
                return (f"steps_per_execution={shown} is not supported by {where.format(mode=mode)}: hetsync runs its "
                        "exchange, sync points and job epochs around every Keras step, and Keras would run several "
                        "train steps per call; compile with steps_per_execution=1 (the default), or use "
                        "sync='allreduce'")
    layers = _sync_batch_norms(model)
    if layers:
        for mode in modes_used:
            cls = algorithms._REGISTRY.get(mode)
            if cls is not None and cls.STEPPING != "lockstep":
                return (f"hvd.SyncBatchNormalization (layer {layers[0].name!r}) is not supported by "
                        f"{where.format(mode=mode)}: it allreduces batch statistics over all ranks in every train "
                        "step, and ranks that take different numbers of steps never pair them (a hang); use "
                        "tf.keras.layers.BatchNormalization (hetsync averages its moving statistics at every sync "
                        "point), or sync='allreduce'")
    return None


def switch_problem(model, mode):
    """A live switch's extra check (switching.preflight): the model's features against the new mode."""
    return fit_problem(model, [mode]) if model is not None else None


def loop_problem(optimizer):
    """``hetsync.job_steps``'s refusal of ``optimizer`` (besides a mode's NO_CUSTOM_LOOPS), or None."""
    family = getattr(optimizer, "_hetsync_family", None)
    if family is not None and family.auto:
        return ("sync='auto' is not supported in custom loops (hetsync.job_steps): it switches modes inside "
                "Model.fit only, so the loop would train in its first candidate throughout; pass a fixed mode")
    return None


_TAPE = {"warned": False}


def tape_problem():
    """Inside a ``hetsync.job_steps`` loop, the refusal of ``hvd.DistributedGradientTape`` (a string), or None."""
    from hetsync.training import loop

    steps = loop._LOOP["active"]
    if steps is None:
        return None
    algorithm = steps.algorithm
    if algorithm.HOROVOD_PASSTHROUGH:
        if not _TAPE["warned"]:
            _TAPE["warned"] = True
            from hetsync.algorithms.horovod_kwargs import _is_rank0

            if _is_rank0():
                warnings.warn(f"hvd.DistributedGradientTape in a hetsync.job_steps loop with sync={algorithm.name!r}: "
                              "the gradients are allreduced twice (by the tape, then by the optimizer); use a plain "
                              "tf.GradientTape", UserWarning, stacklevel=4)
        return None
    return (f"hvd.DistributedGradientTape is not supported by sync={algorithm.name!r}: it allreduces every step's "
            "gradients over all ranks, and ranks stepping at their own pace never pair those allreduces (a hang); "
            "the mode exchanges through the optimizer: use a plain tf.GradientTape")


def guard_gradient_tape():
    """Makes ``hvd.DistributedGradientTape(...).gradient`` check :func:`tape_problem` (idempotent).  Horovod copies
    its tape class's methods into each tape it makes, so tapes made from now on are checked."""
    try:
        import horovod.tensorflow as hvd_tf
    except ImportError:  # pragma: no cover
        return
    cls = getattr(hvd_tf, "_DistributedGradientTape", None)
    if cls is None or getattr(cls.__dict__.get("gradient"), "_hetsync_guard", False):
        return
    original = cls.__dict__["gradient"]

    def gradient(self, *args, **kwargs):
        problem = tape_problem()
        if problem:
            raise ValueError(problem)
        return original(self, *args, **kwargs)

    gradient._hetsync_guard = True
    gradient.__doc__ = original.__doc__
    cls.gradient = gradient


_LOADED = {"warned": False}


def horovod_optimizer_warning(model):
    """A fit in a hetsync process of a model whose optimizer is Horovod's own DistributedOptimizer (what
    ``hvd.load_model`` returns): one warning on rank 0, since none of hetsync's modes is in it."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or _LOADED["warned"] or not type(optimizer).__module__.startswith("horovod"):
        return
    if not hasattr(optimizer, "_allreduce"):
        return
    from hetsync import _runtime

    if not _runtime.is_initialized():
        return
    _LOADED["warned"] = True
    from hetsync.algorithms.horovod_kwargs import _is_rank0

    if _is_rank0():
        warnings.warn("this model's optimizer is Horovod's own DistributedOptimizer (hvd.load_model returns one): it "
                      "trains with plain allreduce, not with a hetsync mode; load with "
                      "tf.keras.models.load_model(path, compile=False) and compile with hetsync.DistributedOptimizer",
                      UserWarning, stacklevel=4)


# -- docs/compatibility.md -----------------------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, "docs", "compatibility.md")
HEADER = "> generated by `python -m hetsync.compat` from `hetsync/compat.py`; do not edit (change the table there)."
KINDS = (("kwarg", "Horovod `DistributedOptimizer` keyword arguments"), ("callback", "Horovod Keras callbacks"),
         ("feature", "Features"))


def _text(value):
    return str(value).replace("|", "\\|").replace("\n", " ")


def _groups(row, columns):
    """[(cell, [modes])] in column order, modes with the same cell together."""
    out = []
    for mode in columns:
        c = cell(row, mode)
        for seen, members in out:
            if seen == c:
                members.append(mode)
                break
        else:
            out.append((c, [mode]))
    return out


def render():
    """The text of docs/compatibility.md."""
    columns = modes()
    out = ["# Compatibility", "", HEADER, "",
           "What works with each sync mode: Horovod's `DistributedOptimizer` keyword arguments, its Keras callbacks "
           "and the features a Horovod user may bring.  ✓: supported, and a test shows it (named below); "
           "*warned*: accepted with a warning; *refused*: a clear error when the optimizer is made, at `hetsync.init`, "
           "at `fit` or at `job_steps`, before anything trains; *untested*: expected to work, shown by no test here.",
           "", "## Not supported", ""]
    for row in ROWS:
        bad = [(c, ms) for c, ms in _groups(row, columns) if c.status in (REFUSED, WARNED)]
        if row.kind == "kwarg" and all(c.status == WARNED for c, _ in bad):
            continue  # ignored kwargs: in the table below
        for c, ms in bad:
            who = "every mode" if len(ms) == len(columns) else ", ".join(f"`{m}`" for m in ms)
            out.append(f"- **{row.name}** ({c.status}; {who}): {_text(c.note)}.")
    out += ["- Horovod keyword arguments marked *warned* below are accepted and ignored, with one warning on rank 0.",
            "", "## Matrix", ""]
    out.append("| | " + " | ".join(f"`{m}`" for m in columns) + " |")
    out.append("|---" * (len(columns) + 1) + "|")
    for kind, title in KINDS:
        out.append(f"| **{title}** |" + " |" * len(columns))
        for row in (r for r in ROWS if r.kind == kind):
            name = f"`{row.name}`" if kind == "kwarg" else row.name
            out.append(f"| {name} | " + " | ".join(cell(row, m).status for m in columns) + " |")
    out += ["", "## Cells", ""]
    for kind, title in KINDS:
        out += [f"### {title}", ""]
        for row in (r for r in ROWS if r.kind == kind):
            out.append(f"**{row.name}** ({row.doc}):")
            out.append("")
            for c, ms in _groups(row, columns):
                who = "every mode" if len(ms) == len(columns) else ", ".join(f"`{m}`" for m in ms)
                test = f" Test: `{c.test}`." if c.test else ""
                out.append(f"- {c.status} ({who}): {_text(c.note)}.{test}")
            out.append("")
    return "\n".join(out)


def stale(path=OUTPUT):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() != render()
    except FileNotFoundError:
        return True


def write(path=OUTPUT):
    with open(path, "w", encoding="utf-8") as f:
        f.write(render())
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hetsync.compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUTPUT, help="file to write ('-': standard output; default %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    if args.check:
        if stale(args.out):
            print(f"{args.out} is stale: run python -m hetsync.compat", file=sys.stderr)
            return 1
        return 0
    if args.out == "-":
        sys.stdout.write(render())
        return 0
    print(f"wrote {write(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
