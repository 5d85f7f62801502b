"""Custom training loops: ``hetsync.job_steps``, the loop's counterpart of what ``Model.fit`` gets by itself.

Horovod's TF2 example (``tensorflow2_mnist.py``) with the optimizer line changed and ``DistributedGradientTape``
dropped, iterates ``hetsync.job_steps`` instead of ``dataset.take(N)`` and ends with ``steps.finish()``::

    steps = hetsync.job_steps(dataset, 10000 // hvd.size(), model, opt)
    for batch, (images, labels) in enumerate(steps):
        loss_value = training_step(images, labels, batch == 0)
        if out_of_time():
            steps.stop()                 # this rank stops; the loop ends when the job says so
    steps.finish()                       # one model on every rank

What it does, by how the mode's ranks step (``SyncAlgorithm.STEPPING``):

* ``"own"`` (Ripples, eager-SGD, Hop): the loop's budget is the job's ``sum(N_r)`` train steps, shared by speed
  (the Job Clock, coordinator/job_clock/clock.py): each batch is claimed first, so a fast rank takes more.  A rank that
  stops, or finds the budget spent, leaves its loop at once and withdraws from hetsync's collectives, so nobody waits
  for it.  Each step's exchange marks the rank BETWEEN when it is done (the lifecycle's ``left_exchange``), so a Horovod collective
  later in the step -- the first step's ``broadcast_variables`` -- never deadlocks a peer's P-Reduce.
* ``"lockstep"`` (allreduce, od-sgd): every rank yields ``max N_r`` batches; past its own ``N_r``, or after
  ``stop()``, a rank's batches are idle steps (its gradients count zero: Horovod's join semantics), until the job's
  stop step once every rank has stopped (the Job Clock, as in ``fit``).  So per-step collectives always pair.
* ``"rounds"`` (ESync): between two batches the iterator asks the State Server whether the round is over and runs
  the round's aggregation; the aggregation's allreduce counts the job's train steps and the ranks that trained, so
  every rank leaves after the same round: when the budget is spent, or when nobody trained in a round.

``finish()`` is the global end (a Horovod collective on every rank): the models are averaged, weighted by whether
the rank trained since the last average, and every rank is back in hetsync's collectives for the next loop or fit.
"""
import logging
import time

from hetsync import _runtime, compat, marks
from hetsync.algorithms import _wrap as exchange
from hetsync.coordinator.job_clock import GRANTS
from hetsync.training import front_door, options, rank_state
from hetsync.training.consensus import sync_point
from hetsync.training.keras_fit import job_epochs_client
from hetsync.training.lifecycle import Lifecycle, State

log = logging.getLogger("hetsync.training")
_LOOP = {"active": None}  # the JobSteps whose loop is running in this process


