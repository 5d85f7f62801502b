"""One rank's training state machine: the single home of the absent-rank rule (README "Guarantees").

States (``RankState.state``):

* ``active``: training.  Inside a train step the engine marks the rank IN_STEP (peers wait for it: it is coming);
  between steps BETWEEN (if it stays out longer than ``away_after``, e.g. blocked in a user's ``hvd.allreduce``,
  peers go on without it).
* ``idle``: the rank stopped (a time budget, EarlyStopping alone, ``stop_training`` on this rank) while others
  train on.  It keeps stepping through the same Keras steps, so every callback and every user collective runs as
  often as on the others, but trains nothing: pinned AWAY from hetsync's collectives; a synchronous mode's steps
  contribute a zero gradient.  It tells the Job Clock, and once every rank has stopped the clock names the step
  after which all leave ``fit`` together (coordinator/job_clock.py): the job ends a few steps after its last stop,
  however long the epoch.
* ``away``: in a sync point (epoch end: one Horovod average of the models, who stopped), a switch, or waiting for
  its slice of a job epoch.  AWAY at once.
* ``out`` for the rest of the epoch: uneven shards in a synchronous mode with per-rank epochs (the rank's own
  ``steps_per_epoch`` is over: idle steps until the epoch's sync point).
* ``finished``: ``fit`` has ended (all ranks together); outside ``fit`` plain ops are not gated.

``Model.fit`` drives it through training/callbacks.py; a Keras step is run by :meth:`RankState.keras_step`, which
knows how the mode's ranks step (job_epochs.py).
"""
import logging
import time

from hetsync.training.step_clock import StepClock

log = logging.getLogger("hetsync.training")

ACTIVE, IDLE, AWAY, OUT, FINISHED = "active", "idle", "away", "out", "finished"
_PROCESS = {"position": 0, "last_rounds": 0}


def position():
    """Keras steps of this process's hetsync fits so far (the same on every rank at the same step)."""
    return _PROCESS["position"]


def last_rounds():
    """Sync points (epoch ends, mid-epoch rounds, the end round) of the last hetsync ``fit`` on this rank."""
    return _PROCESS["last_rounds"]


