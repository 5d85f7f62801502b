"""``hetsync.DistributedOptimizer``: the one line a Horovod Keras script changes."""
from hetsync.algorithms import horovod_kwargs

AUTO_OPTIONS = ("candidates", "window", "min_interval", "settle", "min_samples", "straggler_ratio",
                "straggler_exit", "random_fraction", "random_exit", "slow_sample_ratio", "report_every", "pretrace")
REPORT_EVERY = 8  # sync="auto": steps between a rank's Switch Board reports (switchboard.py, "Report cadence")


def DistributedOptimizer(optimizer, sync="allreduce", **options):  # noqa: N802 (Horovod's name)
    """Wraps a Keras optimizer so training synchronizes with the method named by ``sync``.

    Args:
      optimizer: any Keras optimizer (``tf.keras.optimizers.*``, new or legacy).
      sync: a registered mode (``hetsync.available_modes()`` lists them; ``"allreduce"`` is Horovod's own
        DistributedOptimizer, the baseline), or ``"auto"``: hetsync measures the workers' speeds and switches
        between ``candidates`` as the job's heterogeneity changes (README "sync='auto'").
      **options: the mode's options (see README); unknown ones raise ValueError listing the valid ones.  With
        ``sync="auto"``: ``candidates`` ({"homogeneous"|"straggler"|"random": mode or (mode, options)}),
        ``window`` (seconds of samples the policy looks at), ``min_interval`` (seconds between switches), the
        policy's thresholds, ``report_every`` (steps between a rank's reports to the Switch Board, 8) and
        ``pretrace`` (True: the candidates' train steps are traced after the first step, so a switch does not stall
        on tracing).  Horovod's DistributedOptimizer keywords are accepted by every mode and kept across live
        switches.  ``job_epochs`` (every mode, default True): an epoch of a mode whose ranks step at their own
        pace is the job's ``sum(steps_per_epoch)`` train steps, shared by speed (README "Job epochs"); False:
        every rank runs its own ``steps_per_epoch`` train steps per epoch.

    Returns:
      A Keras optimizer to pass to ``model.compile``; its ``_hetsync_algorithm`` is the SyncAlgorithm in use.
      After a live switch (keras_callbacks.SyncMode, or auto) ``model.optimizer`` is the mode's optimizer in force,
      holding the same state.
    """
    from hetsync import training
    from hetsync.switching import Family

    training.install()  # job epochs, sync points, idle ranks and the agreed stop, for every mode
    options = dict(options)
    job_epochs = options.pop("job_epochs", True)
    if not isinstance(job_epochs, bool):
        raise ValueError(f"job_epochs must be True or False, got {job_epochs!r}")
    hvd_kwargs = {k: v for k, v in options.items() if k in horovod_kwargs.NAMES}
    mode_options = {k: v for k, v in options.items() if k not in horovod_kwargs.NAMES}
    if sync != "auto":
        return Family(optimizer, hvd_kwargs, job_epochs=job_epochs).start(sync, mode_options)
    return _auto(optimizer, hvd_kwargs, mode_options, job_epochs)


def _auto(optimizer, hvd_kwargs, options, job_epochs):
    from hetsync import _runtime
    from hetsync.coordinator.auto_policy import AutoPolicy
    from hetsync.switching import Family

    unknown = sorted(set(options) - set(AUTO_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for sync='auto'; valid options: {', '.join(AUTO_OPTIONS)}; "
                         "and Horovod DistributedOptimizer keyword arguments")
    options = dict(options)
    every = options.pop("report_every", REPORT_EVERY)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"report_every must be an int >= 1 (steps), got {every!r}")
    pretrace = options.pop("pretrace", True)
    if not isinstance(pretrace, bool):
        raise ValueError(f"pretrace must be True or False, got {pretrace!r}")
    _runtime.require_init("sync='auto'")
    services = _runtime.services()
    policy = AutoPolicy(services.size, **options)  # checks the settings and candidates here, on every rank
    family = Family(optimizer, hvd_kwargs, auto=dict(options), report_every=every, job_epochs=job_epochs)
    for mode, mode_options in policy.candidates.values():
        family.validate(mode, mode_options)
    if pretrace:
        family.pretrace = list(policy.candidates.values())
    if services.rank == 0:
        settings = dict(options)
        settings["candidates"] = {c: [m, o] for c, (m, o) in policy.candidates.items()}
        services.switch_client().configure(settings)
    mode, mode_options = policy.candidates["homogeneous"]
    return family.start(mode, mode_options)
