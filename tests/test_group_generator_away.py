"""Away workers at the Ripples Group Generator (no gRPC): a worker inside a user's collective or between epochs is
reported away; it is never drafted, never blamed by an ack timeout, and never blocks the others (unit tests and
hypothesis interleavings)."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetsync.coordinator.group_generator import (
    InvalidArgument,
    ProtocolViolation,
    RandomGroupGenerator,
    SmartGroupGenerator,
)
from gg_driver import Driver, ScriptedGG, configs, drain, generator_for
from gg_sim import simulate


# ------------------------------------------------------------------------------------------- away workers
def test_away_unblocks_the_division_deadlock():
    """The deadlock that motivated away(): A=0 and C=2 sit in a global collective, Y=[A,C] was formed before they
    left, and B=1's next group [B,C] waits behind Y (C is locked by it) -- so B never reaches the collective."""
    gg = ScriptedGG(3, [[0, 2], [1, 2]], ack_timeout=None)
    y = gg.request(0, now=0.0)
    assert y.members == (0, 2)
    assert gg.request(1, now=0.0) is None  # [1,2] pending: 2 is locked by Y, which 2 never fetched
    gg.ack(0, y.group_id, now=1.0)  # A's P-Reduce of Y ended without C (C's engine answered EXCLUDE)
    assert gg.away(0, now=1.0) == []  # A holds nothing it has not received
    assert gg.poll(1, now=1.0) is None  # still deadlocked: nobody told the GG that C is not coming
    excluded = gg.away(2, now=2.0)
    assert [g.group_id for g in excluded] == [y.group_id, y.group_id + 1]
    assert [g.members for g in excluded] == [(0, 2), (1, 2)]  # member lists unchanged
    bc = gg.poll(1, now=2.0)
    assert bc.members == (1, 2)  # B runs it; C's engine excludes itself
    m = gg.metrics()
    assert m["groups_completed"] == 1 and m["away_events"] == 2 and m["state"] == ["away", "live", "away"]
    assert gg.ack(1, bc.group_id, now=3.0) is True  # C's ack was counted when it went away
    assert gg.away(2, now=3.0) == []  # idempotent
    gg.check_invariants()
    gg.script.append([1, 2])
    g = gg.request(2, now=4.0)  # a request brings C back: it may be drafted again, A (still away) may not
    assert g.members == (1, 2) and gg.metrics()["state"] == ["away", "live", "live"]
    gg.check_invariants()


def test_away_leaves_a_received_group_alone_and_abandons_a_request():
    gg = ScriptedGG(4, [[0, 1], [1, 2, 3], [0, 2, 3]], ack_timeout=None)
    g1 = gg.request(0, now=0.0)
    assert gg.request(1, now=0.0) == g1  # worker 1 holds g1
    assert gg.request(2, now=0.0) is None  # [1,2,3] pending behind g1
    queued = gg.buffer(1)
    assert [g.members for g in queued] == [(1, 2, 3)]
    assert gg.away(1, now=1.0) == queued  # g1, already received, is not among them
    assert gg.held_group(1) == g1.group_id and gg._lock[1] == g1.group_id  # it will still ack g1
    gg.check_invariants()
    g2 = gg.poll(2, now=1.0)  # [1,2,3] no longer waits for worker 1 (busy in g1): it does not take part
    assert g2.members == (1, 2, 3) and gg._lock[1] == g1.group_id and gg._lock[2] == g2.group_id
    gg.ack(0, g1.group_id, now=2.0)
    assert gg.ack(1, g1.group_id, now=2.0) is True  # the away worker acks what it received
    assert gg._lock[1] is None
    gg.check_invariants()
    # a waiting worker that goes away abandons its request (its group is excused like the others)
    assert gg.request(0, now=3.0) is None  # [0,2,3]: workers 2 and 3 are locked by g2
    assert [g.members for g in gg.away(0, now=3.0)] == [(0, 2, 3)]
    with pytest.raises(ProtocolViolation, match="went away while waiting"):
        gg.poll(0, now=3.0)
    gg.check_invariants()
    assert gg.worker_state(0) == "idle" and gg.is_away(0)
    gg.back(0)
    assert not gg.is_away(0) and gg.metrics()["state"][0] == "live"
    gg.check_invariants()


def test_random_generator_does_not_draft_away_workers():
    gg = RandomGroupGenerator(5, group_size=3, seed=1, ack_timeout=None, group_buffer=True)
    for w in (1, 2, 3):
        assert gg.away(w, now=0.0) == []
    for step in range(5):
        g = gg.request(0, now=float(step))
        assert g.members == (0, 4)  # only worker 4 is available: a smaller group
        gg.request(4, now=float(step))
        gg.ack(0, g.group_id)
        gg.ack(4, g.group_id)
    gg.away(4, now=9.0)
    assert gg.request(0, now=10.0).is_singleton  # nobody available: no synchronization
    gg.check_invariants()


