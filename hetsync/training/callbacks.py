"""The two callbacks hetsync puts in ``fit``'s list around the user's: Keras' face of the rank's state machine.

:class:`SyncPoints` goes first: it wraps the compiled train function (one Keras step = ``RankState.keras_step``),
starts each epoch with the job's plan, runs the epoch-end sync point before any user callback's ``on_epoch_end``
and before validation, and carries out live switches.  :class:`StopVote` goes last: it turns one rank's
``stop_training`` into idle steps, makes every rank leave together at the Job Clock's stop step, and votes at each
epoch end but the fit's last (so an ``EarlyStopping`` that fires on every rank ends the job at once).
"""
import json
import time

import tensorflow as tf

from hetsync import _runtime, marks, switching, trace_ahead
from hetsync.switching import key_of
from hetsync.training import front_door, hooks, initial_state, options, saved_mode


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


class SyncPoints(tf.keras.callbacks.Callback):
    """First in ``fit``'s callback list: the rank's state machine (training/rank_state.py) as Keras sees it."""

    def __init__(self, state, user_callbacks, epoch_plan):
        super().__init__()
        self.state = state
        self.user_callbacks = list(user_callbacks)
        self.epoch_plan = epoch_plan      # (job train steps, Keras steps) of each epoch
        self.switching = False            # this fit reports to the Switch Board (a SyncModeCallback callback, or auto)
        self.board = None
        self._ahead = None                # (position, future): the Switch Board report sent a step ahead of it
        self.resumed = None               # the mode a loaded checkpoint was saved in, agreed by every rank
        self.first_epoch = True           # the fit's first epoch (initial_epoch) has not begun yet
        self.epoch = None                 # the epoch in progress

    # -- the train function -------------------------------------------------------------------------------------
    def wrap_train_function(self):
        model = self.model
        fn = getattr(model.train_function, "_hetsync_inner", model.train_function)
        state = self.state

        def train_function(iterator):
            return state.keras_step(fn, iterator)

        train_function._hetsync_inner = fn
        model.train_function = train_function

    def adopt(self, algorithm):
        """A live switch made ``algorithm`` the mode in force (switching.perform calls it)."""
        self.state.adopt(algorithm)
        self.state.every, self.state.at_end, self.state.epochs = options.consensus_options(self.user_callbacks,
                                                                                            algorithm)
        self.wrap_train_function()

    # -- Keras hooks ---------------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        state = self.state
        state.model = self.model
        if state.broadcast_from is not None:  # before anything reads the weights (every rank: the roots agreed)
            initial_state.broadcast_before_first_step(self.model, state.broadcast_from, state.shape_rows)
        state.begin_fit()
        # Per-train-step callbacks (hetsync.testing.SlowdownCallback / EmulatedComputeCallback) run inside the step: the state
        # machine calls them, or, in modes whose Keras step is several local iterations (ESync), the mode does.
        state.hooks = [cb for cb in self.user_callbacks if isinstance(cb, hooks.TrainStepCallback)]
        for cb in state.hooks:
            cb.per_local_iteration = True
        self.model._hetsync_sync_points = state
        self.model._hetsync_callback = self
        state.adopt(state.algorithm)
        self.wrap_train_function()
        self._start_switching()
        self.first_epoch = True
        self.resumed = saved_mode.agree(state.family, initial_state.root_of(state.broadcast_from), state.saved_modes)
        if state.family is not None and state.family.pretrace:
            state.after_step = self._pretrace

    def _pretrace(self, iterator):
        """sync="auto": after the first step (every rank; Keras' metrics are built by then, so a traced step is
        final), trace the candidate modes' train steps (switching.pretrace)."""
        self.state.after_step = None
        switching.pretrace(self.state, iterator)

    def _start_switching(self):
        """Live switches: every rank reports to the Switch Board, at the same cadence, or none does (agreed in
        fit's one agreement across ranks: options.check_switching)."""
        state = self.state
        state.family = marks.family_of(self.model.optimizer)
        modes = [cb for cb in self.user_callbacks if isinstance(cb, hooks.SwitchSchedule)]
        for cb in modes:
            cb.bind(state)
        state.verbose = all(cb.verbose for cb in modes)
        self.switching = state.switching_wanted
        if self.switching:
            self.board = _runtime.services().switch_client()

    def on_epoch_begin(self, epoch, logs=None):
        state = self.state
        self.epoch = epoch
        target, reason = self._epoch_target(epoch) if state.family is not None else (None, None)
        if target is not None:
            if key_of(*target) != state.family.current:
                self.switch_to(target[0], target[1], reason)
        state.begin_epoch(*(self.epoch_plan or (None, None)))
        state.synced_this_epoch = False
        if state.report is not None:
            state.report.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        state = self.state
        if isinstance(state.every, int) and (batch + 1) % state.every == 0:
            state.sync_point(mid_epoch=True)
        if self.switching:
            if batch == 0:
                self._trace_scheduled()
            self._report()
        if state.report is not None:  # the heterogeneity report's records, on every rank (training/report.py)
            state.report.step(state, logs)

    def on_test_begin(self, logs=None):
        if getattr(self.model, "_hetsync_in_fit", False) and not self.state.synced_this_epoch:
            self.state.synced_this_epoch = True
            self.state.sync_point()

    def on_epoch_end(self, epoch, logs=None):
        if not self.state.synced_this_epoch:
            self.state.synced_this_epoch = True
            self.state.sync_point()

    def on_train_end(self, logs=None):
        self._hear_last()
        self.state.end_fit()
        if self.state.family is not None:
            trace_ahead.settle(self.state.family, _runtime.timeout())
        self._leave_train_function()

    def _leave_train_function(self):
        """Between fits the model keeps a train function that refuses to run outside ``hetsync.keras.fit``: Keras
        reuses a compiled train function, so a later plain ``model.fit`` would otherwise train without the
        training layer (training/front_door.py)."""
        model = self.model
        fn = getattr(model.train_function, "_hetsync_inner", model.train_function)

        def train_function(iterator):
            if not front_door.is_open("fit"):
                raise ValueError(front_door.FIT_REFUSAL)
            return fn(iterator)

        train_function._hetsync_inner = fn
        model.train_function = train_function

    # -- live switches ------------------------------------------------------------------------------------------
    def _report(self):
        """After each step (switchboard.py, "Report cadence"): hear the Switch Board's answer to the report sent a
        step ago, carry out its decision at its step, and send the report for the next multiple of
        ``family.report_every`` one step ahead of it.  The board places the rank at the report's position, so a
        decision's step is still ahead of the rank when it hears (board.py); the answer travels while the step
        computes instead of stalling the rank (SwitchClient.report_ahead)."""
        state = self.state
        family = state.family
        every = family.report_every
        if self._ahead is not None and self._ahead[0] <= state.position:
            self._hear(self._ahead[1].result(), trace=True)
            self._ahead = None
        d = family.pending
        if d is not None:
            if state.position > d.at:
                raise RuntimeError(f"hetsync: rank {_hvd().rank()} is at step {state.position}, past switch {d.id}'s "
                                   f"step {d.at} (Switch Board protocol broken)")
            if state.position == d.at:
                self.switch_to(d.mode, json.loads(d.options_json), d.reason, d.id)
                family.applied, family.pending = d.id, None
                # Every rank passed the switch's consensus round: say so now, so the board takes the next request.
                self.board.report(state.position, family.applied, d.mode, d.options_json, (), every)
        if (state.position + 1) % every == 0:
            mode, options = family.current
            samples = state.clock.take_samples() if family.auto is not None else ()
            position = state.position + 1
            self._ahead = (position, self.board.report_ahead(position, family.applied, mode, options, samples, every))

    def _hear(self, d, trace):
        """The board's answer: a decision this rank has yet to carry out becomes ``family.pending``; with steps to
        go (and ``trace``: a fit in progress), the new mode's step is traced meanwhile (trace_ahead.py)."""
        state, family = self.state, self.state.family
        if d.id and d.id > family.applied:
            family.pending = d
            if trace and state.position < d.at:
                trace_ahead.start(family, d.mode, json.loads(d.options_json), self.model, state.iterator)

    def _hear_last(self):
        """At the fit's end: the answer to a report sent ahead of a step this fit did not run (its decision waits
        for the next fit's step, as a decision heard at a report does)."""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._hear(ahead[1].result(), trace=False)

    def _trace_scheduled(self):
        """After an epoch's first step: a schedule's switch at the next epoch's start is known on every rank, so
        that mode's step is traced in a thread while this epoch trains (trace_ahead.py), as a request's is once a
        rank hears of it; the switch takes it.  The first step has given Keras' iterator and built its metrics."""
        state = self.state
        target = self._scheduled(self.epoch + 1) if state.family is not None else None
        if target is None or self.epoch + 1 >= self.params["epochs"] or key_of(*target) == state.family.current:
            return
        trace_ahead.start(state.family, target[0], target[1], self.model, state.iterator)

    def switch_to(self, mode, options, reason, decision_id=None):
        """Collective: every rank calls it at the same point (hetsync/switching.py)."""
        began = time.monotonic()
        record = switching.perform(self.state, mode, options, reason, decision_id)
        if record is None:  # refused on every rank at the roll call: the mode in force goes on
            return None
        self.adopt(self.state.algorithm)
        self.state.job.rebase()
        self.state.clock.sync(time.monotonic() - began)
        return record

    def _epoch_target(self, epoch):
        """(mode, options) this epoch starts in, and why (None: the mode in force goes on).  A schedule's entry for
        the epoch; at the fit's first epoch, without one: the mode a loaded checkpoint was saved in, else the
        latest earlier schedule entry no fit of this process went through (a restarted script resumes at
        ``initial_epoch`` in the mode its schedule had put in force)."""
        first, self.first_epoch = self.first_epoch, False
        schedules = [cb for cb in self.user_callbacks if isinstance(cb, hooks.SwitchSchedule)]
        entry = self._scheduled(epoch)
        missed = [m for m in (cb.missed_before(epoch) for cb in schedules) if m is not None] if first else []
        for cb in schedules:  # from here on, a later fit of this process counts these epochs as gone through
            cb.carried.update(e for e in cb.schedule if e <= epoch)
        if entry is not None:
            return entry, f"schedule: epoch {epoch}"
        if first and self.resumed is not None:
            return self.resumed, "resumed in the mode in force when the checkpoint was saved"
        if missed:
            at, target = max(missed, key=lambda m: m[0])
            return target, f"schedule: epoch {at} (the fit starts at epoch {epoch})"
        return None, None

    def _scheduled(self, epoch):
        """A SyncModeCallback schedule's entry for ``epoch`` (every rank has the same schedule: no negotiation)."""
        for cb in self.user_callbacks:
            schedule = cb.schedule if isinstance(cb, hooks.SwitchSchedule) else None
            if schedule and epoch in schedule:
                return schedule[epoch]
        return None


