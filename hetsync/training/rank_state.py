"""One rank's Keras face of the lifecycle: what a Keras step does, sync points, the agreed stop (README "Guarantees").

The rank's lifecycle (states, the engine's availability, withdrawing and rejoining, the Job Clock's stops) is
training/lifecycle.py; this module drives it from ``Model.fit`` (through training/callbacks.py) and keeps no flags of
its own:

* training: a Keras step is run by :meth:`RankState.keras_step`, which knows how the mode's ranks step
  (job_epochs.py);
* stopped (a time budget, EarlyStopping alone, ``stop_training`` on this rank) while others train on: the rank keeps
  stepping through the same Keras steps, so every callback and every user collective runs as often as on the
  others, but trains nothing (a synchronous mode's steps contribute a zero gradient).  Once every rank has stopped
  the Job Clock names the step after which all leave ``fit`` together (coordinator/job_clock/clock.py): the job ends a
  few steps after its last stop, however long the epoch;
* out for the rest of the epoch: uneven shards in a synchronous mode with per-rank epochs (the rank's own
  ``steps_per_epoch`` is over: idle steps until the epoch's sync point);
* sync points (epoch end: one Horovod average of the models, who stopped) and the end of ``fit``.
"""
import logging
import time

from hetsync import trace_ahead
from hetsync.training.consensus import sync_point
from hetsync.training.lifecycle import Lifecycle
from hetsync.training.step_clock import StepClock

log = logging.getLogger("hetsync.training")

_PROCESS = {"position": 0, "last_rounds": 0}


def position():
    """Keras steps of this process's hetsync fits so far (the same on every rank at the same step)."""
    return _PROCESS["position"]


def align_position(positions):
    """At a fit's or a custom loop's start, with every rank's position (its agreement's gather): every rank goes
    on from the largest.
    A custom loop in a mode whose ranks step at their own pace leaves the ranks at different counts, and a fit's
    Switch Board decisions and agreed stop name steps by this count, the same on every rank."""
    _PROCESS["position"] = max(max(positions), _PROCESS["position"])


def last_rounds():
    """Sync points (epoch ends, mid-epoch rounds, the end round) of the last hetsync ``fit`` on this rank."""
    return _PROCESS["last_rounds"]


