"""The Job Clock alone (hetsync/coordinator/job_clock/clock.py), and through its gRPC service.

A discrete-event simulation runs ranks of random speeds and random stop times through the protocol of
hetsync/training/ (job_epochs.JobEpochs): an active rank claims train steps until its Keras step's slice is full, a
stopped rank waits for the slice, every epoch ends at a global sync point, and every rank leaves at the stop step.
Properties that a wrong rule would break:

* an epoch that runs to its end is exactly ``total`` train steps of the job (not N per rank, not more);
* no rank ever waits forever (the simulation ends), and every rank runs the same number of Keras steps;
* a faster rank takes at least as many train steps as a slower one (the epoch is shared by speed);
* once every rank has stopped, each learns the stop step before it passes it, and all leave after it, within
  two Keras steps of the last stop;
* while a rank is in its first train step (tracing, on a throttled node), the others train past their slices
  instead of waiting at the script's next collective, and the epoch is still exactly ``total`` steps.
"""
import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsync.coordinator.job_clock import AHEAD, FULL, GRANTED, STOPPED, EpochPlan, JobClock, passes_to


class Rank:
    def __init__(self, r, speed, stop_after):
        self.r, self.c, self.stop_after = r, speed, stop_after
        self.position = 0     # Keras steps started (cumulative)
        self.epoch, self.step = 0, 0
        self.stopped = False
        self.stop_at = None
        self.trained = 0
        self.done = False
        self.first_heard = None  # position at which the rank first heard the stop step
        self.pass_to = -1        # the last Keras step it passes without a call (clock.passes_to)


def simulate(speeds, stops, epochs, steps_per_epoch, first_steps=None, collective_every=0, watch=None,
             passing=True):
    """Runs the protocol; returns (clock, ranks, per-epoch counts at their ends, finishing time).
    ``first_steps``: each rank's first train step's duration (its trace); ``collective_every``: a user's collective
    of every rank after each such Keras step; ``watch``: a rank whose first train step's end records the epoch's
    count then (``clock.count_when_watched``); ``passing=False``: a call at every Keras step, as if no answer told
    which later steps are full."""
    n = len(speeds)
    clock = JobClock(n)
    ranks = [Rank(r, speeds[r], stops[r]) for r in range(n)]
    total = sum(steps_per_epoch)
    keras_steps = max(steps_per_epoch)
    plan = EpochPlan(total, keras_steps)
    events = [(0.0, r, "start_step") for r in range(n)]
    heapq.heapify(events)
    blocked, at_barrier, ends, decided = set(), set(), [], []
    in_collective = set()
    now = 0.0

    def heard(rank, stop_at):
        if stop_at is not None and rank.stop_at is None:
            rank.stop_at, rank.first_heard = stop_at, rank.position
            assert rank.position <= stop_at, "a rank passed the stop step before hearing of it"

    def end_step(rank, t):
        rank.step += 1
        if rank.stop_after is not None and t >= rank.stop_after and not rank.stopped:
            rank.stopped = True
            heard(rank, clock.stop(rank.r, rank.position))
            if clock.stop_at is not None:
                decided.append(t)
        if rank.stop_at is not None and rank.position >= rank.stop_at:
            rank.done = True
            return
        if collective_every and rank.step % collective_every == 0 and rank.step < keras_steps:
            in_collective.add(rank.r)  # a user's allreduce between Keras steps: every rank, or nobody goes on
            if len(in_collective) + sum(x.done for x in ranks) == n:
                for x in sorted(in_collective):
                    heapq.heappush(events, (t, x, "start_step"))
                in_collective.clear()
            return
        if rank.step == keras_steps:
            at_barrier.add(rank.r)
            if len(at_barrier) + sum(x.done for x in ranks) == n:  # the epoch-end sync point: a global barrier
                ends.append(clock.counts[rank.epoch])
                for x in ranks:
                    if x.r in at_barrier:
                        x.epoch += 1
                        x.step = 0
                        if x.epoch < epochs:
                            heapq.heappush(events, (t, x.r, "start_step"))
                        else:
                            x.done = True
                at_barrier.clear()
            return
        heapq.heappush(events, (t, rank.r, "start_step"))

    def act(rank, t, what):
        if what == "start_step":
            rank.position += 1
            what = "claim"
        if rank.stop_at is not None:  # every rank stopped: empty steps to the stop step
            return end_step(rank, t)
        if passing and rank.position <= rank.pass_to:  # known full: passed without a call
            return end_step(rank, t)
        if rank.stopped:
            if clock.reached(rank.r, rank.epoch, rank.step, rank.position, plan):
                heard(rank, clock.stop_at)
                return end_step(rank, t)
            blocked.add(rank.r)
            return None
        status, count, = clock.claim(rank.r, rank.epoch, rank.step, rank.position, plan)
        heard(rank, clock.stop_at)
        full = status == FULL or (status == GRANTED and count >= plan.boundary(rank.step))
        if full:
            rank.pass_to = passes_to(plan, rank.step, rank.position, count)
        if status in (GRANTED, AHEAD):
            rank.trained += 1
            took = first_steps[rank.r] if first_steps and rank.trained == 1 else rank.c
            heapq.heappush(events, (t + took, rank.r, "trained_full" if full else "trained"))
            return None
        assert status in (FULL, STOPPED)
        return end_step(rank, t)

    guard = 0
    while events:
        guard += 1
        assert guard < 200000, "simulation did not end"
        now, r, what = heapq.heappop(events)
        rank = ranks[r]
        if r == watch and what.startswith("trained") and not hasattr(clock, "count_when_watched"):
            clock.count_when_watched = clock.counts[rank.epoch]  # its first train step just ended
            clock.trained_when_watched = [x.trained for x in ranks]
        if what == "trained_full":
            end_step(rank, now)
        else:
            act(rank, now, "claim" if what == "trained" else what)
        for b in sorted(blocked):  # a claim may have filled a stopped rank's slice, or the stop step was named
            blocked.discard(b)
            act(ranks[b], now, "claim")
    assert all(x.done for x in ranks), [(x.r, x.position, x.stopped, x.epoch) for x in ranks]
    return clock, ranks, ends, now, decided


