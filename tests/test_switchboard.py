"""The Switch Board (hetsync/coordinator/switchboard/board.py), alone, with hypothesis (sync="auto"'s policy:
test_auto_policy.py).

A discrete-event simulation runs n ranks of random speeds through the protocol of hetsync/training/:
after each step a rank reports (or, as hetsync/training/callbacks.py does, sends the report of its next step ahead
and reads the answer after that step); when a decision names its step it enters the switch (a global collective:
it waits until every rank is there), carries it out and reports again.  Every few steps the ranks also meet in a "user
collective" (they wait for each other, reporting nothing).  Requests come from random ranks at random times.
Checked: no rank is ever past a decision's step when it learns it (the board would raise); every rank carries out
the same decisions at the same steps; the first request of a burst is decided and the others are superseded;
every accepted request becomes exactly one switch.
"""
import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsync.coordinator.switchboard import ACCEPTED, SUPERSEDED, UNCHANGED, SwitchBoard

MODES = ["allreduce", "hop", "esync", "eager-solo"]


def simulate(n, speeds, steps, requests, collective_every, seed, every=1, ahead=False):
    """Returns (board, per-rank list of (decision id, position) carried out, request statuses); ranks report at
    multiples of ``every`` only (the report cadence) and carry out a known decision at its step without a report.
    ``ahead``: the report of position q is sent (and answered, on the board's state then) when step q - 1 ends, and
    the rank reads the answer only when step q ends."""
    rng = random.Random(seed)
    board = SwitchBoard(n)
    pos, applied, mode = [0] * n, [0] * n, ["allreduce"] * n
    done = [[] for _ in range(n)]
    waiting = {}            # barrier key -> ranks waiting
    events = [(speeds[r] * rng.uniform(0.5, 1.5), r) for r in range(n)]
    heapq.heapify(events)
    known = [None] * n      # the decision each rank learned and has yet to carry out
    sent = [None] * n       # ahead: (position, answer) of the report sent a step early, not read yet
    pending_requests = sorted(requests)
    statuses = []
    now = 0.0

    def release(key, t):
        for r in waiting.pop(key):
            heapq.heappush(events, (t + speeds[r] * rng.uniform(0.5, 1.5), r))

    while events:
        now, r = heapq.heappop(events)
        while pending_requests and pending_requests[0][0] <= now:
            _, who, target = pending_requests.pop(0)
            statuses.append(board.request(who, target))
        pos[r] += 1
        if ahead and sent[r] is not None and sent[r][0] <= pos[r]:
            known[r] = sent[r][1] or known[r]
            sent[r] = None
        elif not ahead and pos[r] % every == 0:
            d = board.report(r, pos[r], applied[r], mode[r], "{}", now=now, every=every)
            if d is not None:
                known[r] = d
        d = known[r]
        barrier = None
        if d is not None:
            assert pos[r] <= d.at, f"rank {r} at {pos[r]} passed switch {d.id} at {d.at}"
            if pos[r] == d.at:
                barrier = ("switch", d.id)
                applied[r], mode[r], known[r] = d.id, d.mode, None
                done[r].append((d.id, pos[r]))
                board.report(r, pos[r], applied[r], mode[r], "{}", now=now, every=every)
        if ahead and (pos[r] + 1) % every == 0:
            sent[r] = (pos[r] + 1, board.report(r, pos[r] + 1, applied[r], mode[r], "{}", now=now, every=every))
        if barrier is None and pos[r] % collective_every == 0:
            barrier = ("collective", pos[r])
        if pos[r] >= steps and barrier is None:
            continue
        if barrier is None:
            heapq.heappush(events, (now + speeds[r] * rng.uniform(0.5, 1.5), r))
            continue
        waiting.setdefault(barrier, []).append(r)
        if len(waiting[barrier]) == n:
            release(barrier, now)
    return board, done, statuses, pos


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 8), seed=st.integers(0, 10_000), slow=st.floats(1.0, 6.0),
       collective_every=st.integers(2, 9), every=st.sampled_from([1, 1, 3, 8]), ahead=st.booleans(),
       requests=st.lists(st.tuples(st.floats(0.0, 60.0), st.integers(0, 7), st.sampled_from(MODES)), max_size=12))
