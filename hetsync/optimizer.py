"""``hetsync.DistributedOptimizer``: the one line a Horovod Keras script changes."""
from hetsync import _runtime, algorithms, compat, marks
from hetsync.algorithms import horovod_kwargs
from hetsync.algorithms.options import Option, check_all, did_you_mean
from hetsync.coordinator.switchboard.auto_policy import CLASSES, AutoPolicy, SETTINGS
from hetsync.switching import Family
from hetsync.training import options as agreement

REPORT_EVERY = 8  # sync="auto": steps between a rank's Switch Board reports (switchboard.py, "Report cadence")
FAMILY_OPTIONS = {  # every mode's
    "job_epochs": Option(True, "bool", doc="an epoch is the job's sum(steps_per_epoch) train steps (README)"),
}
AUTO_OWN = {  # sync="auto"'s, beside its policy's SETTINGS (coordinator/switchboard/auto_policy.py) and candidates
    "report_every": Option(REPORT_EVERY, "int", minimum=1, doc="steps between a rank's Switch Board reports"),
    "pretrace": Option(False, "bool", doc="trace the candidates' train steps after the first step (else each when "
                       "its switch is decided, in a thread)"),
    "start": Option("straggler", choices=CLASSES, doc="the class whose candidate mode auto trains in until it has "
                    "evidence (its own-pace straggler mode measures every rank's speed while it trains)"),
}


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,  # noqa: N802
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=None, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None, process_set=None,
                         scale_local_gradients=True, *, sync="allreduce", job_epochs=True, **options):
    """Wraps a Keras optimizer so training synchronizes with the method named by ``sync``.

    The positional and keyword parameters up to ``scale_local_gradients`` are Horovod's
    ``hvd.DistributedOptimizer``'s, in its order and with its defaults (``compression=None`` is
    ``hvd.Compression.none``, ``op=None`` is ``hvd.Average``, ``process_set=None`` the global process set), so a
    Horovod call keeps working with ``sync=`` added.  Every mode accepts them all: ``sync="allreduce"`` hands them to
    Horovod unchanged; the other modes apply those with a meaning for them and name the others in one warning
    (docs/compatibility.md).  Only the keywords given with a value other than the default are passed on.

    Args:
      optimizer: any Keras optimizer (``tf.keras.optimizers.*``, new or legacy).
      sync: keyword-only; a registered mode (``hetsync.available_modes()`` lists them; ``"allreduce"`` is Horovod's own
        DistributedOptimizer, the baseline), or ``"auto"``: hetsync measures the workers' speeds and switches
        between ``candidates`` as the job's heterogeneity changes (README "sync='auto'").
      **options: the mode's options (docs/options.md, ``python -m hetsync.docs``); unknown ones raise ValueError
        listing the valid ones and the closest ("did you mean").  ``sync`` names may use underscores.  With
        ``sync="auto"``: ``candidates`` ({"homogeneous"|"straggler"|"random"|"throttled": mode or (mode,
        options)}), ``window`` (seconds of samples the policy looks at), ``min_interval`` (seconds between
        switches), the policy's thresholds, ``start`` (the class auto trains in until it has evidence, "straggler"),
        ``report_every`` (steps between a rank's reports to the Switch Board, 8) and ``pretrace`` (False: a
        candidate's train step is traced once the first switch into it is decided, in a thread while training goes
        on; True: every candidate's after the first step, which a throttled node pays at the start whether or not
        auto ever switches).
      job_epochs: keyword-only, every mode (default True): an epoch of a mode whose ranks step at their own pace
        is the job's ``sum(steps_per_epoch)`` train steps, shared by speed (README "Job epochs"); False: every
        rank runs its own ``steps_per_epoch`` train steps per epoch.  Horovod's keywords are kept across live
        switches.

    Returns:
      A Keras optimizer to pass to ``model.compile``.  ``hetsync.current_mode``, ``hetsync.metrics`` and
      ``hetsync.switch_history`` (of it, or of the model) observe it (hetsync/observe.py).
      After a live switch (hetsync.callbacks.SyncModeCallback, or auto) ``model.optimizer`` is the mode's optimizer in force,
      holding the same state.
    """
    hvd_kwargs = _given_horovod_kwargs(locals())
    options = dict(options)
    given, sync = sync, algorithms.canonical(sync)  # "ripples_smart" is "ripples-smart"
    error = None
    try:  # every check that needs no peer, on every rank, before any collective of the set-up
        _check_sync(given)
        own = check_all("hetsync.DistributedOptimizer", FAMILY_OPTIONS, {"job_epochs": job_epochs})
        _check_optimizer(optimizer)
        mode_options = options
        refusal = compat.call_problem(sync, hvd_kwargs)  # Keras 3, process sets (docs/compatibility.md)
        if refusal:
            raise ValueError(refusal)
        if sync == "auto":
            auto = auto_settings(mode_options)
        else:
            Family(optimizer, hvd_kwargs).validate(sync, mode_options)
    except ValueError as e:
        error = str(e)
    agreement.agree_or_raise("hetsync.DistributedOptimizer", error,
                             agreement.fingerprint({"sync": sync, "options": {**hvd_kwargs, **options,
                                                                              "job_epochs": job_epochs}}))
    if sync != "auto":
        return Family(optimizer, hvd_kwargs, job_epochs=own["job_epochs"], rebuild=DistributedOptimizer).start(
            sync, mode_options)
    return _auto(optimizer, hvd_kwargs, auto, own["job_epochs"])