speeds = st.lists(st.sampled_from([1.0, 1.0, 1.5, 2.0, 5.0]), min_size=2, max_size=6)


@settings(max_examples=120, deadline=None)
@given(speeds=speeds, epochs=st.integers(1, 3), n=st.integers(1, 8), data=st.data())
def test_epochs_are_the_jobs_steps_shared_by_speed(speeds, epochs, n, data):
    uneven = data.draw(st.lists(st.integers(0, 3), min_size=len(speeds), max_size=len(speeds)))
    steps = [max(1, n + 3 - u) for u in uneven]
    clock, ranks, ends, _, _ = simulate(speeds, [None] * len(speeds), epochs, steps)
    assert ends == [sum(steps)] * epochs  # exactly the job's steps, every epoch
    assert len({x.position for x in ranks}) == 1  # the same Keras steps everywhere
    assert ranks[0].position == epochs * max(steps)
    for a in ranks:
        for b in ranks:
            if a.c * 2 <= b.c:  # twice as fast at least: at least as many train steps (the slow rank's last
                assert a.trained + 1 >= b.trained, [(x.c, x.trained) for x in ranks]  # one may overlap the end


@settings(max_examples=120, deadline=None)
@given(n=st.integers(2, 6), late=st.data(), trace=st.floats(30.0, 200.0), every=st.integers(1, 7),
       epochs=st.integers(1, 2))
def test_the_ready_ranks_train_on_while_one_is_in_its_first_step(n, late, trace, every, epochs):
    """One rank's first train step takes ``trace`` (a throttled node tracing its step), the others' one unit, and
    the script has a collective of every rank every ``every`` Keras steps.  Without the head start the ready ranks
    fill their first ``every`` slices and wait there; with it they train on, each up to half of the epoch (not the
    whole epoch on one rank's data).  A cap of ``total / n`` each would leave the slow rank's share untaken while
    they wait at the collective for it: with two ready ranks or more and a trace long enough, they take the whole
    epoch."""
    slow = late.draw(st.integers(0, n - 1))
    steps = [20] * n
    first = [trace if r == slow else 1.0 for r in range(n)]
    clock, ranks, ends, finish, _ = simulate([1.0] * n, [None] * n, epochs, steps, first_steps=first,
                                             collective_every=every, watch=slow)
    total = sum(steps)
    assert ends == [total] * epochs  # still exactly the job's steps, every epoch
    assert len({x.position for x in ranks}) == 1
    waiting = EpochPlan(total, 20).boundary(every - 1) + n  # where the ready ranks would have stopped, at most
    share = math.ceil(total / 2)  # every rank but the slow one is ready from time 1 on
    filled = min(total, 1 + (n - 1) * min(share, trace - 2))  # the slow rank's first step, and the head start's
    assert clock.count_when_watched >= filled > waiting, (clock.count_when_watched, filled, waiting)
    if n >= 3 and (n - 1) * (trace - 2) >= total:
        assert clock.count_when_watched == total  # the epoch was taken while the slow rank traced
    assert all(t <= share for r, t in enumerate(clock.trained_when_watched) if r != slow), clock.trained_when_watched


