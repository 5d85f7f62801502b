"""The rank's lifecycle: one state machine, the single home of the absent-rank rule (README "Guarantees").

No rank ever waits on a rank that is not coming.  The engine lets a peer go on without this rank unless it reports
IN_STEP (docs/engine.md, "Availability"), so the rule comes down to what this rank reports, and when.  Every such
report (``ops.set_availability``, ``ops.pin_away``), every stop told to the Job Clock, and the mode's withdraw and
rejoin hooks (``on_idle``, ``on_resume``) follow a named transition of :class:`Lifecycle`, and are made nowhere
else.  Its drivers keep no flags of their own: ``Model.fit`` (rank_state.py, through callbacks.py),
``hetsync.job_steps`` (loop.py) and a live switch (hetsync/switching.py) only call transitions.

States (docs/architecture.md has the table of states x events):

* ``ENDED``: outside ``fit`` and custom loops; plain ops are not gated (IN_STEP).
* ``BETWEEN``: training, between two train steps (BETWEEN: peers stop waiting once it stays out longer than
  ``away_after``, e.g. blocked in a user's ``hvd.allreduce``).
* ``STEPPING``: inside a train step (IN_STEP: peers wait, it is coming).
* ``IDLE``: stopped (a time budget, EarlyStopping on this rank, ``steps.stop()``) while others train on: pinned
  AWAY, the mode withdrawn; the Job Clock knows.
* ``OUT``: its own steps of this epoch (or loop) are over while others go on (uneven shards): pinned AWAY, the
  mode withdrawn, until the epoch's sync point.
* ``SYNC_POINT``: in a global sync point (an epoch end, a consensus round, the end): AWAY.
* ``SWITCHING``: in a live switch: AWAY.
* ``LEFT``: left a custom loop, before the loop's global end (``finish()``): AWAY.

A rank is *withdrawn* while it has a reason to stay out of the mode's collectives (stopped, or out): the engine is
pinned AWAY, and the mode's ``on_idle`` ran once; ``on_resume`` runs once when the last reason goes.
"""
import enum
import logging

from hetsync import ops
from hetsync.algorithms.decentralized import DecentralizedAlgorithm

log = logging.getLogger("hetsync.training")


class State(enum.Enum):
    ENDED = "ended"
    BETWEEN = "between"
    STEPPING = "stepping"
    IDLE = "idle"
    OUT = "out"
    SYNC_POINT = "sync_point"
    SWITCHING = "switching"
    LEFT = "left"


# What the engine hears in each state (a withdrawn rank is pinned AWAY whatever it reports).
REPORTED = {State.ENDED: ops.IN_STEP, State.BETWEEN: ops.BETWEEN, State.STEPPING: ops.IN_STEP,
            State.IDLE: ops.AWAY, State.OUT: ops.AWAY, State.SYNC_POINT: ops.AWAY, State.SWITCHING: ops.AWAY,
            State.LEFT: ops.AWAY}