def test_every_rank_switches_at_the_same_steps(n, seed, slow, collective_every, every, ahead, requests):
    speeds = [1.0] * (n - 1) + [slow]
    requests = [(t, who % n, mode) for t, who, mode in requests]
    board, done, statuses, pos = simulate(n, speeds, 80, requests, collective_every, seed, every, ahead)
    assert all(d == done[0] for d in done), f"ranks carried out different switches: {done}"
    ids = [i for i, _ in done[0]]
    assert ids == list(range(1, len(ids) + 1))
    # every accepted request became one decision; decisions not carried out are past the last step
    assert statuses.count(ACCEPTED) == len(board.history)
    for d in board.history[len(ids):]:
        assert d.at > 80 or d.at > min(pos)


def test_concurrent_requests_give_one_switch():
    board = SwitchBoard(4)
    for r in range(4):
        board.report(r, 5, 0, "allreduce", "{}")
    assert board.request(1, "hop") == ACCEPTED
    assert board.request(2, "esync") == SUPERSEDED      # before the decision is made
    d = board.report(0, 6, 0, "allreduce", "{}")
    assert d.mode == "hop" and d.at == 7
    assert board.request(3, "esync") == SUPERSEDED      # decision in flight
    for r in range(4):
        board.report(r, 7, 1, "hop", "{}")
    assert board.current == ("hop", "{}")
    assert board.request(3, "hop") == UNCHANGED
    assert board.request(3, "esync") == ACCEPTED
    assert len(board.history) == 1


def test_position_going_back_and_bad_rank_are_rejected():
    board = SwitchBoard(2)
    board.report(0, 4, 0)
    with pytest.raises(ValueError, match="positions only grow"):
        board.report(0, 3, 0)
    with pytest.raises(ValueError, match="out of range"):
        board.request(2, "hop")


class _Recorder:
    """A policy stand-in that records the sample times the board receives."""

    def __init__(self):
        self.added = []

    def add(self, rank, t, compute_s, run_delay):
        self.added.append((rank, t, compute_s, run_delay))

    def evaluate(self, now, current_mode, stopped=None):
        self.stopped = stopped
        return None

    def switched(self, mode, t):
        pass


def test_sample_times_travel_as_ages_and_land_on_the_boards_clock():
    """No clock is compared across hosts: a report carries each sample's age on the worker's clock, and the board
    places it on its own.  Two workers whose monotonic clocks are 1000 s apart, each reporting a sample taken 0.5 s
    before its report, land at the same board time; a board that took the workers' times as its own would see
    one of them 1000 s in the future.  The policy also hears which ranks the Job Clock beside the board says
    stopped."""
    import types

    from hetsync.coordinator.job_clock import JobClock
    from hetsync.coordinator.switchboard.service import SwitchServicer, pb2

    owner = types.SimpleNamespace(secret="s3cret", job_clock=JobClock(3))
    owner.job_clock.stop(2, 1)
    service = SwitchServicer(owner, 2, clock=lambda: 5000.0)
    owner.switchboard.policy = recorder = _Recorder()
    owner.switchboard.current = ("allreduce", "{}")
    for worker, worker_clock in ((0, 10.0), (1, 1010.0)):
        taken = worker_clock - 0.5
        starved = {"sample_run_delay": [0.5]} if worker == 1 else {}  # rank 0: a report without run-delay
        msg = pb2.SwitchReportMsg(secret="s3cret", worker=worker, position=1, applied=0, mode="allreduce",
                                  options_json="{}", sample_age_s=[worker_clock - taken], sample_compute_s=[0.02],
                                  **starved)
        service.SwitchReport(msg, None)
    assert recorder.added == [(0, 4999.5, 0.02, None), (1, 4999.5, 0.02, 0.5)]
    assert recorder.stopped == {2}
