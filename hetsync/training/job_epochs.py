"""Job epochs on one rank: a Keras step is a slice of the job's epoch (coordinator/job_clock/clock.py explains the rule).

Horovod's ``steps_per_epoch = N`` per rank stays what Keras sees: every rank runs the same Keras steps, so
callbacks, a user's per-batch Horovod collectives, learning-rate schedules and the progress bar line up.  What
changes is what one Keras step does, by how the mode's ranks step (``SyncAlgorithm.STEPPING``):

* ``"own"`` (Ripples, eager-SGD, Hop): the rank claims train steps from the Job Clock one at a time and runs each
  (the compiled Keras train step: one batch) until its Keras step's slice of the epoch is full.  A fast rank runs
  several, a slow one none when its previous one outlasted several slices.  A stopped rank claims nothing: it
  waits, away from every hetsync collective, until the ranks still training fill the slice.
* ``"rounds"`` (ESync): a Keras step is one round of local iterations; the round's allreduce tells every rank how
  many train steps the job took in it, so every rank skips the same Keras steps while the count is ahead.
* ``"lockstep"`` (allreduce, od-sgd): one train step per rank per Keras step, as in Horovod.

With ``job_epochs=False`` (a DistributedOptimizer option) every rank runs N train steps per epoch, as before.
"""
import logging
import time

from hetsync.coordinator.job_clock import FULL, GRANTED, GRANTS, EpochPlan, passes_to

log = logging.getLogger("hetsync.training")

WAIT_SLICE_S = 1.0  # a stopped rank's longest wait per call: it re-asks, so a hung job is noticed by its timeout


class JobEpochs:
    """One rank's view of the job's epochs: the plan, its position in the epoch, and the Job Clock calls."""

    def __init__(self, client, timeout):
        self.client, self.timeout = client, float(timeout)
        self.plan = None      # EpochPlan of the current epoch
        self.epoch = -1       # the ranks' common count of hetsync Keras epochs
        self.step = 0         # Keras step in the epoch (0-based) the rank is in
        self.count = 0        # the job's train steps in this epoch, as last heard
        self.stop_at = None   # the agreed stop step (cumulative Keras steps), once every rank has stopped
        self.floor = 0        # after a live switch: the count the epoch's earlier Keras steps stand for
        self.pass_to = -1     # the last Keras step (cumulative) known full: passed without a call (clock.passes_to)

    def begin_fit(self):
        """Before the fit's first collective, on every rank (job_clock.JobClock.resume)."""
        self.stop_at = None
        self.pass_to = -1
        self.client.resume()

    def begin_epoch(self, total, keras_steps):
        self.epoch += 1
        self.plan = EpochPlan(total, keras_steps) if total else None
        self.step, self.count, self.floor = 0, 0, 0

    def rebase(self):
        """A live switch before Keras step ``step``: the epoch's earlier Keras steps are done, whatever the old
        mode counted (a lockstep mode claims nothing), so the job's count is at least where they end -- the same
        on every rank, since every rank switches at the same step."""
        if self.plan is not None and self.step > 0:
            self.floor = self.plan.boundary(self.step - 1)
            self.count = max(self.count, self.floor)

    def full(self):
        """This Keras step's slice is full by what the rank last heard (``rounds`` modes count exactly)."""
        return self.count >= self.plan.boundary(self.step)

    def claim_and_run(self, position, run_one, first=False):
        """An active rank's Keras step (``own`` modes): claim and run train steps until the slice is full (or, while
        some rank is still in its first train step, until the clock stops granting: its head start).
        Returns the last step's logs, or None when the slice was already full.  ``first``: the fit's first Keras
        step, whose first train step every rank takes (job_clock.JobClock.claim's ``force``).  A step known full
        (``pass_to``) is passed without a call."""
        if position <= self.pass_to:
            return None
        logs = None
        while True:
            status, self.count, stop_at = self.client.claim(self.epoch, self.step, position, self.plan, force=first,
                                                            floor=self.floor)
            first = False
            self._heard(stop_at)
            ends = status == FULL or (status == GRANTED and self.full())  # AHEAD: claim again, the clock says when
            if ends:
                self.pass_to = passes_to(self.plan, self.step, position, self.count)
            if status in GRANTS:
                logs = run_one()
            if ends or status not in GRANTS:
                return logs

    def wait_for_slice(self, position, set_away):
        """A stopped rank's Keras step (``own`` modes): wait, away, until the slice is full or everyone stopped."""
        set_away()
        if position <= self.pass_to:
            return
        began = time.monotonic()
        while True:
            reached, stop_at = self.client.reached(self.epoch, self.step, position, self.plan, WAIT_SLICE_S)
            self._heard(stop_at)
            if reached:
                return
            if time.monotonic() - began > self.timeout:
                raise RuntimeError(f"hetsync: rank {self.client.worker} waited {self.timeout:g} s in Keras step "
                                   f"{self.step} of epoch {self.epoch} for the ranks still training to take "
                                   f"{self.plan.boundary(self.step)} train steps; the Job Clock says "
                                   f"{self.client.metrics()}")

    def report_stop(self, position):
        """This rank stopped training (during Keras step ``position``).  Also called again at each Keras step by a
        stopped rank that waits for nothing (lockstep and rounds modes, per-rank epochs): it keeps the rank's
        position current on the Job Clock and hears the stop step once every rank has stopped."""
        self._heard(self.client.stop(position))

    def _heard(self, stop_at):
        if stop_at is not None and self.stop_at is None:
            log.debug("every rank has stopped: leaving fit after Keras step %d", stop_at)
            self.stop_at = stop_at

    def end_step(self):
        self.step += 1

    def add_round(self, train_steps):
        """``rounds`` modes: the job took ``train_steps`` in the round that just ended (the same on every rank)."""
        self.count += int(train_steps)
