"""``hetsync.keras.fit(model, ...)``: Keras' ``model.fit`` with hetsync's training layer around it.

Nothing global is replaced: the user calls this front door for a model compiled with a hetsync optimizer (plain
``model.fit`` of such a model is refused, training/front_door.py).  It plans the fit's epochs with the other ranks
(one small Horovod allgather: every rank's ``steps_per_epoch`` and whatever else must agree: each collective at the
start is a negotiation with the slowest rank), puts :class:`~hetsync.training.callbacks.SyncPoints` first and
:class:`~hetsync.training.callbacks.StopVote` last in the callback list (before it,
:class:`~hetsync.training.saved_mode.ModeStamp` stamps the user's HDF5 checkpoints with the mode in force), and
hands Keras the same number of Keras steps per epoch on every rank.  Any other model is handed to its own ``fit`` unchanged.

Epochs (README "Job epochs"): with ``steps_per_epoch = N_r`` on rank r (Horovod's convention), every rank runs
``max N_r`` Keras steps per epoch and the epoch is ``sum N_r`` train steps of the job.  In a mode whose ranks step
at their own pace those are shared by speed (training/job_epochs.py); in a synchronous mode, or with
``job_epochs=False``, each rank runs its own ``N_r`` and idle steps to the longest (uneven shards).  With
``steps_per_epoch=None`` and a finite ``tf.data`` dataset, ``N_r`` is its length.  A finite dataset is repeated
(a rank that runs out starts its shard again), since fast ranks take more batches than they hold.
"""
import inspect
import logging
import numbers

import tensorflow as tf

from hetsync import _runtime, compat, marks
from hetsync.algorithms._wrap import build_slots
from hetsync.training import front_door, initial_state, options, rank_state, report, saved_mode
from hetsync.training.callbacks import StopVote, SyncPoints
from hetsync.training.job_epochs import JobEpochs
from hetsync.training.rank_state import RankState
from hetsync.training.saved_mode import ModeStamp

log = logging.getLogger("hetsync.training")
_STATE = {"job": None}


def fit(model, args, kwargs):
    """``model.fit(*args, **kwargs)``, through hetsync's training layer when ``model`` has a hetsync optimizer."""
    algorithm = marks.algorithm_of(getattr(model, "optimizer", None))
    if algorithm is None:
        # hvd.load_model's Horovod optimizer, in a hetsync process
        compat.horovod_optimizer_warning(model, _runtime.is_initialized())
        return model.fit(*args, **kwargs)
    arguments = _prepare(model, args, kwargs, algorithm)
    if model.built:  # the mode's own per-variable state, also before the first trace (SyncAlgorithm.build)
        algorithm.build(model.trainable_variables)
    front_door.entering("fit")
    try:
        return model.fit(**arguments)
    finally:
        front_door.leaving("fit")


def _build_before_trace(model, x):
    """Creates the model's, its optimizer's and its compiled metrics' variables before fit traces its first step.

    Keras 2 creates them inside that first trace, and a ``tf.function`` whose first trace created variables is
    traced again: every rank pays its train step's tracing twice before the first batch.  Keras 3 builds them
    first, from the data's shapes; this does the same for a ``tf.data`` dataset whose shapes are known but for the
    batch, on a batch of zeros in inference mode (no statistic or metric moves).  Anything else (a model already
    trained, its own ``train_step``, a stateful layer, arrays, unknown shapes) is left to Keras as it was."""
    if (model.train_function is not None or not isinstance(x, tf.data.Dataset)
            or type(model).train_step is not tf.keras.Model.train_step
            or any(getattr(layer, "stateful", False) for layer in model.submodules)):
        return
    specs = tf.nest.flatten(x.element_spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank and s.shape[1:].is_fully_defined() for s in specs):
        return
    zeros = tf.nest.pack_sequence_as(x.element_spec, [tf.zeros([1] + s.shape[1:].as_list(), s.dtype) for s in specs])
    inputs, targets, weights = tf.keras.utils.unpack_x_y_sample_weight(zeros)
    try:
        predictions = model(inputs, training=False)
        build_slots(model.optimizer, model.trainable_variables)
        if targets is not None and model.compiled_loss is not None:
            model.compiled_loss(targets, predictions, weights, regularization_losses=model.losses)
            model.compiled_metrics.update_state(targets, predictions, weights)
    except Exception as e:  # noqa: BLE001 -- only a saving: Keras builds what is missing in its first trace
        log.debug("variables left to fit's first trace: %s", e)
    model.reset_metrics()


def job_epochs_client():
    """This process's JobEpochs (one per process: the ranks number their epochs over all fits alike)."""
    services = _runtime.services()
    job = _STATE["job"]
    if job is None or job.client is not services.job_client():
        job = _STATE["job"] = JobEpochs(services.job_client(), _runtime.timeout())
    return job


def _dataset_length(x):
    """Batches in a finite ``tf.data`` dataset (-1 when unknown or not a dataset, -2 when infinite)."""
    if not isinstance(x, tf.data.Dataset):
        return -1
    n = int(x.cardinality().numpy())
    return n if n >= 0 else (-2 if n == tf.data.INFINITE_CARDINALITY else -1)


def _epochs_row(parameters, arguments):
    """This rank's [epochs, initial_epoch] for fit's agreement (-1: not an int, reported after the agreement); a
    value not passed is ``fit``'s default, from its signature's ``parameters``."""
    def whole(name):
        value = arguments.get(name, parameters[name].default)
        return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else -1

    return [whole("epochs"), whole("initial_epoch")]