class Lifecycle:
    """One rank's lifecycle in a fit or a custom loop: the state, the reasons it is withdrawn, the transitions.

    ``algorithm`` is the mode in force (a live switch replaces it: :meth:`install`); ``job`` is the Job Clock's
    client for this fit or loop (training/job_epochs.py), which hears every stop.
    """

    def __init__(self, algorithm, job):
        self.algorithm, self.job = algorithm, job
        self.state = State.ENDED
        self.stopped = False  # reasons to stay withdrawn: stopped training ...
        self.out = False      # ... or its own steps of the epoch / loop are over
        self.stop_requested = False  # a custom loop's steps.stop(): carried out at the loop's next batch

    def request_stop(self):
        """``steps.stop()`` in a custom loop: the rank stops at the loop's next batch (an ESync round in progress
        is aggregated first, at the same point as on the other ranks)."""
        self.stop_requested = True

    @property
    def withdrawn(self):
        return self.stopped or self.out

    # -- a fit or loop ------------------------------------------------------------------------------------------
    def begin(self):
        """A fit or custom loop begins: training, in the mode's collectives."""
        self.stopped = self.out = self.stop_requested = False
        ops.pin_away(False)
        self._enter(State.BETWEEN)

    def end(self, global_sync):
        """Every rank leaves its fit or loop at the same step: ``global_sync()`` (a Horovod collective on every
        rank) is where withdrawn ranks rejoin; then plain ops are ungated."""
        was_withdrawn = self.withdrawn
        self._enter(State.SYNC_POINT)
        self.stopped = self.out = self.stop_requested = False
        ops.pin_away(False)
        global_sync()
        if was_withdrawn:
            self.algorithm.on_resume()
        self._enter(State.ENDED)

    # -- train steps --------------------------------------------------------------------------------------------
    def step_begins(self):
        """A train step starts: peers wait for this rank (a withdrawn rank's steps train nothing: no change)."""
        if not self.withdrawn:
            self._enter(State.STEPPING)

    def step_ends(self):
        """A train step is over (also after an exception in it)."""
        if not self.withdrawn:
            self._enter(State.BETWEEN)

    def left_exchange(self):
        """A custom loop's step left its exchange (called from the graph, algorithms/_wrap.py): a Horovod collective
        later in the step (the first step's ``broadcast_variables``) must not keep a peer's P-Reduce waiting."""
        if self.state is State.STEPPING:
            self._enter(State.BETWEEN)

    # -- withdrawing and rejoining ------------------------------------------------------------------------------
    def stop(self, position, tell=True):
        """This rank stops training while others go on: withdraw, and tell the Job Clock it stopped during Keras
        step ``position`` (``tell=False``: a custom loop's ESync rounds, whose aggregation counts instead)."""
        if self.stopped:
            return
        log.debug("rank stopped: idle steps from now on")
        self._withdraw("stopped")
        if tell:
            self.job.report_stop(position)

    def still_stopped(self, position):
        """A stopped rank's Keras step in a lockstep or rounds mode: keep its position current on the Job Clock, and
        hear the stop step once every rank has stopped (job_epochs.JobEpochs.report_stop)."""
        if self.stopped and self.job.stop_at is None:
            self.job.report_stop(position)

    def leave_for_epoch(self):
        """Its own steps of this epoch (or loop) are over: idle steps until the next sync point."""
        if not self.out:
            self._withdraw("out")

    def back_for_epoch(self):
        """A new epoch: a rank that was out rejoins (the epoch-end sync point brought it up to date)."""
        if self.out:
            self.out = False
            if not self.stopped:
                ops.pin_away(False)
                self.algorithm.on_resume()
                self._enter(State.BETWEEN)

    def wait_for_others(self):
        """A withdrawn rank waits for the ranks still training (a slice of the job's epoch): AWAY meanwhile."""
        ops.set_availability(ops.AWAY)

    def leave_loop(self, position):
        """This rank's custom loop is over before the loop's global end.  ``own``-pace modes leave the mode's
        collectives at once, so nobody waits on this rank, and the Job Clock hears it stopped (at ``position``,
        the claim it was refused) unless it already did."""
        if self.algorithm.STEPPING == "own":
            self.stop(position)
        self._enter(State.LEFT)

    # -- sync points and switches -------------------------------------------------------------------------------
    def sync_point_begins(self):
        self._enter(State.SYNC_POINT)

    def sync_point_ends(self):
        """Back to training, or to idle steps while withdrawn (a rank out for the epoch rejoins at its next
        epoch's start, after the epoch-end sync point brought it up to date)."""
        self._settle()

    def switch_begins(self):
        """A live switch starts here on every rank: AWAY, and the mode in force pauses its collectives."""
        self._enter(State.SWITCHING)
        self.algorithm.on_consensus_begin()

    def retire(self):
        """The mode in force is left (after its drain): its state is dropped and the engine's session ends."""
        self.algorithm.deactivate()
        ops.withdraw()

    def install(self, algorithm):
        """The new mode takes over (after the switch's average): a new engine session, and the mode's own view of
        whether this rank is withdrawn."""
        self.algorithm = algorithm
        out = self.withdrawn
        algorithm.activate()
        if isinstance(algorithm, DecentralizedAlgorithm):
            algorithm.on_consensus_end(out)  # rejoins (and withdraws again when out)
        else:
            ops.rejoin()
            algorithm.on_consensus_end(out)
            if out:
                algorithm.on_idle()
        if not out:
            algorithm.on_resume()

    def switch_ends(self):
        self._settle()

    # -- internals ----------------------------------------------------------------------------------------------
    def _withdraw(self, reason):
        first = not self.withdrawn
        ops.pin_away(True)  # before the mode's hook: from here no peer waits on this rank
        setattr(self, reason, True)
        if first:
            self.algorithm.on_idle()
        self.state = State.IDLE if self.stopped else State.OUT

    def _settle(self):
        if self.stopped:
            self.state = State.IDLE
        elif self.out:
            self.state = State.OUT
        else:
            self._enter(State.BETWEEN)

    def _enter(self, state):
        self.state = state
        ops.set_availability(REPORTED[state])
