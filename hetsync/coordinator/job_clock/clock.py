"""The Job Clock: the job's count of train steps per epoch, and the agreed stop (README "Job epochs").

A plain state machine (no gRPC, no clock of its own); hetsync/coordinator/job_clock/service.py serves it on rank 0's
coordinator server and tests/test_job_clock.py checks it alone with hypothesis.

Why.  Horovod's convention is ``steps_per_epoch = N`` per rank, so an epoch is ``N x size`` samples of the job.  In
a mode whose ranks step at their own pace (Ripples, eager-SGD, Hop), making every rank run N steps would make the
fast ranks wait at every epoch end for the slow one.  So an epoch is the *job's* ``total`` steps (the sum of the
ranks' ``steps_per_epoch``), shared by speed.  Every rank still runs the same ``keras_steps`` Keras steps per epoch
(so callbacks, a user's per-batch Horovod collectives, LR schedules and progress bars line up), but Keras step k is
a *slice* of the job's epoch: it ends once the job's count reaches ``boundary(k) = ceil((k+1) * total / keras_steps)``.
A rank in step k *claims* one train step at a time; a claim is granted while the count is below the boundary.  A
fast rank takes several train steps in one Keras step, a slow rank whose one train step spanned several slices
finds its next Keras steps already full and passes them at once.  Nobody waits for a given rank: the count moves
as long as any rank trains.

**Head start.**  A rank's first train step of a fit traces its train function: seconds on a fast node, tens of
seconds on a throttled one, while the fast ranks would fill their slices and wait at the first collective of the
script (a user's allreduce every few batches, the epoch end) doing nothing.  So while some rank has not finished
its first train step (it has not called the clock again since its first claim, nor stopped), a claim past the
slice is still granted, and every grant is AHEAD (claim again, whatever the slice), up to the epoch's ``total``
and to half of it per rank (``ceil(total / 2)`` head-start grants per rank and fit: a rank ready long before the
others does not train the whole epoch alone, on its shard of the data).  The ranks that are ready train the epoch's
later slices in their current Keras step, and those Keras steps find their slices full when they come.  A cap of
each rank's own share (``total / size``) left a tracing rank's share untaken: the ready ranks took theirs, met the
script's next collective and waited there for the tracing rank, which then trained that share at its own pace.
The epoch is still exactly ``total`` train steps; what moves is which Keras step they are taken in.  In plain
Horovod every rank waits for the slowest one's first step (its trace included) in the first allreduce.

A rank that stopped (time budget, EarlyStopping, ``stop_training``) claims nothing; its Keras steps *wait* until
the count reaches their boundary, which the ranks still training bring about.  When every rank has stopped the
count cannot move any more: every wait returns at once from then on, and the clock names the **stop step**, one
past the largest Keras step any rank has started or *passes* (below).  Each rank starts every Keras step with a call
until it knows the stop step, but for the steps it passes, so no rank has started that step when it is named, and
each learns it no later than at its start.  Every rank leaves ``fit`` after that step: the same number of Keras
steps everywhere, a few after the last stop.

**Passing without a call.**  The count only grows, so a claim's answer that ends the rank's Keras step (FULL, or
GRANTED up to the slice's end) also tells it which of the epoch's next Keras steps are full already: it passes
them without asking (``passes_to``; the clock computes the same from the same answer and counts the rank as having
started them).  A slow rank whose one train step outlasted many slices passes them all for one call, instead of one
call each to a coordinator that may itself be throttled.

Epochs are numbered by the ranks (their count of hetsync Keras epochs, the same on every rank).  Positions are the
ranks' cumulative Keras step counts (training/rank_state.py), the same numbering the Switch Board uses.
"""
import math

GRANTED, AHEAD, FULL, STOPPED = "granted", "ahead", "full", "stopped"  # AHEAD: granted past the slice (head start)
GRANTS = (GRANTED, AHEAD)  # the claim's answers that grant a train step
REACHED, WAITING = "reached", "waiting"  # JobReached's answers


class EpochPlan:
    """One epoch's shape: ``total`` train steps of the job spread over ``keras_steps`` Keras steps."""

    __slots__ = ("total", "keras_steps")

    def __init__(self, total, keras_steps):
        if keras_steps < 1 or total < keras_steps:
            raise ValueError(f"an epoch of {total} job steps cannot fill {keras_steps} Keras steps")
        self.total, self.keras_steps = int(total), int(keras_steps)

    def boundary(self, step):
        """The job's count at which Keras step ``step`` (0-based in the epoch) is over."""
        step = min(max(int(step), 0), self.keras_steps - 1)
        return math.ceil((step + 1) * self.total / self.keras_steps)


def passes_to(plan, step, position, count):
    """The last Keras step (cumulative, like ``position``) that a rank in Keras step ``step`` passes without a call
    once it heard ``count``: every later step of the epoch whose slice ``count`` fills (``position`` itself when
    none).  The rank and the clock both compute it, from the same answer.  ``boundary(k) <= count`` holds exactly
    for ``k + 1 <= count * keras_steps // total`` (a ceiling is at most an integer when its argument is)."""
    full = count * plan.keras_steps // plan.total - 1  # the last Keras step whose slice ``count`` fills
    last = min(max(step, full), plan.keras_steps - 1)
    return position + last - step


