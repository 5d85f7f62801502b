"""The compatibility table: one :class:`Row` per Horovod keyword, callback or feature, one :class:`Cell` per mode
(hetsync/compat/__init__.py says what a cell means)."""
import collections

from hetsync import algorithms

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
    "bare_loops": "tests/test_training_layer.py::"
                  "test_a_bare_custom_loop_trains_in_the_lockstep_modes_and_is_refused_in_every_other",
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
             "does not apply it: one warning on rank 0 names it"
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
                  **{"od-sgd": warned(_OD_WARMUP, "kw_accept")},
                  balanced=balanced or warned(_IGNORED, "kw_accept"),
                  wrapped=warned(_IGNORED, "kw_warn" if name in ("op", "device_dense") else "kw_accept"),
                  auto=untested(_AUTO_KW))


ROWS = [
    # -- Horovod DistributedOptimizer keyword arguments (horovod_kwargs.NAMES, in Horovod's order) -----------------
    _kwarg("name", allreduce=ok("handed to Horovod unchanged", "kw_pass"),
           **{"od-sgd": warned(_OD_WARMUP, "kw_accept")},
           balanced=untested("the name scope of its ops"),
           wrapped=ok("the name scope of the ops the wrapper adds", "kw_name"), auto=untested(_AUTO_KW)),
    _ignored_kwarg("device_dense"),
    _ignored_kwarg("device_sparse"),
    _kwarg("compression", allreduce=ok("handed to Horovod unchanged (any compressor)", "kw_pass"),
           **{"od-sgd": warned(_OD_WARMUP + " (it sends float32)", "kw_accept"),
              "ripples-static": ok("none or fp16 (what P-Reduce sends); any other compressor: ValueError",
                                   "mpi_compat")},
           balanced=ok("none or fp16 (what its gradient allreduce sends); any other compressor: ValueError",
                       "balanced"),
           wrapped=untested("none or fp16 (what the exchange sends) are applied; any other compressor is refused "
                            f"(ValueError, {T['kw_bad']}); fp16 is not trained with in a test of this mode"),
           auto=untested(_AUTO_KW)),
    _kwarg("sparse_as_dense", allreduce=ok("handed to Horovod unchanged", "kw_pass"),
           **{"od-sgd": untested("Horovod's in the warm-up; after it OD-SGD's gradients are made dense anyway")},
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
        {"*": ok("the root's model and optimizer state on every rank before the first step (paired by position: a "
                 "loaded optimizer's variable names differ), so no mode averages a checkpoint with fresh weights; "
                 "the callback's own first-batch broadcast then has nothing left to do (a model built only by its "
                 "first step: the callback broadcasts at the first batch's end, while peers may be in an exchange, "
                 "without deadlock); on some ranks only: a ValueError on every rank", "matrix"), "auto": ok("as in the modes it switches between", "dropin")}),
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
    Row("bare custom loops", "feature", "Horovod's TF2 loop over the dataset itself, without `hetsync.job_steps`",
        {"*": refused("ValueError on every rank at the loop's first step (traced or eager), naming hetsync.job_steps: "
                      "only job_steps tells hetsync where a rank's loop ends", "bare_loops"),
         "allreduce": ok("as Horovod's optimizer: each step's gradients allreduced in apply_gradients, every rank "
                         "the same model after every step; every rank must run the same steps, as in Horovod",
                         "bare_loops"),
         "od-sgd": ok("lockstep, as allreduce (its warm-up is Horovod's allreduce in apply_gradients)",
                      "bare_loops"),
         "balanced": refused("ValueError at the first step: it needs Model.fit", "bare_loops"),
         "auto": refused("ValueError at the first step: auto switches inside Model.fit only", "bare_loops")}),
    Row("DistributedGradientTape", "feature", "`hvd.DistributedGradientTape(tape)` in a `hetsync.job_steps` loop",
        {"*": refused("ValueError at the optimizer's apply_gradients when the step is traced (tf.function, as in "
                      "Horovod's TF2 example; an eager loop is not checked): it allreduces every step's gradients "
                      "over all ranks, which ranks stepping at their own pace never pair; use a plain tf.GradientTape",
                      "mpi_compat"),
         "allreduce": warned("the optimizer takes the tape's allreduce for its own, but the tape counts the "
                             "gradients of ranks only stepping along (hetsync weights them 0): one warning; use a "
                             "plain tf.GradientTape", "mpi_compat"),
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
                      "Horovod 0.28, wraps tf.keras 2 optimizers and runs Model.fit)", "refusals")}),
]


def modes():
    """The matrix's columns: every registered mode, then ``auto``."""
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