@settings(max_examples=120, deadline=None)
@given(speeds=speeds, data=st.data())
def test_everyone_leaves_together_soon_after_the_last_stop(speeds, data):
    n = len(speeds)
    stops = data.draw(st.lists(st.floats(0.0, 40.0), min_size=n, max_size=n))
    clock, ranks, ends, finish, decided = simulate(speeds, stops, epochs=1, steps_per_epoch=[100000] * n)
    assert clock.stop_at is not None and len(decided) == 1
    assert len({x.position for x in ranks}) == 1 and ranks[0].position == clock.stop_at
    # The last rank notices its stop at its first Keras step end past its threshold: when it trains alone a Keras
    # step is `size` of its train steps (the job's slice).  From the decision on, nobody trains: every rank leaves
    # once the train step it has in flight is done.
    assert decided[0] <= max(stops) + n * max(speeds) + 1e-9
    assert finish <= decided[0] + max(speeds) + 1e-9, (finish, decided)
    assert all(x.first_heard is not None and x.first_heard <= clock.stop_at for x in ranks)


def _past_first_steps(size):
    """A clock whose ranks have all finished their first train step (two claims each, in epoch 0)."""
    clock = JobClock(size)
    for _ in range(2):
        for r in range(size):
            clock.claim(r, 0, 0, 1, EpochPlan(4 * size, 2))
    return clock


def test_the_head_start_lasts_while_a_rank_is_in_its_first_step():
    clock = JobClock(2)
    plan = EpochPlan(8, 4)  # slice 0 ends at 2
    assert clock.claim(0, 0, 0, 1, plan) == (AHEAD, 1)
    assert clock.claim(0, 0, 0, 1, plan) == (AHEAD, 2)  # rank 0's first step is done, rank 1's is not begun
    assert clock.claim(0, 0, 0, 1, plan) == (AHEAD, 3)  # past slice 0
    assert clock.claim(1, 0, 0, 1, plan, force=True) == (AHEAD, 4)  # rank 1 begins its first step
    assert clock.claim(0, 0, 0, 1, plan) == (AHEAD, 5)
    assert clock.claim(1, 0, 0, 1, plan) == (FULL, 5)  # rank 1's first step is done: slices again
    assert clock.claim(0, 0, 1, 2, plan) == (FULL, 5)   # slice 1 ends at 4: already taken
    assert clock.claim(0, 0, 2, 3, plan) == (GRANTED, 6)
    # never past half of the epoch per rank (12 steps, the slice 1: 6), nor past its total; ranks that are ready
    # together fill it between them, however unevenly they claim; a stopped rank is not starting; a new fit starts
    # the head start again
    clock = JobClock(3)
    plan = EpochPlan(12, 12)
    assert clock.claim(0, 0, 0, 1, plan, force=True) == (AHEAD, 1)
    assert [clock.claim(0, 0, 0, 1, plan)[0] for _ in range(6)] == [AHEAD] * 5 + [FULL]  # alone ready: half
    assert clock.claim(1, 0, 0, 1, plan, force=True) == (AHEAD, 7)
    assert [clock.claim(1, 0, 0, 1, plan)[0] for _ in range(6)] == [AHEAD] * 5 + [FULL]
    assert clock.counts[0] == 12
    assert [clock.claim(2, 0, 0, 1, plan, force=True)[0], clock.claim(2, 0, 0, 1, plan)[0]] == [GRANTED, FULL]
    clock = JobClock(4)
    plan = EpochPlan(12, 12)
    for r in range(3):  # ranks 0-2 begin; rank 3 has not
        assert clock.claim(r, 0, 0, 1, plan, force=True)[0] == AHEAD
    assert [clock.claim(0, 0, 0, 1, plan)[0] for _ in range(6)] == [AHEAD] * 5 + [FULL]  # the fastest: half
    assert [clock.claim(1, 0, 0, 1, plan)[0] for _ in range(5)] == [AHEAD] * 4 + [FULL]  # the rest of the epoch
    assert clock.counts[0] == 12 and clock.ahead[:3] == [6, 5, 1]
    clock = JobClock(2)
    plan = EpochPlan(2, 2)
    assert [clock.claim(0, 0, 0, 1, plan)[0] for _ in range(2)] == [AHEAD, FULL]  # the share: 1
    assert clock.claim(1, 0, 0, 1, plan) == (AHEAD, 2)
    assert clock.claim(1, 0, 0, 1, plan)[0] == FULL  # the total
    clock.stop(1, 1)
    assert clock.claim(0, 1, 0, 2, plan) == (GRANTED, 1)
    clock.resume(0)
    clock.resume(1)
    assert clock.claim(0, 1, 0, 2, plan) == (AHEAD, 2)


