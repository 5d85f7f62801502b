"""The rank's lifecycle (hetsync/training/lifecycle.py) driven by random event sequences.

The subject rank's Lifecycle reports to the real engine's availability flag (hetsync_ops.so, loaded in this process;
no MPI call is made) and tells its stops to a real Job Clock behind rank 0's gRPC coordinator server; its peers are
Job Clock clients that stop at random points.  The mode is a recording ``SyncAlgorithm``.  Events come in the
orders the drivers make them (``Model.fit``, ``hetsync.job_steps``, a live switch): steps, stops, uneven shards,
sync points, switches, leaving a loop, the end.

Properties, checked after every event -- each is what a wrong transition breaks:

* the absent-rank rule: the engine hears IN_STEP only inside a train step of a rank that trains, or outside fit;
  a rank that stopped, is out for its epoch, is in a sync point or a switch, or left its loop is AWAY -- so no peer
  ever waits on it;
* the mode's ``on_idle`` and ``on_resume`` alternate, ``on_idle`` exactly while the rank is withdrawn;
* the Job Clock knows every stop: once this rank and all its peers have stopped, this rank hears the stop step at
  its next Keras step (the job ends), and never before every rank stopped;
* after the end, plain ops are not gated and nothing is pinned.
"""
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetsync import ops
from hetsync.algorithms.base import SyncAlgorithm
from hetsync.coordinator.job_clock.client import JobClockClient
from hetsync.coordinator.server import start_server
from hetsync.training.job_epochs import JobEpochs
from hetsync.training.lifecycle import Lifecycle, State

PEERS = 2
_POSITIONS = itertools.count(1)  # Keras steps over every example (the Job Clock's positions only grow)


class Recorder(SyncAlgorithm):
    """A mode that records the lifecycle's calls to it."""

    name = "recorder"
    HOROVOD_PASSTHROUGH = True

    def __init__(self, stepping):
        self.STEPPING = stepping
        super().__init__()
        self.calls = []

    def on_idle(self):
        self.calls.append("idle")

    def on_resume(self):
        self.calls.append("resume")

    def on_consensus_begin(self):
        self.calls.append("consensus")


@pytest.fixture(scope="module")
def clock():
    server, _ = start_server(PEERS + 1)
    with server:
        clients = [JobClockClient(server.address, server.secret, r, timeout=10) for r in range(PEERS + 1)]
        yield clients
        for c in clients:
            c.close()


def _engine_state():
    """(what the engine hears, pinned): a pinned flag refuses anything but AWAY."""
    heard = ops.availability()
    ops.set_availability(ops.BETWEEN)
    pinned = ops.availability() == ops.AWAY
    ops.set_availability(heard)
    return heard, pinned