class RankState:
    """Where this rank is, what it does in a Keras step, and the job-wide agreements it takes part in."""

    def __init__(self, algorithm, model, job, job_epochs=True, every="epoch", at_end=True, epochs=1):
        self.algorithm, self.model, self.job = algorithm, model, job
        self.job_epochs = bool(job_epochs)  # DistributedOptimizer(job_epochs=...): see job_epochs.py
        self.every, self.at_end = every, at_end   # consensus rounds: "epoch", N batches or None; at fit's end
        self.epochs = epochs      # average at every epochs-th epoch end (the others: sync points, no average)
        self.epoch_ends = 0       # epoch-end sync points of this fit
        self.averaged_last = True  # the latest sync point averaged the models (the end round need not)
        self.family = None        # hetsync.switching.Family of the model's optimizer
        self.verbose = True
        self.idle = False         # stopped; steps through the rest of fit without training
        self.out_for_epoch = False
        self.own_steps = None     # this rank's steps per epoch when fewer than the job's (per-rank epochs)
        self.away = False
        self.finished = False
        self.batch = 0            # Keras steps in this epoch
        self.fit_steps = 0        # Keras steps in this fit
        self.rounds = 0           # sync points of this fit
        self.steps_since_sync = 0
        self.hooks = []           # callbacks acting per train step (hetsync.testing.SlowdownCallback, EmulatedComputeCallback)
        self.clock = StepClock()
        self.after_step = None    # called after the first Keras step (sync="auto": pretrace)
        self.report = None        # training/report.py ReportFeed, when any rank has a HeterogeneityReportCallback

    # -- the state ----------------------------------------------------------------------------------------------
    @property
    def state(self):
        if self.finished:
            return FINISHED
        if self.away:
            return AWAY
        if self.idle:
            return IDLE
        return OUT if self.out_for_epoch else ACTIVE

    @property
    def position(self):
        return _PROCESS["position"]

    @property
    def stepping(self):
        return self.algorithm.STEPPING

    def adopt(self, algorithm):
        """Makes ``algorithm`` the one this rank runs (at the start, and after each live switch)."""
        self.algorithm = algorithm
        if self.stepping == "rounds":
            algorithm.attach(self.model, self.hooks)

    # -- fit / epoch boundaries ---------------------------------------------------------------------------------
    def begin_fit(self):
        from hetsync import ops

        self.idle = self.out_for_epoch = self.away = self.finished = False
        self.fit_steps = self.epoch_ends = 0
        self.averaged_last = True
        ops.pin_away(False)
        self.steps_since_sync = 0
        ops.set_availability(ops.BETWEEN)

    def begin_epoch(self, total, keras_steps):
        """A new epoch of ``keras_steps`` Keras steps (``total`` train steps of the job, in job epochs)."""
        from hetsync import ops

        self.batch = 0
        self.job.begin_epoch(total, keras_steps)
        self.algorithm.on_epoch_begin()
        if self.out_for_epoch:
            self.out_for_epoch = False
            if not self.idle:  # the epoch-end sync point rejoined hetsync's collectives; the mode's state comes back
                ops.pin_away(False)
                self.algorithm.on_resume()
                ops.set_availability(ops.BETWEEN)

    def end_fit(self):
        """Every rank leaves fit at the same step, so this round is global too: idle ranks rejoin here."""
        from hetsync import ops

        was_idle, self.idle = self.idle, False
        self.out_for_epoch = False
        ops.pin_away(False)
        self.sync_point(final=True)
        if was_idle:
            self.algorithm.on_resume()
        self.finished = True
        _PROCESS["last_rounds"] = self.rounds
        ops.set_availability(ops.IN_STEP)  # outside fit, plain ops.p_reduce calls are not gated

    # -- one Keras step -----------------------------------------------------------------------------------------
    def keras_step(self, fn, iterator):
        """Runs one Keras step with ``fn`` (Keras' compiled train function); returns Keras' logs."""
        self.batch += 1
        self.fit_steps += 1
        _PROCESS["position"] += 1
        if self.own_steps is not None and self.batch > self.own_steps and not self.out_for_epoch:
            self._leave_for_epoch()
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
        stopped, job = self.idle or self.out_for_epoch, self.job
        if self.stepping == "own" and self.job_epochs:
            if job.stop_at is not None:  # every rank stopped: empty steps to the stop step
                return None
            if stopped:
                job.wait_for_slice(self.position, self._set_away)
                return None
            return job.claim_and_run(self.position, lambda: self._train_step(fn, iterator),
                                     first=self.fit_steps == 1)
        if self.idle and job.stop_at is None:  # (out for the epoch is not stopped)
            job.report_stop(self.position)
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
        from hetsync import ops

        ops.set_availability(ops.IN_STEP)
        wall, began = time.time(), time.monotonic()
        try:
            logs = run()
        finally:
            ops.set_availability(ops.BETWEEN)
        self.clock.step(self.algorithm, wall, began, time.monotonic(), rounds)
        self.steps_since_sync += 1
        return logs

    def _set_away(self):
        from hetsync import ops

        ops.set_availability(ops.AWAY)

    def metric_logs(self):
        """Keras' metrics as they stand (a Keras step that trained nothing here)."""
        return {m.name: m.result() for m in self.model.metrics}

    def stop_due(self):
        """True at the agreed stop step: every rank leaves fit after it."""
        return self.job.stop_at is not None and self.position >= self.job.stop_at

    # -- idle and sync points -----------------------------------------------------------------------------------
    def _leave_for_epoch(self):
        from hetsync import ops

        self.out_for_epoch = True
        if not self.idle:
            log.debug("epoch has %d steps here: idle steps to the end of the epoch", self.own_steps)
            ops.pin_away(True)
            self.algorithm.on_idle()

    def become_idle(self):
        """This rank stopped while others train on: withdraw from hetsync's collectives, tell the Job Clock."""
        from hetsync import ops

        if self.idle:
            return
        log.debug("rank stopped: idle steps from now on")
        ops.pin_away(True)
        self.idle = True
        if not self.out_for_epoch:
            self.algorithm.on_idle()
        self.job.report_stop(self.position)

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
        from hetsync import ops
        from hetsync.training.consensus import sync_point

        began = time.monotonic()
        self.away = True
        ops.set_availability(ops.AWAY)
        weight = 1.0 if self.steps_since_sync > 0 else 0.0
        average = self._averages(final, mid_epoch)
        out = self.idle or (mid_epoch and self.out_for_epoch)
        sync_point(self.model, self.algorithm, idle=out, weight=weight, average=average,
                   name=f"hetsync.sync.{self.rounds}")
        if self.report is not None:  # every rank's report records reach the rank that writes them
            self.report.exchange(self)
        self.rounds += 1
        self.steps_since_sync = 0
        self.away = False
        self.clock.sync(time.monotonic() - began)
        if not out:
            ops.set_availability(ops.BETWEEN)
