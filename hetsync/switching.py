"""Live sync-mode switches (README "Switching"): any registered mode to any other, inside ``Model.fit``.

``hetsync.DistributedOptimizer`` returns the optimizer of a :class:`Family`: the user's optimizer as the first
mode wraps it, and the recipe to wrap it in any other mode.  A switch happens at a step boundary every rank agrees
on (a schedule's epoch, or the step the Switch Board negotiated, hetsync/coordinator/switchboard/board.py) and is, on
every rank at the same point (:func:`perform`), a consistent cut:

0. the roll call (:func:`muster`), before anything changes: every rank checks the new mode (:func:`preflight`) and
   hears everyone's result from the Switch Board; a failure anywhere refuses the switch everywhere (:func:`refuse`),
   a rank that does not come is named after the timeout;
1. leave the old mode: its consensus hooks (withdraw from P-Reduce and queues, leave the Group Generator, complete
   OD-SGD's outstanding allreduce), then ``drain`` (gradients it holds but has not applied -- accumulators,
   eager-SGD's unreturned rounds and undelivered deposit -- become one local update), then ``deactivate``; the
   engine's session ends on every rank (``ops.withdraw``);
2. the new mode: wrapped the first time it is used, else taken from the family's cache with its compiled train
   step; the user's optimizer state moves over: ``iterations``, every slot and the learning rate (a variable a
   Horovod callback may have changed) are copied into the new mode's optimizer, which becomes ``model.optimizer``;
3. one consensus round, one Horovod collective: the models are averaged (weight 0 for a rank idle since the last
   sync point), and every rank takes the same optimizer state (:func:`reconcile_optimizer`: the largest
   ``iterations``, the mean of each slot);
4. ``activate`` installs the new mode's coordinator state (the Group Generator's configuration, the State Server);
5. a new engine session starts (``ops.rejoin`` on every rank, exactly once) and the new mode goes on.

Keras' compiled step is traced once per (mode, options) the job uses: switching back reuses it.  A rank that hears
of a Switch Board decision before its step traces the new mode's step meanwhile, in a thread (trace_ahead.py); with
sync="auto" and ``pretrace=True`` the candidates' steps are traced after the first step (:func:`pretrace`).
"""
import json
import logging
import time

import tensorflow as tf

from hetsync import _runtime, algorithms, compat, marks, trace_ahead
from hetsync.algorithms import horovod_kwargs
from hetsync.algorithms._wrap import build_slots, optimizer_variables
from hetsync.coordinator.switchboard import canonical
from hetsync.training import front_door
from hetsync.training.consensus import weighted_average

log = logging.getLogger("hetsync.switching")


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def key_of(mode, options):
    """(mode, canonical options JSON): the family's cache key, as the Switch Board compares requests."""
    return mode, canonical(options)


def parse_target(value):
    """A schedule or request value: "mode" or ("mode", {options}) -> (mode, options dict); underscores in the
    name read as hyphens (``algorithms.canonical``)."""
    if isinstance(value, str):
        return algorithms.canonical(value), {}
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], dict):
        return algorithms.canonical(value[0]), dict(value[1])
    raise ValueError(f"a sync mode is a name or (name, options dict), got {value!r}")


class Entry:
    """One mode of a family: its algorithm, its wrapped optimizer, its Keras train function once traced."""

    def __init__(self, mode, options, algorithm, optimizer):
        self.mode, self.options = mode, dict(options)
        self.key = key_of(mode, options)
        self.algorithm, self.optimizer = algorithm, optimizer
        self.train_function = None
        self.horovod_register = _horovod_registration(optimizer)

    def register(self, var):
        if self.horovod_register is not None:
            owner, method = self.horovod_register
            method(owner, var)


def _horovod_registration(optimizer):
    """(optimizer, Horovod's ``register_local_var``) of a Horovod-based mode (allreduce, OD-SGD's warm-up): Horovod's
    optimizer itself, or the one inside a LossScaleOptimizer (mixed precision: loss_scale_parts puts the loss scaling
    around Horovod's optimizer, which alone knows which gradients not to allreduce); None for the other modes."""
    for owner in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        method = getattr(type(owner), "register_local_var", None) if owner is not None else None
        if method is not None:
            return owner, method
    return None