@settings(max_examples=200, deadline=None)
@given(total_per=st.integers(1, 9), keras_steps=st.integers(1, 40), data=st.data())
def test_a_rank_passes_exactly_the_later_steps_that_its_answer_shows_full(total_per, keras_steps, data):
    """``passes_to``: every Keras step it covers after the current one has its boundary within the count heard,
    the next one (if the epoch has it) does not, and it never leaves the epoch."""
    plan = EpochPlan(total_per * keras_steps, keras_steps)
    step = data.draw(st.integers(0, keras_steps - 1))
    count = data.draw(st.integers(plan.boundary(step), plan.total))
    position = data.draw(st.integers(step + 1, step + 500))
    last = step + passes_to(plan, step, position, count) - position
    assert step <= last < keras_steps
    assert all(plan.boundary(k) <= count for k in range(step, last + 1))
    assert last == keras_steps - 1 or plan.boundary(last + 1) > count


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 6), slow=st.sampled_from([4.0, 8.0, 20.0]), every=st.sampled_from([0, 3, 7]),
       epochs=st.integers(1, 2))
def test_a_slow_rank_passes_the_slices_it_missed_with_one_call(n, slow, every, epochs):
    """A rank ``slow`` times slower: after each of its train steps the others have filled several slices, which it
    passes for the one answer that ended its Keras step (a throttled rank's call to a throttled coordinator costs
    a CFS period).  Its calls are then about two per train step (a grant, and the answer that ends the Keras step:
    one more at each collective or epoch end, where the others went on), not one per Keras step -- and the epochs,
    the Keras steps and the shares are the same as with a call at every step."""
    speeds = [1.0] * (n - 1) + [slow]
    steps = [30] * n
    runs = {p: simulate(speeds, [None] * n, epochs, steps, collective_every=every, passing=p) for p in (True, False)}
    (clock, ranks, ends, _, _), (clock0, ranks0, ends0, _, _) = runs[True], runs[False]
    assert ends == ends0 == [sum(steps)] * epochs
    assert [x.position for x in ranks] == [x.position for x in ranks0] == [epochs * 30] * n
    assert [x.trained for x in ranks] == [x.trained for x in ranks0]
    waits = epochs * (1 + (29 // every if every else 0))  # the collectives and epoch ends
    calls = clock.calls[n - 1]
    assert calls <= 2 * ranks[-1].trained + waits, (calls, ranks[-1].trained, waits)
    assert calls < epochs * 30 <= clock0.calls[n - 1], (calls, clock0.calls[n - 1])  # that: one at every step


def test_the_stop_step_is_past_every_step_a_rank_passes():
    """A rank told that the next slices are full passes them without a call: the clock counts them as started, so
    a stop step named meanwhile is past them, and the rank hears it at its next call."""
    clock = JobClock(2)
    plan = EpochPlan(8, 8)  # one train step per slice
    assert [clock.claim(0, 0, 0, 1, plan)[0] for _ in range(5)] == [AHEAD] * 4 + [FULL]  # its share while rank 1
    assert clock.passes[0] == 4 == passes_to(plan, 0, 1, 4)                              # starts; then slices 1-3
    assert clock.claim(1, 0, 0, 1, plan, force=True) == (AHEAD, 5)
    assert clock.claim(1, 0, 0, 1, plan) == (FULL, 5)
    assert clock.passes[1] == 5  # slices 1-4 are full: it passes to its step 4 (position 5)
    assert clock.stop(0, 1) is None
    assert clock.stop(1, 1) == 6  # past position 5, which rank 1 passes without a call (not 2)
    clock.resume(1)
    assert clock.passes[1] == -1


def test_plans_must_agree_and_positions_only_grow():
    clock = JobClock(2)
    plan = EpochPlan(8, 4)
    assert clock.claim(0, 0, 0, 1, plan)[0] in (GRANTED, AHEAD)
    with pytest.raises(ValueError, match="pass the same steps_per_epoch"):
        clock.claim(1, 0, 0, 1, EpochPlan(10, 5))
    with pytest.raises(ValueError, match="positions only grow"):
        clock.claim(0, 0, 0, 0, plan)
    with pytest.raises(ValueError, match="out of range"):
        clock.stop(2, 1)
    with pytest.raises(ValueError):
        EpochPlan(3, 4)
    assert [EpochPlan(10, 4).boundary(k) for k in range(4)] == [math.ceil(2.5 * (k + 1)) for k in range(4)]
    # a fit's first train step is every rank's, even past the slice (Horovod's first-batch broadcast needs every
    # rank's model and optimizer built): granted and counted
    clock = _past_first_steps(3)
    plan = EpochPlan(3, 3)
    assert clock.claim(0, 1, 0, 1, plan) == (GRANTED, 1)
    assert clock.claim(1, 1, 0, 1, plan)[0] == FULL
    assert clock.claim(2, 1, 0, 1, plan, force=True) == (GRANTED, 2)
    # after a live switch from a mode that claims nothing, the epoch's earlier Keras steps count (the floor)
    clock = _past_first_steps(2)
    plan = EpochPlan(8, 4)
    assert clock.claim(0, 1, 2, 3, plan, floor=plan.boundary(1)) == (GRANTED, 5)
    assert clock.claim(1, 1, 2, 3, plan, floor=plan.boundary(1)) == (GRANTED, 6)
    assert clock.claim(1, 1, 2, 3, plan, floor=plan.boundary(1))[0] == FULL


def test_service_over_grpc_with_the_job_secret(monkeypatch):
    """The same clock through rank 0's coordinator server: claims, a stopped rank's wait woken by a claim, the
    stop step, and a wrong secret refused.

    The wake-up is a scenario the test makes, not one the machine's timing may give: the claim is sent only once
    rank 1's JobReached is asleep on the server's condition (a spy on the servicer's condition says so), and the
    wait may last 60 s, so an answer well before that came from the claim's notify, not from the wait's end (after
    which the server re-checks the clock and would answer "reached" too)."""
    import threading
    import time

    import grpc

    from hetsync.coordinator.job_clock import service as job_service
    from hetsync.coordinator.job_clock.client import JobClockClient
    from hetsync.coordinator.server import start_server

    asleep = threading.Event()

    class SpyCondition(threading.Condition):
        def wait(self, timeout=None):
            asleep.set()
            return super().wait(timeout)

    servicer_init = job_service.JobServicer.__init__

    def init(self, owner, size):
        servicer_init(self, owner, size)
        self._cv = SpyCondition()

    monkeypatch.setattr(job_service.JobServicer, "__init__", init)
    server, _ = start_server(2)
    with server:
        a = JobClockClient(server.address, server.secret, 0, timeout=10)
        b = JobClockClient(server.address, server.secret, 1, timeout=10)
        plan = EpochPlan(4, 2)
        assert a.claim(0, 0, 1, plan)[:2] == (AHEAD, 1)  # rank 1 has not begun: rank 0's head start
        b.stop(1)
        assert b.reached(0, 0, 1, plan, wait_s=0.0) == (False, None)  # slice 0 is not full yet: rank 1 must wait
        assert not asleep.is_set()  # (a zero wait does not sleep)
        out = {}
        waiter = threading.Thread(target=lambda: out.setdefault("r", b.reached(0, 0, 1, plan, wait_s=60.0)))
        waiter.start()
        assert asleep.wait(30), "rank 1's JobReached never waited on the server"
        woken = time.monotonic()
        assert a.claim(0, 0, 1, plan)[:2] == (GRANTED, 2)  # fills slice 0: wakes rank 1's wait
        waiter.join(60)
        # timing property: the claim's notify ends the wait at once (milliseconds); 20 s is generous on a loaded
        # machine and still far below the 60 s a wait that nobody wakes would last
        assert not waiter.is_alive() and time.monotonic() - woken < 20, "the claim did not wake rank 1's wait"
        assert out["r"] == (True, None)
        assert a.stop(2) == 3  # every rank stopped: one past the furthest position
        assert b.reached(0, 1, 2, plan, wait_s=0.0) == (True, 3)
        bad = JobClockClient(server.address, "wrong", 0, timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            bad.claim(0, 0, 4, plan)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        for c in (a, b, bad):
            c.close()