class Driver:
    """Plays the drivers' side: the events a fit, a custom loop or a switch makes, in the orders they make them."""

    def __init__(self, clients, stepping):
        self.clients = clients
        self.alg = Recorder(stepping)
        self.job = JobEpochs(clients[0], timeout=10)
        self.life = Lifecycle(self.alg, self.job)
        self.position = 0
        self.peers_stopped = set()
        self.ever_stopped = False

    def begin(self):
        self.job.begin_fit()
        for c in self.clients[1:]:
            c.resume()
        self.peers_stopped.clear()
        self.ever_stopped = False
        self.life.begin()

    def apply(self, event, arg):
        life = self.life
        if life.state in (State.ENDED, State.LEFT) and event != "end":
            return
        self.position = next(_POSITIONS)
        if event == "step":
            life.step_begins()
            self.check(inside_step=True)
            if arg % 2:
                life.left_exchange()
                self.check()
            life.step_ends()
        elif event == "stop":
            life.stop(self.position)
        elif event == "still_stopped":
            life.still_stopped(self.position)
        elif event == "peer_stops":
            peer = 1 + arg % PEERS
            self.clients[peer].stop(self.position)
            self.peers_stopped.add(peer)
        elif event == "own_steps_over":
            life.leave_for_epoch()
        elif event == "new_epoch":
            life.back_for_epoch()
        elif event == "wait":
            if life.withdrawn:
                life.wait_for_others()
        elif event == "sync_point":
            life.sync_point_begins()
            self.check(away=True)
            life.sync_point_ends()
        elif event == "switch":
            life.switch_begins()
            self.check(away=True)
            life.switch_ends()
        elif event == "leave_loop":
            life.leave_loop(self.position)
            self.check(away=True)
        elif event == "end":
            self.end()
        self.check()

    def end(self):
        self.life.end(lambda: self.check(away=True, ending=True))

    def check(self, inside_step=False, away=False, ending=False):
        life, calls = self.life, self.alg.calls
        heard, pinned = _engine_state()
        # the absent-rank rule
        if life.withdrawn:
            assert pinned and heard == ops.AWAY, (life.state, heard)
        if away or life.state in (State.SYNC_POINT, State.SWITCHING, State.LEFT, State.IDLE, State.OUT):
            assert heard == ops.AWAY, (life.state, heard)
        if heard == ops.IN_STEP:
            assert life.state in (State.STEPPING, State.ENDED), life.state
        if inside_step and not life.withdrawn:
            assert heard == ops.IN_STEP and life.state is State.STEPPING
        if life.state is State.BETWEEN:
            assert heard == ops.BETWEEN and not pinned
        if life.state is State.ENDED:
            assert heard == ops.IN_STEP and not pinned
        # on_idle / on_resume alternate, on_idle exactly while withdrawn
        pairs = [c for c in calls if c in ("idle", "resume")]
        assert all(a != b for a, b in zip(pairs, pairs[1:])) and pairs[:1] in ([], ["idle"]), pairs
        if not ending:  # (the end's global sync comes before the rank's on_resume: it rejoins there)
            assert pairs.count("idle") - pairs.count("resume") == (1 if life.withdrawn else 0), (pairs, life.state)
        # the Job Clock knows every stop
        self.ever_stopped = self.ever_stopped or life.stopped
        everyone = self.ever_stopped and len(self.peers_stopped) == PEERS
        if self.job.stop_at is not None:
            assert everyone, "the job heard a stop step before every rank had stopped"


EVENTS = ["step", "step", "step", "stop", "still_stopped", "peer_stops", "own_steps_over", "new_epoch", "wait",
          "sync_point", "switch", "leave_loop"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stepping=st.sampled_from(["own", "lockstep", "rounds"]),
       events=st.lists(st.tuples(st.sampled_from(EVENTS), st.integers(0, 7)), max_size=40))
def test_no_rank_waits_on_a_rank_that_is_not_coming(clock, stepping, events):
    ops.pin_away(False)  # (an earlier failing example may have left the process's flag pinned)
    ops.set_availability(ops.IN_STEP)
    d = Driver(clock, stepping)
    d.check()  # before the fit: ungated
    d.begin()
    d.check()
    for event, arg in events:
        d.apply(event, arg)
    # every rank stops: this rank hears the job's stop step at its next Keras step (or when it tells its own stop)
    if d.life.state not in (State.ENDED, State.LEFT):
        for peer in range(1, PEERS + 1):
            d.apply("peer_stops", peer - 1)
        d.apply("stop", 0)
        d.apply("still_stopped", 0)
        assert d.job.stop_at is not None, "every rank stopped and the job did not end"
    d.apply("end", 0)
    assert d.life.state is State.ENDED and not d.life.withdrawn


def test_stop_is_told_once_and_rejoin_happens_once(clock):
    """A hand-made sequence: out for the epoch, then stopped, then the end -- one on_idle, one on_resume."""
    d = Driver(clock, "lockstep")
    d.begin()
    d.apply("own_steps_over", 0)
    d.apply("stop", 0)
    d.apply("new_epoch", 0)  # still stopped: stays withdrawn
    assert d.life.state is State.IDLE and d.alg.calls == ["idle"]
    d.apply("end", 0)
    assert d.alg.calls == ["idle", "resume"]
    assert d.life.state is State.ENDED


def test_a_rank_out_for_its_last_epoch_trains_again_in_the_next_fit(clock):
    """Uneven shards: a lockstep rank whose own steps ran out in the fit's last epoch contributes a zero gradient
    (on_idle); the fit's end must resume it, or its next fit trains with a zero gradient throughout."""
    d = Driver(clock, "lockstep")
    d.begin()
    d.apply("own_steps_over", 0)
    d.apply("sync_point", 0)  # the last epoch's end
    d.apply("end", 0)
    assert d.alg.calls == ["idle", "resume"]
    d.begin()  # the next fit
    d.apply("step", 0)
    assert d.life.state is State.BETWEEN and d.alg.calls == ["idle", "resume"]