def test_smart_generator_divisions_and_heads_skip_away_workers():
    node_of = [0, 0, 0, 1, 1, 1]
    gg = SmartGroupGenerator(6, group_size=2, node_of=node_of, seed=0, c_thres=None)
    gg.away(3, now=0.0)  # the rotation would pick 3 as node 1's first head
    gg.away(1, now=0.0)
    g = gg.request(0, now=0.0)
    groups = {g} | {b for w in range(6) for b in gg.buffer(w)}
    assert all(not {1, 3} & set(x.members) for x in groups)
    inter = [x for x in groups if x.phase == "inter"]
    assert len(inter) == 1 and inter[0].members in ((0, 4), (0, 5), (2, 4), (2, 5))
    assert gg.buffer(1) == [] and gg.buffer(3) == []
    gg.check_invariants()


def test_ack_timeout_does_not_blame_an_excused_worker():
    gg = ScriptedGG(3, [[0, 1, 2]], ack_timeout=5.0)
    g = gg.request(0, now=0.0)
    assert [x.group_id for x in gg.away(2, now=1.0)] == [g.group_id]
    assert gg.expire(now=5.0) == [g.group_id]  # worker 1 never fetched it: 1 is evicted, not the away worker 2
    assert gg.metrics()["state"] == ["live", "evicted", "away"]
    gg.check_invariants()


def test_finish_of_a_member_turns_an_excused_group_into_a_singleton():
    gg = ScriptedGG(4, [[0, 1], [1, 2, 3]], ack_timeout=None)
    g1 = gg.request(0, now=0.0)
    assert gg.request(2, now=0.0) is None  # [1,2,3] waits behind g1 (worker 1)
    gg.away(3, now=0.0)
    gg.finish(1, now=1.0)  # g1 becomes worker 1's obligation; [1,2,3] loses 1 and has only 2 taking part
    solo = gg.poll(2, now=1.0)
    assert solo.members == (2,) and solo.is_singleton
    gg.check_invariants()
    gg.ack(0, g1.group_id)
    gg.ack(1, g1.group_id)
    gg.check_invariants()
    assert gg.metrics()["pending_groups"] == 0 and gg.metrics()["active_groups"] == 0


def test_away_of_bad_or_departed_workers():
    gg = RandomGroupGenerator(3, seed=0)
    for bad in (-1, 3, "x"):
        with pytest.raises(InvalidArgument):
            gg.away(bad, now=0.0)
    gg.finish(2, now=0.0)
    assert gg.away(2, now=0.0) == [] and gg.metrics()["state"][2] == "finished"
    with pytest.raises(ProtocolViolation):
        gg.back(2)
    gg.away(1, now=0.0)
    gg.finish(1, now=0.0)  # an away worker may finish; it is finished, not away, afterwards
    assert gg.metrics()["state"] == ["live", "finished", "finished"] and gg.metrics()["away_events"] == 1
    gg.check_invariants()


class AwayDriver(Driver):
    """Driver plus away/back, checking from outside that away workers are never drafted into new groups and that
    away() never returns a group the worker had already received."""

    def __init__(self, gg):
        super().__init__(gg)
        self.away = set()  # the test's own model of who is away
        self.received = [set() for _ in range(gg.size)]
        self.excluded = [set() for _ in range(gg.size)]
        orig = gg._new_group

        def spy(members, creator, phase, now):  # every group formed, checked against the test's own model
            g = orig(members, creator, phase, now)
            assert not set(g.members) & self.away, f"away workers {self.away} drafted into {g.members}"
            return g

        gg._new_group = spy

    def _taking_part(self, gid, members):
        return {m for m in members if gid not in self.excluded[m]}

    def observe(self, w, g):
        super().observe(w, g)
        assert g.group_id not in self.excluded[w], f"worker {w} received group {g.group_id} it was excused from"
        self.received[w].add(g.group_id)

    def go_away(self, w):
        gg = self.gg
        was_live = gg.worker_state(w) not in ("finished", "evicted")
        groups = gg.away(w, self.now)
        for g in groups:
            assert w in g.members and g.group_id not in self.received[w], (w, g)
            assert self.handed.get(g.group_id, g.members) == g.members  # same list the others see
            self.excluded[w].add(g.group_id)
        if was_live:
            if w in self.away:
                assert groups == []
            self.away.add(w)
        assert not gg._queue[w] and not gg.is_waiting(w)
        gg.check_invariants()

    def act(self, w):
        if self.gg.held_group(w) is None:  # it requests: back in its training step
            self.away.discard(w)
        return super().act(w)

    def step(self, w, kind):
        if kind == 6:
            self.go_away(w)
            return
        if kind == 7:
            if self.gg.worker_state(w) not in ("finished", "evicted"):
                self.gg.back(w, self.now)
                self.away.discard(w)
            self.gg.check_invariants()
            return
        if kind in (0, 1, 2) and (self.gg.worker_state(w) in ("idle", "waiting") or kind == 2):
            self.away.discard(w)  # Driver.step requests: back in its training step
        super().step(w, kind)
        if self.gg.worker_state(w) in ("finished", "evicted"):
            self.away.discard(w)