def _check_epochs(rows):
    """Every rank runs the same epochs: each ends in collectives (the sync point, the stop vote), and a rank that
    left ``fit`` an epoch early would leave the others waiting in them.  Raised on every rank, after the gather."""
    if len({tuple(row) for row in rows}) == 1 and min(rows[0]) >= 0:
        return
    raise ValueError("fit's epochs and initial_epoch must be the same ints on every rank, got (epochs, "
                     f"initial_epoch) {[tuple(row) for row in rows]} by rank (-1: not an int)")


def _prepare(model, args, kwargs, algorithm):
    """fit's arguments as keywords: the epoch plan, the dataset, SyncPoints first and StopVote last."""
    _runtime.require_init("fit with a hetsync optimizer")
    signature = inspect.signature(model.fit)
    arguments = dict(signature.bind(*args, **kwargs).arguments)
    family = marks.family_of(model.optimizer)
    job_epochs = family.job_epochs if family is not None else True
    user = [cb for cb in (arguments.get("callbacks") or []) if not isinstance(cb, (SyncPoints, ModeStamp, StopVote))]
    job = job_epochs_client()
    job.begin_fit()  # before the fit's first collective (job_clock.JobClock.resume)
    x = arguments.get("x")
    own = arguments.get("steps_per_epoch")
    length = _dataset_length(x)
    if own is None and length >= 0:
        own = length
    bad = own is not None and (not isinstance(own, int) or isinstance(own, bool) or own < 1)
    report_ms = report.wanted_ms(user)  # rank 0 alone may have one: every rank feeds it (training/report.py)
    if family is not None:
        family.fit_model = model  # a live switch checks the model's features against the new mode (compat.py)
    refusal = compat.fit_problem(model, compat.fit_modes(family, algorithm, user),
                                 auto=family is not None and bool(family.auto))
    per_execution = compat.steps_per_execution(model)
    broadcast = initial_state.broadcast_callback(user)
    if model.train_function is not None and not hasattr(model.train_function, "_hetsync_inner"):
        model.train_function = None  # a refused plain fit's: its failed first trace cannot make variables again
    _build_before_trace(model, x)  # before the agreement: it carries the variables' counts (initial_state.py)
    # fit's one agreement across ranks (each collective is a negotiation with the slowest rank): the epoch plan and
    # the epochs, the report, refusals, steps_per_execution, the broadcast's root and shapes, the saved mode,
    # positions, and live switching
    agreed = options.gather_parts("fit", {
        "steps": -3 if bad else (own if own is not None else -1), "report_ms": report_ms,
        "refusal": 1 if refusal else 0, "per_execution": per_execution, "root": initial_state.root_of(broadcast),
        "saved_mode": saved_mode.code(family), "position": rank_state.position(),
        "shapes": initial_state.shape_row(model, broadcast), "switching": options.switching_row(family, user),
        "epochs": _epochs_row(signature.parameters, arguments)})
    _check_epochs(agreed["epochs"])
    steps = agreed["steps"]
    if -3 in steps:  # raised on every rank, after the gather, so no rank is left waiting in a collective
        wrong = [r for r, s in enumerate(steps) if s == -3]
        raise ValueError(f"steps_per_epoch must be a positive int or None; ranks {wrong} passed something else "
                         f"(this rank: {own!r})")
    refusing = [r for r, refused in enumerate(agreed["refusal"]) if refused]
    if refusal:
        raise ValueError(refusal)
    if refusing:
        raise ValueError(f"fit refused on rank(s) {refusing}: their model or compile settings are not supported by "
                         "the sync mode (their error names it; docs/compatibility.md)")
    initial_state.check_roots(agreed["root"])
    switching_wanted = options.check_switching(agreed["switching"])
    rank_state.align_position(agreed["position"])
    saved_mode.check(agreed["saved_mode"], initial_state.root_of(broadcast))
    if any(n != 1 for n in agreed["per_execution"]) and len(set(steps)) > 1:
        raise ValueError(f"steps_per_execution={per_execution if per_execution > 0 else 'auto'} needs the same "
                         f"steps_per_epoch on every rank (sync='allreduce'), got {steps}: pass equal shards, or "
                         "compile with steps_per_execution=1")
    if own is None and any(s > 0 for s in steps) or own is not None and any(s < 0 for s in steps):
        raise ValueError(f"steps_per_epoch is known on ranks {[r for r, s in enumerate(steps) if s > 0]} and not "
                         f"on ranks {[r for r, s in enumerate(steps) if s < 0]}: pass steps_per_epoch on every "
                         "rank (Horovod's convention: N // hvd.size()), or a finite tf.data dataset")
    every, at_end, epochs = options.consensus_options(user, algorithm)
    state = RankState(algorithm, model, job, job_epochs=job_epochs and own is not None, every=every, at_end=at_end,
                      epochs=epochs)
    if own is None:
        log.info("steps_per_epoch unknown (an endless dataset or in-memory arrays): each rank's epoch is its own")
        plan = None
    else:
        longest = max(steps)
        arguments["steps_per_epoch"] = longest
        if length >= 0:
            arguments["x"] = x.repeat()  # fast ranks (and idle steps) take more batches than the shard holds
        plan = (sum(steps), longest)
        if own < longest and (algorithm.STEPPING == "lockstep" or not state.job_epochs):
            state.own_steps = own  # per-rank epochs: this rank's batches past its own count are idle steps
    state.report = report.ReportFeed.agreed(agreed["report_ms"])
    state.broadcast_from = broadcast
    state.shape_rows = agreed["shapes"]
    state.switching_wanted = switching_wanted
    state.saved_modes = agreed["saved_mode"]  # resumed in at the fit's start (SyncPoints, saved_mode.py)
    head = SyncPoints(state, user, plan)
    arguments["callbacks"] = [head] + user + [ModeStamp(head, user), StopVote(head)]
    return arguments