class JobClock:
    """Counts for ``size`` ranks.  Every method is called under one lock by the service."""

    def __init__(self, size):
        self.size = int(size)
        self.counts = {}                    # epoch -> train steps the job has claimed in it
        self.plans = {}                     # epoch -> EpochPlan (every rank sends the same)
        self.claimed = [0] * self.size      # per rank, over the job (reports)
        self.positions = [-1] * self.size   # last Keras step each rank started (cumulative)
        self.passes = [-1] * self.size      # last Keras step each rank passes without a call (``passes_to``)
        self.stopped = [False] * self.size
        self.calls = [0] * self.size        # per rank, claims since its fit began (2: its first train step is done)
        self.ahead = [0] * self.size        # per rank, AHEAD grants since its fit began (at most half the epoch)
        self.stop_at = None                 # the agreed stop step, once every rank has stopped

    def _check(self, rank, epoch, plan):
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range for {self.size} workers")
        known = self.plans.get(epoch)
        if known is None:
            self.plans[epoch] = plan
            self.counts.setdefault(epoch, 0)
            for old in [e for e in self.plans if e < epoch - 2]:  # ranks are at most one epoch apart
                del self.plans[old]
                self.counts.pop(old, None)
        elif (known.total, known.keras_steps) != (plan.total, plan.keras_steps):
            raise ValueError(f"rank {rank} plans epoch {epoch} as {plan.total} job steps in {plan.keras_steps} "
                             f"Keras steps, another rank as {known.total} in {known.keras_steps}: pass the same "
                             "steps_per_epoch and epochs on every rank")

    def _seen(self, rank, position):
        if position < self.positions[rank]:
            raise ValueError(f"rank {rank} reported Keras step {position} after {self.positions[rank]}: positions "
                             "only grow")
        self.positions[rank] = position

    def claim(self, rank, epoch, step, position, plan, force=False, floor=0):
        """Rank ``rank``, in Keras step ``step`` of ``epoch`` (``position`` over the job), asks for one train step.

        Returns (status, count): GRANTED (the count includes this claim), AHEAD (granted while some rank is still in
        its first train step, see "Head start": claim again, whatever the slice), FULL (the step's slice is done:
        end the Keras step) or STOPPED (every rank has stopped).  ``force``: granted even past the boundary -- a
        fit's or a loop's first train step, which every rank must take (its model and optimizer are built in it, and
        Horovod's broadcast after the first batch needs them on every rank); the epoch may then exceed its total by
        as many steps as there are ranks less one.  ``floor``: the count is at least this (after a live switch from a mode
        that does not claim, the epoch's earlier Keras steps are done: every rank sends the same floor)."""
        self._check(rank, epoch, plan)
        self._seen(rank, position)
        if self.stop_at is not None:
            return STOPPED, self.counts[epoch]
        if self.stopped[rank]:
            raise ValueError(f"rank {rank} stopped and then claimed a train step: resume it first")
        self.calls[rank] += 1
        self.counts[epoch] = max(self.counts[epoch], int(floor))
        ahead = (self.counts[epoch] < plan.total and self.ahead[rank] < self._head_share(plan)
                 and self._someone_starting())
        if self.counts[epoch] >= plan.boundary(step) and not (force or ahead):
            return self._ends(rank, FULL, epoch, step, position, plan)
        self.counts[epoch] += 1
        self.claimed[rank] += 1
        self.ahead[rank] += ahead
        if ahead:
            return AHEAD, self.counts[epoch]
        return self._ends(rank, GRANTED, epoch, step, position, plan)

    def _ends(self, rank, status, epoch, step, position, plan):
        """An answer after which the rank's Keras step may end (FULL, or GRANTED with the slice full): it passes the
        next full ones without a call."""
        count = self.counts[epoch]
        if count >= plan.boundary(step):
            self.passes[rank] = max(self.passes[rank], passes_to(plan, step, position, count))
        return status, count

    @staticmethod
    def _head_share(plan):
        """A rank's head-start grants: half of the epoch.  A rank ready long before the others does not train the
        whole epoch alone, on its shard of the data; ranks that are ready together fill it between them, however
        unevenly they claim (rank 0, beside the Job Clock, claims fastest)."""
        return math.ceil(plan.total / 2)

    def _someone_starting(self):
        """Some rank has not finished its first train step of the fit: it has claimed at most once since it began
        the fit (a rank claims again only after its train step), and it has not stopped."""
        return any(n < 2 and not stopped for n, stopped in zip(self.calls, self.stopped))

    def reached(self, rank, epoch, step, position, plan):
        """A stopped rank's Keras step: True when it may end (its slice is full, or everyone stopped)."""
        self._check(rank, epoch, plan)
        self._seen(rank, position)
        return self.stop_at is not None or self.counts[epoch] >= plan.boundary(step)

    def stop(self, rank, position):
        """Rank ``rank`` stopped training during Keras step ``position``.  Returns the stop step once all have."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range for {self.size} workers")
        self._seen(rank, position)
        self.stopped[rank] = True
        if all(self.stopped) and self.stop_at is None:
            self.stop_at = max(self.positions + self.passes) + 1
        return self.stop_at

    def resume(self, rank):
        """A new ``fit`` begins on this rank (every rank calls it before the fit's first collective, so no rank
        claims before all have resumed): the rank trains again, and the last fit's stop step is forgotten."""
        self.stopped[rank] = False
        self.calls[rank] = self.ahead[rank] = 0
        self.passes[rank] = -1
        self.stop_at = None

    def metrics(self):
        return {"claimed": list(self.claimed), "positions": list(self.positions), "passes": list(self.passes),
                "stopped": list(self.stopped),
                "stop_at": self.stop_at, "counts": dict(self.counts)}