class RankState:
    """Where this rank is, what it does in a Keras step, and the job-wide agreements it takes part in."""

    def __init__(self, algorithm, model, job, job_epochs=True, every="epoch", at_end=True, epochs=1):
        self.life = Lifecycle(algorithm, job)
        self.model, self.job = model, job
        self.job_epochs = bool(job_epochs)  # DistributedOptimizer(job_epochs=...): see job_epochs.py
        self.every, self.at_end = every, at_end   # consensus rounds: "epoch", N batches or None; at fit's end
        self.epochs = epochs      # average at every epochs-th epoch end (the others: sync points, no average)
        self.epoch_ends = 0       # epoch-end sync points of this fit
        self.averaged_last = True  # the latest sync point averaged the models (the end round need not)
        self.family = None        # hetsync.switching.Family of the model's optimizer
        self.verbose = True
        self.own_steps = None     # this rank's steps per epoch when fewer than the job's (per-rank epochs)
        self.synced_this_epoch = False  # the epoch's sync point ran (before validation, or at the epoch's end)
        self.batch = 0            # Keras steps in this epoch
        self.fit_steps = 0        # Keras steps in this fit
        self.rounds = 0           # sync points of this fit
        self.steps_since_sync = 0
        self.hooks = []           # callbacks acting per train step (hetsync.testing.SlowdownCallback, EmulatedComputeCallback)
        self.clock = StepClock()
        self.after_step = None    # called after the first Keras step (sync="auto": pretrace)
        self.iterator = None      # the fit's data iterator, as its last Keras step had it (trace_ahead.py)
        self.report = None        # training/report.py ReportFeed, when any rank has a HeterogeneityReportCallback
        self.broadcast_from = None  # the user's Horovod broadcast callback, honoured at fit start (initial_state.py)
        self.saved_modes = []     # every rank's saved-mode code (training/saved_mode.py), from fit's agreement
        self.shape_rows = []      # every rank's initial_state.shape_row, from fit's agreement
        self.switching_wanted = False  # live switches in this fit (options.check_switching), from fit's agreement

    # -- the state (training/lifecycle.py) --------------------------------------------------------------------------
    @property
    def state(self):
        return self.life.state

    @property
    def idle(self):
        """Stopped: steps through the rest of fit without training."""
        return self.life.stopped

    @property
    def out_for_epoch(self):
        return self.life.out

    @property
    def algorithm(self):
        return self.life.algorithm

    @algorithm.setter
    def algorithm(self, algorithm):
        self.life.algorithm = algorithm

    @property
    def position(self):
        return _PROCESS["position"]

    @property
    def split_wanted(self):
        """Someone reads each step's compute apart from its waiting: sync="auto" (the Switch Board's samples) or a
        heterogeneity report."""
        return self.report is not None or self.auto_wanted

    @property
    def auto_wanted(self):
        """sync="auto"'s policy gets this rank's samples."""
        return self.family is not None and self.family.auto is not None

    @property
    def stepping(self):
        return self.algorithm.STEPPING

    def adopt(self, algorithm):
        """Makes ``algorithm`` the one this rank runs (at the start, and after each live switch)."""
        self.algorithm = algorithm
        self.clock.warm_up()
        if self.stepping == "rounds":
            algorithm.attach(self.model, self.hooks)

    # -- fit / epoch boundaries ---------------------------------------------------------------------------------
    def begin_fit(self):
        self.fit_steps = self.epoch_ends = 0
        self.averaged_last = True
        self.steps_since_sync = 0
        self.life.begin()

    def begin_epoch(self, total, keras_steps):
        """A new epoch of ``keras_steps`` Keras steps (``total`` train steps of the job, in job epochs)."""
        self.batch = 0
        self.job.begin_epoch(total, keras_steps)
        self.algorithm.on_epoch_begin()
        self.life.back_for_epoch()

    def end_fit(self):
        """Every rank leaves fit at the same step, so this round is global too: idle ranks rejoin here."""
        self.life.end(lambda: self.sync_point(final=True))
        _PROCESS["last_rounds"] = self.rounds
        self.clock.close()
        self.iterator = None

    # -- one Keras step -----------------------------------------------------------------------------------------
    def keras_step(self, fn, iterator):
        """Runs one Keras step with ``fn`` (Keras' compiled train function); returns Keras' logs."""
        self.iterator = iterator
        self.batch += 1
        self.fit_steps += 1
        _PROCESS["position"] += 1
        if self.own_steps is not None and self.batch > self.own_steps and not self.life.out:
            log.debug("epoch has %d steps here: idle steps to the end of the epoch", self.own_steps)
            self.life.leave_for_epoch()
        try:
            logs = self._dispatch(fn, iterator)
        finally:
            self.job.end_step()
        if self.after_step is not None:
            began = time.monotonic()
            self.after_step(iterator)
            self.clock.sync(time.monotonic() - began)
        return logs if logs is not None else self.metric_logs()

    def _dispatch(self, fn, iterator):
        stopped, job = self.life.withdrawn, self.job
        if self.stepping == "own" and self.job_epochs:
            if job.stop_at is not None:  # every rank stopped: empty steps to the stop step
                return None
            if stopped:
                job.wait_for_slice(self.position, self.life.wait_for_others)
                return None
            return job.claim_and_run(self.position, lambda: self._train_step(fn, iterator),
                                     first=self.fit_steps == 1)
        self.life.still_stopped(self.position)  # (out for the epoch is not stopped)
        rounds = self.stepping == "rounds"
        if rounds and self.job_epochs and job.full():
            return None  # the same on every rank: the count comes from the rounds' allreduce
        if stopped:
            logs = self.algorithm.idle_step(fn, iterator)
        elif rounds:
            logs = self._timed(lambda: self.algorithm.run_step(fn, iterator), rounds=True)
        else:
            logs = self._train_step(fn, iterator)
        if rounds and self.job_epochs:
            job.add_round(self.algorithm.last_job_steps())
        return logs

    def _train_step(self, fn, iterator):
        def one():
            for hook in self.hooks:  # an injected slowdown is compute: inside the step
                hook.on_local_iteration_begin()
            logs = fn(iterator)
            for hook in self.hooks:
                hook.on_local_iteration_end()
            return logs

        return self._timed(one, rounds=False)

    def _timed(self, run, rounds):
        self.life.step_begins()
        starved_from = self.clock.run_delay() if self.auto_wanted else None  # sync="auto" tells starved from slow
        tracing = self.auto_wanted and trace_ahead.tracing(self.family)  # (only auto reads samples; a trace starts
        # between steps: at a report, or after an epoch's first step for a schedule's switch)
        wall, began = time.time(), time.monotonic()
        try:
            logs = run()
        finally:
            self.life.step_ends()
        self.clock.step(self.algorithm, wall, began, time.monotonic(), rounds, split=self.split_wanted,
                        delay_start=starved_from, own_work=tracing)
        self.steps_since_sync += 1
        return logs

    def metric_logs(self):
        """Keras' metrics as they stand (a Keras step that trained nothing here)."""
        return {m.name: m.result() for m in self.model.metrics}

    def stop_due(self):
        """True at the agreed stop step: every rank leaves fit after it."""
        return self.job.stop_at is not None and self.position >= self.job.stop_at

    # -- idle and sync points -----------------------------------------------------------------------------------
    def become_idle(self):
        """This rank stopped while others train on: withdraw from hetsync's collectives, tell the Job Clock."""
        self.life.stop(self.position)

    def _averages(self, final, mid_epoch):
        """Epoch ends average unless ConsensusCallback(every=None), and only every ``epochs``-th one; mid-epoch rounds
        always; the end round when ``at_end`` and the last sync point did not average already."""
        if final:
            average = self.at_end and (self.every is None or not self.averaged_last)
        elif mid_epoch:
            average = True
        else:
            self.epoch_ends += 1
            average = self.every is not None and self.epoch_ends % self.epochs == 0
        self.averaged_last = average
        return average

    def sync_point(self, final=False, mid_epoch=False):
        """Global: every rank calls it at the same Keras steps (idle ranks included).  A rank out for the rest of
        this epoch (uneven shards) stays out of hetsync's collectives after a mid-epoch round, and rejoins at the
        epoch end."""
        began = time.monotonic()
        self.life.sync_point_begins()
        weight = 1.0 if self.steps_since_sync > 0 else 0.0
        average = self._averages(final, mid_epoch)
        out = self.idle or (mid_epoch and self.out_for_epoch)
        sync_point(self.model, self.algorithm, idle=out, weight=weight, average=average,
                   name=f"hetsync.sync.{self.rounds}")
        if self.report is not None:  # every rank's report records reach the rank that writes them
            self.report.exchange(self)
        self.rounds += 1
        self.steps_since_sync = 0
        self.clock.sync(time.monotonic() - began)
        self.life.sync_point_ends()
