"""hetsync inside ``Model.fit``, with no callback for the user to add: where each rank is, epoch ends, the end.

``hetsync.init()`` (and ``hetsync.DistributedOptimizer``) wrap ``tf.keras.Model.fit`` once.  For a model compiled
with a hetsync optimizer the wrapper adds two internal callbacks, :class:`SyncPoints` first in the list and
:class:`StopVote` last; any other model trains exactly as before.  They give every mode the drop-in guarantees
(README, "Guarantees"):

* **Where the rank is** (docs/engine.md, "Availability").  The compiled train function is wrapped so the engine
  knows when this rank is inside a train step (IN_STEP: peers wait for it, it is coming) and when it left
  (BETWEEN: if it stays out longer than ``away_after``, e.g. blocked in a user's ``hvd.allreduce`` in a callback,
  peers stop waiting and go on without it).  Epoch ends and idle ranks are AWAY at once.
* **Epoch ends are a global sync point** (SyncPoints, before any user callback's ``on_epoch_end`` and before the
  epoch's validation): the rank leaves hetsync's partial collectives, and one consensus round averages the models
  (decentralized modes end every epoch with one model, so validation, ``MetricAverageCallback`` and rank 0's
  ``ModelCheckpoint`` see the consensus model) and tells who has stopped.  Ranks of decentralized modes reach it
  at different times; it is a Horovod collective, so the early ones wait for the late ones there -- never the other
  way round.
* **Ranks that stop at different times: idle steps.**  When a callback sets ``model.stop_training`` on one rank (a
  time budget, ``EarlyStopping`` deciding alone) and not on all, that rank does not leave ``fit``: it becomes
  *idle*.  It keeps stepping through the same batches and epochs, so every callback -- and every Horovod collective
  a user's callback runs (``MetricAverageCallback``, an ``hvd.allreduce`` every N batches) -- runs the same number
  of times on every rank, and the job's collectives always match.  An idle step trains nothing: in decentralized
  modes it does not run the step at all (the rank is withdrawn, nobody waits on it); in synchronous modes
  (``allreduce``) it runs the step with a zero gradient contribution, so the others' gradient allreduce completes
  and the idle rank keeps receiving their updates (Horovod's ``join`` semantics; ``hvd.join`` itself cannot be
  called twice in a process in Horovod 0.28).  An idle rank's model has weight 0 in the consensus.  At each epoch
  end StopVote, after every user callback, asks every rank: when all have stopped, all leave ``fit`` together.
  So the job ends within one epoch of idle steps (no compute) after its last rank stops.

``keras_callbacks.Consensus`` is optional: it adds rounds every N batches, or turns the averages off.
"""
import functools
import os
import sys
import time

_STATE = {"installed": False, "original_fit": None, "last_rounds": 0}
_DEBUG = os.environ.get("HETSYNC_DEBUG", "") not in ("", "0")


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def _debug(msg):
    if _DEBUG:
        print(f"[hetsync {time.monotonic():.3f}] rank {_hvd().rank()}: {msg}", file=sys.stderr, flush=True)


def last_rounds():
    """Sync points (epoch ends, mid-epoch rounds, the end round) of the last hetsync ``fit`` on this rank."""
    return _STATE["last_rounds"]


def position():
    """Train-function calls of this process's hetsync fits so far (the job's step count: the same on every rank at
    the same step; decentralized modes run it at different times)."""
    return _STATE.get("position", 0)


def install():
    """Wraps ``tf.keras.Model.fit`` (idempotent).  Models without a hetsync optimizer are not affected."""
    if _STATE["installed"]:
        return
    import tensorflow as tf

    original = tf.keras.Model.fit

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        algorithm = getattr(getattr(self, "optimizer", None), "_hetsync_algorithm", None)
        if algorithm is None:
            return original(self, *args, **kwargs)
        return original(self, **_with_sync_points(original, self, args, kwargs, algorithm))

    fit._hetsync_original = original
    tf.keras.Model.fit = fit
    _STATE.update(installed=True, original_fit=original)


def uninstall():
    """Restores the original ``Model.fit`` (tests)."""
    if _STATE["installed"]:
        import tensorflow as tf

        tf.keras.Model.fit = _STATE["original_fit"]
        _STATE.update(installed=False, original_fit=None)