class StopVote(tf.keras.callbacks.Callback):
    """Last in ``fit``'s callback list: one rank's ``stop_training`` becomes idle steps; every rank leaves ``fit``
    together at the Job Clock's stop step (mid-epoch), or at an epoch end where every rank wants to stop."""

    def __init__(self, head):
        super().__init__()
        self.head = head
        self.votes = 0

    def on_train_begin(self, logs=None):
        self.model._hetsync_in_fit = True

    def on_train_batch_end(self, batch, logs=None):
        state = self.head.state
        if self.model.stop_training and not state.stop_due():  # a time budget... on this rank only
            self.model.stop_training = False
            state.become_idle()
        if state.stop_due():
            self.model.stop_training = True  # every rank, after the same Keras step

    def on_epoch_end(self, epoch, logs=None):
        state = self.head.state
        if state.stop_due() or epoch >= self.params["epochs"] - 1:
            # No vote where every rank leaves fit here anyway: at the agreed stop step, or at the fit's last epoch
            # (fit agreed on ``epochs`` across ranks, keras_fit.py).  Each Horovod collective waits for the slowest
            # rank's background thread; a rank that wants to stop here needs no idle steps, none are left.
            return
        hvd = _hvd()
        wants_stop = bool(self.model.stop_training) or state.idle
        everyone = hvd.allreduce(tf.constant(1.0 if wants_stop else 0.0), op=hvd.Min,
                                 name=f"hetsync.stopvote.{self.votes}")
        self.votes += 1
        if float(everyone) >= 1.0:
            self.model.stop_training = True  # every rank stops here, at the same epoch
        elif wants_stop:
            self.model.stop_training = False
            state.become_idle()

    def on_train_end(self, logs=None):
        self.model._hetsync_in_fit = False