def give_from_config(cls, base, algorithm, rebuild):
    """Gives ``cls`` (the class a mode's ``wrap`` made for one optimizer: ours, Horovod's dynamic one, or the
    loss-scale wrapper put back around it) Horovod's ``from_config``: a new optimizer of the same mode and options
    from ``get_config()``, the user's optimizer's config, through ``rebuild`` (``hetsync.DistributedOptimizer``).
    Collective, like that call, so every rank rebuilds it (as ``hvd.load_model``)."""

    def from_config(klass, config, custom_objects=None):
        fresh = base.from_config(config, custom_objects) if custom_objects else base.from_config(config)
        return rebuild(fresh, sync=algorithm.name, **algorithm.options, **algorithm.horovod_kwargs)

    cls.from_config = classmethod(from_config)


class Family:
    """The optimizers one ``hetsync.DistributedOptimizer`` call stands for: one per mode the job uses."""

    def __init__(self, base_optimizer, horovod_kwargs, auto=None, report_every=1, job_epochs=True, rebuild=None):
        self.base = base_optimizer
        self.rebuild = rebuild              # hetsync.DistributedOptimizer, for each optimizer's from_config
        self.fit_model = None               # the model of the fit in progress (a switch checks its features)
        self.horovod_kwargs = dict(horovod_kwargs)
        self.auto = auto                    # sync="auto": the policy's settings (dict), else None
        self.report_every = int(report_every)  # Switch Board report cadence (steps), the same on every rank
        self.job_epochs = bool(job_epochs)  # training/job_epochs.py
        self.entries = {}
        self.current = None                 # key of the mode in force
        self.applied = 0                    # id of the last Switch Board decision carried out here
        self.pending = None                 # the decision this rank will carry out at its step ``at``
        self.history = []                   # switches done on this rank (dicts), for reports
        self.pretrace = []                  # (mode, options) whose train steps the first step traces (auto)
        self.ahead = {}                     # key -> a train step being traced before its switch (trace_ahead.py)
        self.local_vars = set()             # refs registered with register_local_var, shared by every mode
        self.refusals = []                  # switches every rank refused at their roll call (dicts)
        self.attempts = 0                   # roll calls so far (the same count on every rank)
        self.resumed = None                 # (mode, options) a loaded checkpoint was saved in (saved_mode.py)

    # -- entries ----------------------------------------------------------------------------------------------
    def validate(self, mode, options):
        """The mode's algorithm, not wrapped; raises ValueError for an unknown mode or a bad option (nothing else
        happens: the warning about ignored Horovod keywords is the wrap's to give, once)."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", horovod_kwargs.HorovodKwargWarning)
            return algorithms.create(mode, **options, **self.horovod_kwargs)

    def entry(self, mode, options):
        """The mode's entry, wrapped on first use (collective when the mode's wrap is: every rank calls it)."""
        key = key_of(mode, options)
        if key not in self.entries:
            algorithm = algorithms.create(mode, **options, **self.horovod_kwargs)
            algorithm.local_vars = self.local_vars
            optimizer = algorithm.wrap(self.base)
            if self.rebuild is not None:
                give_from_config(type(optimizer), type(self.base), algorithm, self.rebuild)
            algorithm.make_compute_stamp()
            if marks.algorithm_of(optimizer) is None:
                marks.record(optimizer, algorithm=algorithm)
            marks.record(optimizer, family=self)
            entry = self.entries[key] = Entry(mode, options, algorithm, optimizer)
            for ref in self.local_vars:
                entry.register(ref.deref())
            optimizer.register_local_var = self.register_local_var
            front_door.guard(optimizer, algorithm)  # plain model.fit refused (hetsync.keras.fit is the way)
        return self.entries[key]

    def register_local_var(self, var):
        """Horovod's ``register_local_var``: ``var`` stays this worker's own in every mode of the family -- no
        exchange, no consensus average (Horovod-based modes: Horovod's own rule, it is not allreduced)."""
        self.local_vars.add(var.ref())
        for entry in self.entries.values():
            entry.register(var)

    @property
    def current_entry(self):
        return self.entries[self.current]

    def start(self, mode, options):
        """The first mode (``DistributedOptimizer``'s ``sync``): returns its optimizer."""
        entry = self.entry(mode, options)
        entry.algorithm.activate()
        self.current = key_of(mode, options)
        return entry.optimizer

    def describe(self):
        mode, options = self.current
        return mode if options == "{}" else f"{mode} {options}"


def copy_optimizer_state(old, new, variables):
    """``iterations``, slots and hyper-parameter variables of ``old`` into ``new`` (same user optimizer class)."""
    build_slots(old, variables)
    build_slots(new, variables)
    src, dst = optimizer_variables(old), optimizer_variables(new)
    shapes = [(tuple(v.shape), v.dtype) for v in src], [(tuple(v.shape), v.dtype) for v in dst]
    if shapes[0] != shapes[1]:
        raise RuntimeError(f"cannot carry the optimizer state over: {len(src)} variables {shapes[0][:4]}... "
                           f"against {len(dst)} {shapes[1][:4]}...")
    for a, b in zip(src, dst):
        b.assign(a)
    _copy_hyper(old, new)


def optimizer_state_to_sum(optimizer):
    """The tensors whose sums over the ranks make the optimizer state one (:func:`reconcile_optimizer`), summed in
    the switch's average (float64, Horovod Sum: one collective for the model and the optimizer): every float slot,
    and ``iterations`` in this rank's entry of a vector of ``size`` zeros (the sum holds every rank's count)."""
    hvd = _hvd()
    count = tf.one_hot(hvd.rank(), hvd.size(), on_value=tf.cast(optimizer.iterations, tf.float64), dtype=tf.float64)
    return [tf.cast(v, tf.float64) for v in _float_slots(optimizer)] + [count]


def _float_slots(optimizer):
    """The optimizer's float variables but ``iterations``: its slots (momentum, Adam's moments)."""
    return [v for v in optimizer_variables(optimizer) if v.dtype.is_floating and v is not optimizer.iterations]


def reconcile_optimizer(optimizer, sums):
    """Inside a switch, from the sums over the ranks of :func:`optimizer_state_to_sum`'s tensors: every rank leaves
    with the same optimizer state, so the new mode starts from one consistent cut.  ``iterations`` becomes the
    largest among the ranks (modes whose ranks step at their own pace leave them at different counts; a mode keyed
    on it -- OD-SGD's warm-up, Ripples' static schedule -- needs one value everywhere), and every float slot
    (momentum, Adam's moments) becomes the ranks' mean."""
    *slots, counts = sums
    size = _hvd().size()
    optimizer.iterations.assign(tf.cast(tf.reduce_max(counts), optimizer.iterations.dtype))
    for v, total in zip(_float_slots(optimizer), slots):
        v.assign(tf.cast(total / size, v.dtype))


def _copy_hyper(old, new):
    if hasattr(old, "_hyper"):  # legacy optimizers: every hyper-parameter may be a variable
        for name in old._hyper:
            value = old._get_hyper(name)
            if not callable(value):
                tf.keras.backend.set_value(new._get_hyper(name), tf.keras.backend.get_value(value))
        return
    lr = getattr(old, "_learning_rate", None)
    if isinstance(lr, tf.Variable) and isinstance(getattr(new, "_learning_rate", None), tf.Variable):
        new._learning_rate.assign(lr)


def pretrace(sync_points, iterator):
    """sync="auto", after a fit's first step (every rank, the same point): wrap each candidate mode of
    ``family.pretrace`` and trace its Keras train step for this iterator, so that the switch into it later reuses
    the traced step instead of stalling every rank on tracing (seconds for a Keras model; all ranks wait for the
    slowest tracer).  A candidate is wrapped but not activated: its coordinator set-up (Group Generator
    configuration, State Server) happens at the switch into it, so the services of the mode in force are
    untouched."""
    model, family = sync_points.model, sync_points.family
    targets, family.pretrace = family.pretrace, []
    optimizer, train_function = model.optimizer, model.train_function
    began = time.monotonic()
    traced = []
    for mode, options in targets:
        key = key_of(mode, options)
        if key in family.entries:  # the mode in force, or one already used
            continue
        entry = family.entry(mode, options)  # wrapped, not activated: no coordinator service is touched
        build_slots(entry.optimizer, model.trainable_variables)
        entry.algorithm.build(model.trainable_variables)
        model.optimizer = entry.optimizer
        try:
            entry.train_function = model.make_train_function(force=True)
            if entry.algorithm.KERAS_TRAIN_STEP:
                entry.train_function.get_concrete_function(iterator)
            entry.algorithm.pretrace(model, iterator)
        finally:
            model.optimizer, model.train_function = optimizer, train_function
        traced.append(mode)
    if traced and sync_points.verbose:  # the same on every rank: INFO on rank 0, DEBUG elsewhere
        log.log(logging.INFO if _hvd().rank() == 0 else logging.DEBUG,
                "traced the train steps of %s in %.1f s (sync='auto' candidates)", ", ".join(traced),
                time.monotonic() - began)
    return traced


def preflight(family, mode, options):
    """This rank's reason to refuse a switch to ``mode`` (a string), or None: the options, and the checks the wrap
    would make that may fail on some ranks only (``SyncAlgorithm.preflight``: the node layout, Hop's graph)."""
    key = key_of(mode, options)
    try:
        entry = family.entries.get(key)
        algorithm = entry.algorithm if entry is not None else family.validate(mode, options)
        algorithm.preflight()

        refusal = compat.switch_problem(family.fit_model, mode)  # docs/compatibility.md
        if refusal:
            raise ValueError(refusal)
    except (ValueError, RuntimeError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def muster(family, mode, options, position):
    """The switch's roll call, before any rank leaves the mode in force (every rank calls it at the same point):
    every rank reports its :func:`preflight` to the Switch Board and hears everyone's.  Returns None (switch) or
    the refusal's reason (the same text on every rank).  A rank that does not come within the engine timeout is
    named in a RuntimeError on every rank that came: never an endless wait in the switch's Horovod average."""
    attempt = family.attempts
    family.attempts += 1
    error = preflight(family, mode, options)
    wait = _runtime.timeout()
    missing, errors = _runtime.services().switch_client().muster(f"switch.{attempt}", error, wait)
    if missing:
        raise RuntimeError(f"hetsync: switch to {mode!r} at step {position}: rank(s) {missing} did not come within "
                           f"{wait:.0f} s (dead, or stuck outside hetsync: in a user's collective, or a callback)")
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if not failed:
        return None
    return "; ".join(f"rank {r}: {e}" for r, e in failed)


def refuse(sync_points, mode, options, reason, why, decision_id=None):
    """A switch that failed its roll call: training goes on in the mode in force, on every rank; the refusal is
    recorded (``family.refusals``, ``SyncModeCallback.refusals``) and logged on rank 0."""
    family = sync_points.family
    record = {"id": decision_id, "from": family.current_entry.mode, "to": mode, "options": options,
              "reason": reason, "position": sync_points.position, "refused": why}
    family.refusals.append(record)
    if _hvd().rank() == 0:
        log.warning("step %s: switch %s -> %s refused on every rank: %s", sync_points.position,
                    record["from"], mode, why)
    return record


def perform(sync_points, mode, options, reason, decision_id=None):
    """Switches the job to ``mode`` here (collective: every rank calls it at the same point).  See the module
    docstring for the steps.  Returns the switch's record, or None when the roll call refused it."""
    model, family = sync_points.model, sync_points.family
    began = time.monotonic()
    why = muster(family, mode, options, sync_points.position)
    if why is not None:
        refuse(sync_points, mode, options, reason, why, decision_id)
        return None
    old_entry = family.current_entry
    old, life = old_entry.algorithm, sync_points.life
    life.switch_begins()
    drained = old.drain(old_entry.optimizer, model.trainable_variables)
    life.retire()
    # weight 0: a rank that trained nothing since the last sync point (its model is that point's), unless the drain
    # just applied gradients here
    trained = sync_points.steps_since_sync > 0 or any(drained.values())
    inner = getattr(model.train_function, "_hetsync_inner", model.train_function)
    old_entry.train_function = inner
    entry = family.entry(mode, options)
    new = entry.algorithm
    copy_optimizer_state(old_entry.optimizer, entry.optimizer, model.trainable_variables)
    _, sums = weighted_average(model, 1.0 if trained else 0.0, exclude=family.local_vars,
                               carry=optimizer_state_to_sum(entry.optimizer),  # in the average's collective
                               name=f"hetsync.switch.{len(family.history)}")
    reconcile_optimizer(entry.optimizer, sums)
    model.optimizer = entry.optimizer
    family.current = entry.key
    # the step traced in a thread since the decision (trace_ahead.py), finished before the mode is activated, as a
    # pretraced one
    traced_ahead = trace_ahead.claim(family, entry, _runtime.timeout())
    life.install(new)  # a new engine session; the new mode withdrawn again on a rank that is out or stopped
    traced_here = entry.train_function is None
    if traced_here:
        model.train_function = None
        new.build(model.trainable_variables)
        entry.train_function = model.make_train_function(force=True)
    else:
        model.train_function = entry.train_function
    # (the fit's SyncPoints callback adopts the new mode: training/callbacks.py)
    sync_points.steps_since_sync = 0
    record = {"id": decision_id, "from": old_entry.mode, "to": mode, "options": options, "reason": reason,
              "position": sync_points.position, "time": time.time(), "seconds": time.monotonic() - began,
              "traced": traced_here, "traced_ahead": traced_ahead, "drained": drained}
    family.history.append(record)
    if sync_points.verbose:  # the same on every rank: INFO on rank 0, DEBUG elsewhere
        log.log(logging.INFO if _hvd().rank() == 0 else logging.DEBUG, "step %s: switched %s -> %s%s (%s) in %.2f s",
                sync_points.position, old_entry.mode, mode, " " + json.dumps(options) if options else "", reason,
                record["seconds"])
    life.switch_ends()
    return record