class JobSteps:
    """Iterates a custom loop's batches under the job's step budget (see the module docstring)."""

    def __init__(self, data, steps, model, optimizer):
        _runtime.require_init("hetsync.job_steps")
        self.algorithm = marks.algorithm_of(optimizer)
        if self.algorithm is None:
            raise ValueError("hetsync.job_steps needs the optimizer hetsync.DistributedOptimizer returned, got "
                             f"{type(optimizer).__name__}")
        if self.algorithm.NO_CUSTOM_LOOPS:  # the same mode on every rank: every rank raises, before any collective
            raise ValueError(self.algorithm.NO_CUSTOM_LOOPS)

        refusal = compat.loop_problem(optimizer)  # sync="auto" (docs/compatibility.md)
        if refusal:
            raise ValueError(refusal)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps must be a positive int (this rank's steps: Horovod's N // size), got {steps!r}")
        self.model, self.optimizer, self.data = model, optimizer, data
        self.own = steps
        self.job = job_epochs_client()
        self.job.begin_fit()  # before the first collective (job_clock.JobClock.resume)

        rows = options.gather("job_steps", [steps, rank_state.position()])
        rank_state.align_position(r[1] for r in rows)  # an earlier own-pace loop left the counts apart
        self.longest, self.total = max(r[0] for r in rows), sum(r[0] for r in rows)
        self.job.begin_epoch(self.total, 1)
        self.stepping = self.algorithm.STEPPING
        self._iterator = iter(data)
        self.yielded = 0          # batches this loop gave out
        self.trained = 0          # of them, train steps (not idle)
        self._round_k, self._step_began = 0, None
        self.life = Lifecycle(self.algorithm, self.job)  # stopped, out, left: training/lifecycle.py
        self.life.begin()
        if self.stepping == "rounds":
            self.algorithm.begin_loop(model)
        if _LOOP["active"] is not None:  # an earlier loop left without ending (an exception in it)
            front_door.leaving("loop")
        _LOOP["active"] = self
        exchange.on_exchange_done(self.life.left_exchange)  # each step's exchange reports from the graph
        front_door.entering("loop")  # hvd.DistributedGradientTape in this loop: refused or warned (front_door.py)

    def __iter__(self):
        return self

    # -- the loop -----------------------------------------------------------------------------------------------
    @property
    def stopped(self):
        """``stop()`` was called."""
        return self.life.stop_requested

    @property
    def ended(self):
        return self.life.state in (State.LEFT, State.ENDED)

    def __next__(self):
        if self.ended:
            raise StopIteration
        self.life.step_ends()  # the previous step is over
        if not self._another():
            self._end()
            raise StopIteration
        batch = self._next_batch()
        self.yielded += 1
        rank_state._PROCESS["position"] += 1
        self._step_began = time.monotonic()
        if not self.life.withdrawn:
            self.trained += 1
            self.life.step_begins()
        return batch

    def _next_batch(self):
        try:
            return next(self._iterator)
        except StopIteration:  # a finite shard: start it again (fast ranks take more batches than it holds)
            self._iterator = iter(self.data)
            return next(self._iterator)

    def _another(self):
        """Whether the loop goes on, and whether this batch trains or is idle."""
        if self.stepping == "own":
            if self.stopped:
                self.life.stop(rank_state.position())
                return False
            status, _, _ = self.job.client.claim(self.job.epoch, 0, rank_state.position() + 1, self.job.plan,
                                                 force=self.yielded == 0)  # Horovod's first-step broadcast
            return status in GRANTS
        if self.stepping == "rounds":
            return self._round_another()
        return self._lockstep_another()

    def _lockstep_another(self):
        position = rank_state.position() + 1
        if self.yielded >= self.longest:
            return False
        if self.stopped and not self.life.stopped:
            self.life.stop(position - 1)
        else:
            self.life.still_stopped(position - 1)
        if self.yielded >= self.own:  # past its own N: idle steps (a zero gradient) while others go on
            self.life.leave_for_epoch()
        return self.job.stop_at is None or position <= self.job.stop_at

    def _round_another(self):
        """ESync: the last batch was a local iteration; end the round when the State Server says READY."""
        alg = self.algorithm
        if self._round_k > 0 and not self.stopped:
            ended = time.monotonic()
            if alg.round_ready(self._round_k, ended - self._step_began, ended):
                self._finish_round(active=1.0)
        if self.stopped:
            if not self.life.stopped:
                if self._round_k > 0:
                    self._finish_round(active=1.0)
                # away for the State Server too: its roll calls do not wait for this rank; the rounds' allreduce
                # counts the stop, not the Job Clock
                self.life.stop(rank_state.position(), tell=False)
            while self.job.count < self.total:  # idle rounds: the others' aggregations need this rank's allreduce
                if self._finish_round(active=0.0) == 0:
                    return False  # nobody trained in that round: every rank stopped, all leave after it
            return False
        if self.job.count >= self.total:  # counted at a round's end: no round is half done here
            return False
        self._round_k += 1
        return True

    def _finish_round(self, active):
        trained = self.algorithm.finish_round(active, self._round_k if active else 0)
        self.job.add_round(self.algorithm.last_job_steps())
        self._round_k = 0
        return trained

    def stop(self):
        """This rank stops training (a time budget, its own criterion).  ``own`` modes: its loop ends now; the
        others take over its share.  Other modes: its loop goes on with idle steps (lockstep) or idle rounds (ESync)
        until the job agrees to end, so collectives pair up.  It takes effect at the loop's next batch."""
        if not self.stopped:
            log.debug("job_steps: this rank stopped after %d batches", self.yielded)
            self.life.request_stop()

    def _end(self):
        if _LOOP["active"] is self:
            front_door.leaving("loop")
        _LOOP["active"] = None
        exchange.on_exchange_done(None)
        self.life.leave_loop(rank_state.position() + 1)  # own modes: at the position of the refused claim

    def finish(self):
        """Global (every rank calls it once, after its loop): one Horovod average of the models, then every rank is
        back in hetsync's collectives.  Returns the number of batches this rank trained on."""
        if not self.ended:  # the user left the loop early (break): the same as running out of budget
            self._end()
        self.life.end(lambda: sync_point(self.model, self.algorithm, idle=False,
                                         weight=1.0 if self.trained else 0.0, name=f"hetsync.loop.{self.job.epoch}"))
        return self.trained


def job_steps(data, steps, model, optimizer):
    """A custom loop's batches under the job's step budget: see hetsync/training/loop.py.

    Args:
      data: a ``tf.data.Dataset`` (or any iterable) of this rank's batches; a finite one is started again when
        it runs out.
      steps: this rank's steps, Horovod's ``N // hvd.size()`` (they may differ between ranks).
      model: the Keras model the loop trains (the end's average, ESync's aggregation).
      optimizer: what ``hetsync.DistributedOptimizer`` returned.
    """
    return JobSteps(data, steps, model, optimizer)