def _given_horovod_kwargs(arguments):
    """Horovod's keywords of a :func:`DistributedOptimizer` call whose value is not the signature's default, i.e.
    what the caller asked for (a default asks for nothing in any mode)."""
    import inspect

    defaults = inspect.signature(DistributedOptimizer).parameters
    given = {}
    for key in horovod_kwargs.NAMES:
        value, default = arguments[key], defaults[key].default
        if value is default or (value == default and type(value) is type(default)):
            continue
        given[key] = value
    return given


def _check_sync(given):
    """An unknown ``sync`` is a ValueError listing the valid names, "auto" included, and the closest one
    (underscores read as hyphens)."""
    modes = [*algorithms.available_modes(), "auto"]
    sync = algorithms.canonical(given)
    if not isinstance(sync, str) or sync not in modes:
        raise ValueError(f"unknown sync mode {given!r}; valid modes: {', '.join(modes)}"
                         f"{did_you_mean(sync, modes) if isinstance(sync, str) else ''}")


def _check_optimizer(optimizer):
    """Only Keras optimizers (new or legacy, and Keras' LossScaleOptimizer) can be wrapped: refused up front."""
    import tensorflow as tf

    kinds = (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, kinds):
        raise ValueError(f"hetsync.DistributedOptimizer needs a Keras optimizer (tf.keras.optimizers.*), got "
                         f"{type(optimizer).__module__}.{type(optimizer).__qualname__}")
    if marks.is_hetsync(optimizer):
        raise ValueError("this optimizer is already a hetsync.DistributedOptimizer; wrap the plain one")


def auto_settings(options):
    """sync="auto": its own settings checked (report_every, pretrace, the policy's), candidates included."""
    unknown = sorted(set(options) - set(AUTO_OWN) - set(SETTINGS) - {"candidates"})
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for sync='auto'; valid options: "
                         f"{', '.join(sorted([*AUTO_OWN, *SETTINGS, 'candidates']))}; and Horovod "
                         "DistributedOptimizer keyword arguments"
                         f"{did_you_mean(unknown, [*AUTO_OWN, *SETTINGS, 'candidates', *horovod_kwargs.NAMES])}")
    own = check_all("sync='auto'", AUTO_OWN, {k: v for k, v in options.items() if k in AUTO_OWN})
    policy_settings = {k: v for k, v in options.items() if k not in AUTO_OWN}
    policy = AutoPolicy(2, **policy_settings)  # checks the settings and candidates (the size does not matter)
    for mode, mode_options in policy.candidates.values():
        Family(None, {}).validate(mode, mode_options)
    settings = {k: v for k, v in policy_settings.items() if k != "candidates"}
    return {**own, "settings": settings, "candidates": policy.candidates}


def _auto(optimizer, hvd_kwargs, auto, job_epochs):
    """``auto``: :func:`auto_settings`' result, already checked on every rank."""
    _runtime.require_init("sync='auto'")
    services = _runtime.services()
    candidates = auto["candidates"]
    family = Family(optimizer, hvd_kwargs, auto={**auto["settings"], "candidates": candidates},
                    report_every=auto["report_every"], job_epochs=job_epochs, rebuild=DistributedOptimizer)
    if auto["pretrace"]:
        family.pretrace = list(candidates.values())
    if services.rank == 0:  # the Switch Board builds the policy for the job's size from the same settings
        services.switch_client().configure(
            {**auto["settings"], "candidates": {c: [m, o] for c, (m, o) in candidates.items()}})
    mode, mode_options = candidates[auto["start"]]
    return family.start(mode, mode_options)