away_ops = st.lists(st.tuples(st.integers(0, 10), st.integers(0, 12)), min_size=1, max_size=120)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, script=away_ops, forever=st.sets(st.integers(0, 8), max_size=4))
def test_property_away_interleavings_keep_invariants_and_never_block_the_others(cfg, script, forever):
    gg = generator_for(cfg)
    d = AwayDriver(gg)
    n = cfg["size"]
    for kind, w in script:
        w %= n
        kind = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 2, 6: 3, 7: 4, 8: 5, 9: 6, 10: 7}[kind]
        if kind == 3 and w % 3:
            kind = 0
        d.step(w, kind)

    # Some workers go away for good (after acking what they hold, as the runtime does after its P-Reduce).
    forever = {w % n for w in forever} - {n - 1}  # at least one worker keeps training
    for w in forever:
        if gg.held_group(w) is not None:
            gg.ack(w, gg.held_group(w), d.now)
        d.go_away(w)
    others = [w for w in range(n) if w not in forever]

    # No deadlock, no starvation: the others keep requesting and acking, and each of their requests is served.
    served = {w: 0 for w in others}
    for _ in range(8 * n + 20):
        for w in others:
            if gg.worker_state(w) in ("finished", "evicted"):
                if gg.held_group(w) is not None:  # an obligation of its finish
                    d.act(w)
                served[w] = 3
                continue
            before = gg.metrics()["syncs"][w]
            d.act(w)
            if gg.metrics()["syncs"][w] > before:
                served[w] += 1
        if all(c >= 3 for c in served.values()):
            break
    assert all(c >= 3 for c in served.values()), f"starved: {served} (away for good: {forever})"

    # The others finish and everything drains although the away workers never come back.
    drain(gg, d, others, rounds=10 * n + 20)
    m = gg.metrics()
    assert all(m["state"][w] in ("finished", "evicted") for w in others)
    assert m["pending_groups"] == 0 and m["active_groups"] == 0


@settings(max_examples=40, deadline=None)
@given(
    cfg=configs,
    speeds=st.lists(st.floats(0.2, 5.0), min_size=9, max_size=9),
    iters=st.integers(2, 20),
    leave_at=st.lists(st.one_of(st.none(), st.integers(1, 20)), min_size=9, max_size=9),
    breaks=st.lists(st.floats(0.0, 3.0), min_size=9, max_size=9),
)
def test_property_simulated_training_with_away_workers_never_deadlocks(cfg, speeds, iters, leave_at, breaks):
    """Workers take breaks between steps (validation) and some leave for good; the others finish all their
    iterations, and no group formed while a worker was away contains it."""
    gg = generator_for(dict(cfg, ack_timeout=None))
    n = cfg["size"]
    leave_at[n - 1] = None  # somebody stays
    away_since = {}
    orig_away = gg.away

    def spy_away(w, now=None):
        away_since[w] = gg._next_gid
        return orig_away(w, now)

    gg.away = spy_away

    def away(w, it):
        if leave_at[w] is not None and it >= leave_at[w]:
            return math.inf
        return breaks[w] if it % 3 == 0 and breaks[w] > 0 else None

    res = simulate(gg, speeds[:n], iters, comm_time=0.05, check=True, away=away)
    for w in range(n):
        done = len(res.iteration_ends[w])
        assert done == (min(iters, leave_at[w]) if leave_at[w] is not None else iters), (w, done)
    for w in range(n):
        if leave_at[w] is not None and leave_at[w] < iters:
            assert all(w not in g.members for g in res.groups if g.group_id >= away_since[w])


def test_silent_away_workers_deadlock_the_gg_reported_ones_do_not():
    """Why away() exists: the engine alone lets the P-Reduces go on without a worker that left, but a GG that is
    not told keeps waiting for that worker's receive/ack, and the others' groups behind it never run."""
    from gg_sim import SimDeadlock

    def away(w, it):
        return float("inf") if w in (0, 2) and it == 3 else None

    for make in (lambda: RandomGroupGenerator(6, 3, seed=4), lambda: SmartGroupGenerator(6, 3, seed=4, c_thres=None)):
        with pytest.raises(SimDeadlock):
            simulate(make(), [1.0, 1.1, 0.9, 1.2, 1.0, 1.3], 20, away=away, report_away=False)
        res = simulate(make(), [1.0, 1.1, 0.9, 1.2, 1.0, 1.3], 20, away=away, check=True)
        assert [len(e) for e in res.iteration_ends] == [3, 20, 3, 20, 20, 20]