def _with_sync_points(original, model, args, kwargs, algorithm):
    """fit's arguments as keywords, with SyncPoints first and StopVote last in its callback list."""
    import inspect

    bound = inspect.signature(original).bind(model, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self", None)
    user = [cb for cb in (arguments.get("callbacks") or []) if not isinstance(cb, (SyncPoints, StopVote))]
    head = SyncPoints(algorithm, user)
    own = arguments.get("steps_per_epoch")
    if isinstance(own, int) and own > 0:
        # Uneven shards: every rank runs the longest epoch; a rank's batches past its own count are idle steps, so
        # per-batch collectives (a synchronous gradient allreduce, a user's hvd.allreduce every N batches) match.
        import tensorflow as tf

        hvd = _hvd()
        _STATE["fits"] = _STATE.get("fits", 0) + 1
        longest = int(hvd.allreduce(tf.constant(own, tf.int64), op=hvd.Max, name=f"hetsync.fit.{_STATE['fits']}"))
        arguments["steps_per_epoch"] = longest
        head.own_steps = own
    arguments["callbacks"] = [head] + user + _report_for_tensorboard(user) + [StopVote(head)]
    return arguments


def _report_for_tensorboard(user_callbacks):
    """A user's TensorBoard callback gets hetsync's scalars beside its own (keras_callbacks.HeterogeneityReport
    in its log_dir), unless the user added a HeterogeneityReport."""
    import tensorflow as tf

    from keras_callbacks.report import HeterogeneityReport

    if any(isinstance(cb, HeterogeneityReport) for cb in user_callbacks):
        return []
    boards = [cb for cb in user_callbacks if isinstance(cb, tf.keras.callbacks.TensorBoard)]
    return [HeterogeneityReport(boards[0].log_dir)] if boards else []


def _consensus_options(user_callbacks, algorithm=None):
    """(every, at_end): a user's Consensus callback decides; else the mode's own ``consensus_every`` (eager-SGD's
    model_sync_every: batches between mid-epoch averages), else epoch ends only."""
    from keras_callbacks.consensus import Consensus

    found = [cb for cb in user_callbacks if isinstance(cb, Consensus)]
    if found:
        return found[0].every, found[0].at_end
    return getattr(algorithm, "consensus_every", None) or "epoch", True


def _callback_base():
    import tensorflow as tf

    return tf.keras.callbacks.Callback


class SyncPoints(_callback_base()):
    """First in ``fit``'s callback list: availability, idle steps, epoch-end sync points, the end round."""

    def __init__(self, algorithm, user_callbacks=()):
        super().__init__()
        self.algorithm = algorithm
        self.user_callbacks = list(user_callbacks)
        self.every, self.at_end = _consensus_options(user_callbacks, algorithm)
        self.rounds = 0
        self.idle = False           # this rank stopped; it steps through the rest of fit without training
        self.own_steps = None       # this rank's own steps per epoch, when fewer than the job's (uneven shards)
        self._batch = 0             # train-function calls in this epoch
        self._padding = False       # idle for the rest of this epoch only (past own_steps)
        self._synced_this_epoch = False
        self._steps_since_sync = 0
        self.family = None          # hetsync.switching.Family of the model's optimizer
        self.switching = False      # this fit reports to the Switch Board (a SyncMode callback, or sync="auto")
        self.verbose = True
        self.hooks = []             # callbacks acting per local iteration (Slowdown, EmulatedCompute)
        self.local_iterations = False
        from hetsync.step_clock import StepClock

        self.clock = StepClock()

    @property
    def position(self):
        """Train-function calls of this process's hetsync fits so far (the same on every rank at each step)."""
        return _STATE.get("position", 0)

    # -- the train function -------------------------------------------------------------------------------
    def _wrap_train_function(self):
        model = self.model
        fn = getattr(model.train_function, "_hetsync_inner", model.train_function)
        from hetsync import ops

        def train_function(iterator):
            self._batch += 1
            _STATE["position"] = _STATE.get("position", 0) + 1
            if self.own_steps is not None and self._batch > self.own_steps and not self._padding:
                self._padding = True
                if not self.idle:
                    _debug(f"epoch has {self.own_steps} steps here: idle steps to the end of the epoch")
                    ops.pin_away(True)
                    self.algorithm.on_idle()
            if self.idle or self._padding:
                logs = self.algorithm.idle_step(fn, iterator)
                self._pretrace(iterator)
                if logs is None:  # decentralized: nothing ran; Keras wants logs: the metrics as they stand
                    return {m.name: m.result() for m in model.metrics}
                return logs
            ops.set_availability(ops.IN_STEP)
            wall, began = time.time(), time.monotonic()
            try:
                if self.local_iterations:  # ESync: one Keras step = one round of local iterations
                    logs = self.algorithm.run_step(fn, iterator)
                else:
                    for hook in self.hooks:  # an injected slowdown is compute: inside the step
                        hook.on_local_iteration_begin()
                    logs = fn(iterator)
                    for hook in self.hooks:
                        hook.on_local_iteration_end()
            finally:
                ops.set_availability(ops.BETWEEN)
            self.clock.step(self.algorithm, wall, began, time.monotonic(), self.local_iterations)
            self._steps_since_sync += 1
            self._pretrace(iterator)
            return logs

        train_function._hetsync_inner = fn
        model.train_function = train_function

    def _pretrace(self, iterator):
        """sync="auto": after the first step (every rank; Keras' metrics are built by then, so a traced step is
        final), trace the candidate modes' train steps (switching.pretrace)."""
        if self.family is None or not self.family.pretrace:
            return
        from hetsync import switching

        began = time.monotonic()
        switching.pretrace(self, iterator)
        self.clock.sync(time.monotonic() - began)

    # -- Keras hooks ----------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        from hetsync import ops

        self.idle = self._padding = False
        ops.pin_away(False)
        self._steps_since_sync = 0
        # Per-iteration callbacks (keras_callbacks.Slowdown / EmulatedCompute) run inside the step: the wrapper
        # calls them, or, in modes whose Keras step is several local iterations (ESync), the mode does.
        self.hooks = [cb for cb in self.user_callbacks if hasattr(cb, "on_local_iteration_begin")]
        for cb in self.hooks:
            cb.per_local_iteration = True
        self.model._hetsync_sync_points = self
        self.adopt(self.algorithm)
        self._start_switching()
        ops.set_availability(ops.BETWEEN)

    def adopt(self, algorithm):
        """Makes ``algorithm`` the one this fit runs (at the start, and after each live switch)."""
        self.algorithm = algorithm
        self.every, self.at_end = _consensus_options(self.user_callbacks, algorithm)
        self.local_iterations = bool(getattr(algorithm, "LOCAL_ITERATIONS", False))
        if self.local_iterations:
            algorithm.attach(self.model, self.hooks)
        self._wrap_train_function()

    def _start_switching(self):
        """Live switches need every rank to report to the Switch Board, at the same cadence: all ranks or none
        (checked here, once per fit, with one small Horovod allgather), else a switch would wait forever for a
        rank that never hears of it."""
        import tensorflow as tf

        from keras_callbacks.sync_mode import SyncMode

        self.family = getattr(self.model.optimizer, "_hetsync_family", None)
        modes = [cb for cb in self.user_callbacks if isinstance(cb, SyncMode)]
        for cb in modes:
            cb._bind(self)
        self.verbose = all(cb.verbose for cb in modes)
        wanted = self.family is not None and (bool(modes) or self.family.auto is not None)
        hvd = _hvd()
        _STATE["switch_checks"] = _STATE.get("switch_checks", 0) + 1
        every = self.family.report_every if self.family is not None else 1
        both = hvd.allgather(tf.constant([1 if wanted else 0, every], tf.int32),
                             name=f"hetsync.switching.{_STATE['switch_checks']}").numpy().tolist()
        flags, cadences = both[0::2], both[1::2]
        if wanted and len(set(cadences)) > 1:
            raise ValueError(f"sync='auto' report_every differs between ranks: {cadences}; pass the same "
                             "options on every rank")
        if len(set(flags)) > 1:
            raise ValueError(f"ranks {[r for r, f in enumerate(flags) if f]} have a keras_callbacks.SyncMode "
                             f"callback (or sync='auto') and ranks {[r for r, f in enumerate(flags) if not f]} do "
                             "not: pass the same callbacks on every rank, as for Horovod's callbacks")
        self.switching = wanted
        if wanted:
            from hetsync import _runtime

            self.board = _runtime.services().switch_client()

    # -- live switches --------------------------------------------------------------------------------------
    def _report(self):
        """After every ``family.report_every``-th step (switchboard.py, "Report cadence"): tell the Switch Board
        where this rank is; carry out its decision at its step."""
        family = self.family
        every = family.report_every
        if self.position % every == 0:
            mode, options = family.current
            samples = self.clock.take_samples() if family.auto is not None else ()
            d = self.board.report(self.position, family.applied, mode, options, samples, every)
            if d.id and d.id > family.applied:
                family.pending = d
        d = family.pending
        if d is None:
            return
        if self.position > d.at:
            raise RuntimeError(f"hetsync: rank {_hvd().rank()} is at step {self.position}, past switch {d.id}'s "
                               f"step {d.at} (Switch Board protocol broken)")
        if self.position == d.at:
            import json

            self.switch_to(d.mode, json.loads(d.options_json), d.reason, d.id)
            family.applied, family.pending = d.id, None
            # Every rank passed the switch's consensus round: say so now, so the board takes the next request.
            self.board.report(self.position, family.applied, d.mode, d.options_json, (), every)

    def switch_to(self, mode, options, reason, decision_id=None):
        """Collective: every rank calls it at the same point (hetsync/switching.py)."""
        from hetsync import switching

        began = time.monotonic()
        record = switching.perform(self, mode, options, reason, decision_id)
        self.clock.sync(time.monotonic() - began)
        return record

    def _scheduled(self, epoch):
        """A SyncMode schedule's entry for ``epoch`` (every rank has the same schedule: no negotiation)."""
        from keras_callbacks.sync_mode import SyncMode

        for cb in self.user_callbacks:
            if isinstance(cb, SyncMode) and epoch in cb.schedule:
                return cb.schedule[epoch]
        return None

    def on_epoch_begin(self, epoch, logs=None):
        from hetsync import ops

        self._synced_this_epoch = False
        self._batch = 0
        target = self._scheduled(epoch) if self.family is not None else None
        if target is not None:
            from hetsync.switching import key_of

            if key_of(*target) != self.family.current:
                self.switch_to(target[0], target[1], f"schedule: epoch {epoch}")
        if hasattr(self.algorithm, "on_epoch_begin"):
            self.algorithm.on_epoch_begin()
        if self._padding:
            self._padding = False
            if not self.idle:  # the epoch-end sync point rejoined hetsync's collectives; the mode's state comes back
                ops.pin_away(False)
                self.algorithm.on_resume()
                ops.set_availability(ops.BETWEEN)

    def on_train_batch_end(self, batch, logs=None):
        if isinstance(self.every, int) and (batch + 1) % self.every == 0:
            self.sync_point(mid_epoch=True)
        if self.switching:
            self._report()

    def on_test_begin(self, logs=None):
        if getattr(self.model, "_hetsync_in_fit", False) and not self._synced_this_epoch:
            self._synced_this_epoch = True
            self.sync_point()

    def on_epoch_end(self, epoch, logs=None):
        if not self._synced_this_epoch:
            self._synced_this_epoch = True
            self.sync_point()

    def on_train_end(self, logs=None):
        from hetsync import ops

        # Every rank leaves fit at the same epoch end (StopVote), so this round is global too: idle ranks rejoin
        # hetsync's collectives here, ready for the next fit.
        was_idle, self.idle = self.idle, False
        self._padding = False
        ops.pin_away(False)
        self.sync_point(final=True)
        if was_idle:
            self.algorithm.on_resume()
        _STATE["last_rounds"] = self.rounds
        ops.set_availability(ops.IN_STEP)  # outside fit, plain ops.p_reduce calls are not gated

    # -- idle and sync points -------------------------------------------------------------------------------
    def become_idle(self):
        """This rank stopped while others train on: withdraw from hetsync's collectives, step on without training."""
        from hetsync import ops

        if self.idle:
            return
        _debug("stopped: idle steps from now on")
        ops.pin_away(True)
        if self._padding:  # already out for this epoch
            self.idle = True
            return
        self.idle = True
        self.algorithm.on_idle()

    def sync_point(self, final=False, mid_epoch=False):
        """Global: every rank calls it at the same epoch ends / batches (idle ranks included).  A rank idle for
        the rest of this epoch (uneven shards) stays out of hetsync's collectives after a mid-epoch round, and
        rejoins at the epoch end."""
        from hetsync import ops
        from hetsync.consensus import sync_point

        began = time.monotonic()
        ops.set_availability(ops.AWAY)
        weight = 1.0 if self._steps_since_sync > 0 else 0.0
        # Epoch ends average unless Consensus(every=None); the end round only then (every epoch end already did).
        average = (self.every is None and self.at_end) if final else self.every is not None
        _debug(f"sync point {self.rounds} (idle={self.idle}, weight={weight}, final={final})")
        out = self.idle or (mid_epoch and self._padding)
        sync_point(self.model, self.algorithm, idle=out, weight=weight, average=average,
                   name=f"hetsync.sync.{self.rounds}")
        self.rounds += 1
        self._steps_since_sync = 0
        self.clock.sync(time.monotonic() - began)
        if not out:
            ops.set_availability(ops.BETWEEN)


class StopVote(_callback_base()):
    """Last in ``fit``'s callback list: turns one rank's ``stop_training`` into idle steps, and stops every rank
    together once all have stopped (one small Horovod allreduce per epoch end, after every user callback)."""

    def __init__(self, head):
        super().__init__()
        self.head = head
        self.votes = 0

    def on_train_begin(self, logs=None):
        self.model._hetsync_in_fit = True

    def on_train_batch_end(self, batch, logs=None):
        if self.model.stop_training:  # a time budget, an error-stop... mid-epoch, on this rank only
            self.model.stop_training = False
            self.head.become_idle()

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf

        hvd = _hvd()
        wants_stop = bool(self.model.stop_training) or self.head.idle
        everyone = hvd.allreduce(tf.constant(1.0 if wants_stop else 0.0), op=hvd.Min,
                                 name=f"hetsync.stopvote.{self.votes}")
        self.votes += 1
        if float(everyone) >= 1.0:
            self.model.stop_training = True  # every rank stops here, at the same epoch
        elif wants_stop:
            self.model.stop_training = False
            self.head.become_idle()

    def on_train_end(self, logs=None):
        self.model._hetsync_in_fit = False
