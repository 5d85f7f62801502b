"""Unit and property tests of the Ripples Group Generator state machines (no gRPC).

Paper: Ripples, §4.1 (random GG, lock vector, pending queue, acks), §5.1 (Group Buffer, Global Division), §5.2
(Inter-Intra), §5.3 (slowdown filter), §3.3 (connectivity).
"""

from __future__ import annotations

import pytest

from hetsync.coordinator.group_generator import (
    GroupFailed,
    InvalidArgument,
    ProtocolViolation,
    RandomGroupGenerator,
    SmartGroupGenerator,
    WorkerEvicted,
    make_generator,
)
from gg_driver import ScriptedGG
from gg_sim import simulate


# ------------------------------------------------------------------------------------------- §4.1 random GG
def test_fig8_lock_vector_pending_queue_and_acks():
    gg = ScriptedGG(8, [[0, 4, 5], [4, 5, 7]], ack_timeout=None)
    g1 = gg.request(0, now=0.0)  # ① ③ ④ ⑤
    assert g1.members == (0, 4, 5)
    assert [gg._lock[w] for w in (0, 4, 5)] == [g1.group_id] * 3
    assert gg.request(7, now=1.0) is None  # ② ⑥ conflicting group parked in the pending queue
    assert gg.metrics()["conflicts"] == 1
    info = gg.wait_info(7)
    assert info.members == (4, 5, 7) and info.busy == (4, 5) and info.awaiting == (0, 4, 5)
    assert "awaiting worker(s) [0, 4, 5]" in info.describe()
    # W4 and W5 learn about group 1 on their next request (notification) and get the identical group.
    assert gg.request(4, now=2.0) == g1
    assert gg.request(5, now=2.0) == g1
    gg.check_invariants()
    assert gg.ack(0, g1.group_id, now=3.0) is False  # ⑦ ⑧
    assert gg.ack(4, g1.group_id, now=3.0) is False
    assert gg.poll(7, now=3.0) is None  # still locked by W5
    assert gg.ack(5, g1.group_id, now=4.0) is True  # all acked: locks released, pending group runs
    g2 = gg.poll(7, now=4.0)
    assert g2.members == (4, 5, 7)
    assert gg.metrics()["pending_time_s"][7] == pytest.approx(3.0)
    assert gg.request(4, now=5.0) == g2 and gg.request(5, now=5.0) == g2
    gg.check_invariants()
    assert gg.ack(4, g2.group_id) is False and gg.ack(4, g2.group_id) is False  # idempotent
    gg.ack(5, g2.group_id)
    assert gg.ack(7, g2.group_id) is True
    assert gg.metrics()["groups_completed"] == 2
    gg.check_invariants()


def test_random_group_contains_requester_and_is_clipped_to_live_workers():
    gg = RandomGroupGenerator(5, group_size=3, seed=3)
    for w in range(5):
        gg2 = RandomGroupGenerator(5, group_size=3, seed=w)
        g = gg2.request(w, now=0.0)
        assert w in g.members and len(g.members) == 3 and list(g.members) == sorted(g.members)
    for w in (1, 2, 3, 4):
        gg.finish(w, now=0.0)
    g = gg.request(0, now=1.0)
    assert g.members == (0,) and g.is_singleton  # nobody else alive: no synchronization
    assert gg.request(0, now=2.0).is_singleton  # singletons need no ack
    two = RandomGroupGenerator(2, group_size=4, seed=0)
    assert two.request(1, now=0.0).members == (0, 1)


def _round_robin(gg, steps, n):
    """Workers 0..n-1 in turn run Fig 7's loop on the GG (request / poll, ack at once, a drafted group followed
    by a continuation request).  Returns (worker, group, creator) for every non-singleton hand-out."""
    holding, waiting, out = [None] * n, [False] * n, []
    for t in range(steps):
        w = t % n
        if holding[w] is not None:
            gg.ack(w, holding[w].group_id, now=float(t))
            holding[w] = None
            continue
        g = gg.poll(w, now=float(t)) if waiting[w] else gg.request(w, now=float(t))
        waiting[w] = g is None
        if g is not None and not g.is_singleton:
            gid = g.group_id
            creator = (gg._groups.get(gid) or gg._recent[gid]).creator
            out.append((w, g, creator))
            holding[w] = g
        gg.check_invariants()
    return out


@pytest.mark.parametrize("group_buffer", [False, True])
def test_random_gg_group_buffer_is_an_option(group_buffer):
    """§4.1: every request gets a fresh random group; a request never ends with a group generated for another
    worker's request (those are handed out as "drafted": run, then ask again).  §5.1's Group Buffer
    (group_buffer=True): a request is served with the group another worker's request drafted it into."""
    gg = RandomGroupGenerator(5, group_size=3, seed=0, ack_timeout=None, group_buffer=group_buffer)
    handed = _round_robin(gg, 600, 5)
    served_from_buffer = [(w, g) for w, g, creator in handed if creator != w and g.phase != "drafted"]
    drafted = [(w, g) for w, g, creator in handed if g.phase == "drafted"]
    requests = sum(gg.metrics()["requests"])
    if group_buffer:
        assert served_from_buffer and not drafted
        assert gg.metrics()["groups_formed"] < requests  # buffered requests make no group
    else:
        assert not served_from_buffer, served_from_buffer[:3]
        assert drafted and all(creator != w for w, g, creator in handed if g.phase == "drafted")
        assert gg.metrics()["groups_formed"] == requests  # one fresh group per request


def test_paper_random_drafted_groups_come_first_then_the_own_group():
    gg = RandomGroupGenerator(3, group_size=3, seed=0, ack_timeout=None, group_buffer=False)
    g1 = gg.request(0, now=0.0)  # [0, 1, 2], W0's own
    assert g1.phase == "random" and g1.members == (0, 1, 2)
    d = gg.request(1, now=1.0)  # W1's request makes its own group but first hands out W0's
    assert d.group_id == g1.group_id and d.phase == "drafted" and gg.metrics()["groups_formed"] == 2
    for w in (0, 1):
        gg.ack(w, g1.group_id)
    assert gg.request(1, now=2.0) is None  # continuation: no new group, its own waits for W2 (still in g1)
    assert gg.metrics()["groups_formed"] == 2 and gg.metrics()["requests"][1] == 1
    assert gg.request(2, now=3.0).phase == "drafted"
    gg.ack(2, g1.group_id)
    own = gg.poll(1, now=4.0)
    assert own.phase == "random" and own.group_id == g1.group_id + 1
    gg.check_invariants()


def test_state_survives_a_sync_point():
    """§5.3's counters (and the rest of the generator) survive a consensus round: every worker leaves (finish)
    and comes back (resume); a fresh generator would start every c_w at 0 and draft the slow worker again."""
    gg = SmartGroupGenerator(4, group_size=2, c_thres=2, seed=0, inter_intra=False, ack_timeout=None)
    gg._counter[:] = [9, 9, 9, 1]  # worker 3 is slow
    before = list(gg.metrics()["requests"])
    for w in range(4):
        gg.finish(w, now=1.0)
    assert gg.resume(now=2.0) == [0, 1, 2, 3]
    assert gg.metrics()["requests"] == before and gg.metrics()["state"] == ["live"] * 4
    g = gg.request(0, now=3.0)
    assert 3 not in g.members  # still filtered out: the counters were not reset
    assert gg.resume(now=3.0) == []  # nobody left: nothing to do
    gg.check_invariants()


def test_same_seed_same_groups():
    def run(cls, seed):
        gg = cls(8, 3, seed=seed)
        res = simulate(gg, [1.0, 1.2, 0.9, 1.5, 1.1, 1.0, 2.0, 1.3], 20)
        return [g.members for g in res.groups]

    for cls in (RandomGroupGenerator, SmartGroupGenerator):
        assert run(cls, 7) == run(cls, 7)
        assert run(cls, 7) != run(cls, 8)


def test_malformed_and_protocol_errors():
    gg = RandomGroupGenerator(4, 2, seed=0, ack_timeout=None)
    for bad in (-1, 4, 99, "x", 1.5, None):
        with pytest.raises(InvalidArgument):
            gg.request(bad, now=0.0)
    with pytest.raises(InvalidArgument):
        gg.ack(0, 12345, now=0.0)
    with pytest.raises(InvalidArgument):
        gg.ack(0, 0, now=0.0)
    with pytest.raises(ProtocolViolation):
        gg.poll(0, now=0.0)  # nothing outstanding
    g = gg.request(0, now=0.0)
    outsider = next(w for w in range(4) if w not in g.members)
    with pytest.raises(InvalidArgument):
        gg.ack(outsider, g.group_id, now=0.0)
    other = next(m for m in g.members if m != 0)
    with pytest.raises(ProtocolViolation):
        gg.ack(other, g.group_id, now=0.0)  # before receiving it
    with pytest.raises(ProtocolViolation):
        gg.request(0, now=0.0, last_seen=g.group_id)  # still holding: ack first
    assert gg.request(0, now=0.0, last_seen=0) == g  # reply was lost: same group handed out again
    gg.check_invariants()
    gg.finish(3, now=1.0)
    with pytest.raises(ProtocolViolation):
        gg.request(3, now=1.0)
    assert gg.finish(3, now=1.0) == []  # idempotent
    with pytest.raises(ValueError):
        RandomGroupGenerator(0)
    with pytest.raises(ValueError):
        SmartGroupGenerator(4, node_of=[0, 1])
    with pytest.raises(ValueError):
        make_generator("nope", 4)


# ----------------------------------------------------------------------------------------------- finish()
def test_finish_removes_worker_from_unstarted_groups():
    gg = ScriptedGG(6, [[0, 1, 2], [2, 3, 4], [3, 5]], ack_timeout=None)
    g1 = gg.request(0, now=0.0)
    assert gg.request(3, now=0.0) is None  # [2,3,4] waits for worker 2
    gg.finish(4, now=1.0)  # 4 in a pending group: simply removed
    assert gg.wait_info(3).members == (2, 3)
    gg.check_invariants()
    # Worker 2 has g1 (already handed to worker 0) at the head of its buffer: finishing makes it an obligation.
    obligations = gg.finish(2, now=2.0)
    assert obligations == [g1]
    # [2,3] lost worker 2: left with only the waiting requester 3 -> singleton = no synchronization.
    solo = gg.poll(3, now=2.0)
    assert solo.members == (3,) and solo.is_singleton
    assert gg.finish(2, now=2.5) == [g1]  # repeated finish returns the still un-acked obligation
    gg.request(1, now=3.0)
    for w in (0, 1, 2):
        gg.ack(w, g1.group_id, now=3.0)
    gg.check_invariants()
    g3 = gg.request(5, now=4.0)  # [3,5]
    assert g3.members == (3, 5)
    obl = gg.finish(3, now=4.0)
    assert obl == [g3]
    assert gg.ack(3, g3.group_id) is False
    assert gg.ack(5, g3.group_id) is True
    gg.check_invariants()
    assert gg.metrics()["state"][2] == "finished"


def test_finish_drops_group_left_with_one_idle_member():
    gg = ScriptedGG(4, [[0, 1], [1, 2]], ack_timeout=None)
    gg.request(0, now=0.0)
    assert gg.request(2, now=0.0) is None  # [1,2] pending behind [0,1]
    gg.finish(2, now=0.5)  # a waiting worker may give up and finish
    gg.check_invariants()
    assert [g.members for g in gg.buffer(1)] == [(0, 1)]  # [1,2] with only worker 1 left was dropped


# ------------------------------------------------------------------------------------------- ack timeout
def test_never_received_group_fails_after_ack_timeout():
    gg = ScriptedGG(4, [[0, 1, 2]], ack_timeout=10.0)
    g = gg.request(0, now=0.0)
    gg.request(1, now=1.0)
    assert gg.next_deadline() == 10.0
    assert gg.expire(now=9.9) == []
    assert gg.expire(now=10.0) == [g.group_id]  # worker 2 never showed up
    gg.check_invariants()
    for w in (0, 1):  # members holding the group learn which worker failed them, once
        with pytest.raises(GroupFailed) as ei:
            gg.request(w, now=11.0)
        assert ei.value.workers == (2,) and ei.value.group_id == g.group_id and "[2]" in str(ei.value)
    with pytest.raises(WorkerEvicted):
        gg.request(2, now=11.0)
    assert gg.ack(0, g.group_id, now=11.0) is False  # a late ack is harmless
    gg.script = [[0, 1, 3]]
    g2 = gg.request(0, now=12.0)
    assert 2 not in g2.members
    assert gg.metrics()["groups_failed"] == 1 and gg.metrics()["state"][2] == "evicted"
    gg.check_invariants()


def test_never_acking_worker_is_evicted_and_locks_released():
    gg = ScriptedGG(4, [[0, 1, 2], [1, 2, 3]], ack_timeout=5.0)
    g = gg.request(0, now=0.0)
    gg.request(1, now=0.0)
    gg.request(2, now=0.0)
    gg.ack(0, g.group_id, now=1.0)
    gg.ack(1, g.group_id, now=1.0)  # worker 2 hangs after its P-Reduce and never acks
    assert gg.request(3, now=2.0) is None  # [1,2,3] blocked by the lock of worker 2
    assert gg.poll(3, now=4.9) is None
    g2 = gg.poll(3, now=5.0)  # expiry releases the locks; 2 is evicted and dropped from the pending group
    assert g2.members == (1, 3)
    assert gg.request(1, now=5.0) == g2  # workers that acked get no error
    with pytest.raises(WorkerEvicted):
        gg.request(2, now=6.0)
    gg.check_invariants()


# ---------------------------------------------------------------------------------------- §5 smart GG
def test_fig11_global_division_fills_group_buffers():
    gg = SmartGroupGenerator(4, group_size=2, seed=1, c_thres=None)
    g0 = gg.request(0, now=0.0)
    assert len(g0.members) == 2 and 0 in g0.members
    assert gg.metrics()["global_divisions"] == 1
    rest = [w for w in range(4) if w not in g0.members]
    assert [b.members for b in gg.buffer(rest[0])] == [tuple(rest)]  # the other pair was made by the same GD
    g3 = gg.request(rest[1], now=1.0)
    assert g3.members == tuple(rest)
    assert gg.metrics()["global_divisions"] == 1  # served from the Group Buffer, no new division
    gg.check_invariants()


def test_global_division_only_takes_idle_workers_and_partitions_them():
    gg = SmartGroupGenerator(10, group_size=3, seed=5, c_thres=None)
    first = gg.request(0, now=0.0)
    busy = set()
    for w in range(10):
        busy.update(g.members for g in gg.buffer(w))
    groups = {g for w in range(10) for g in gg.buffer(w)} | {first}
    members = [m for g in groups for m in g.members]
    assert sorted(members) == list(range(10))  # a partition of all (idle) workers
    # 10 = 3 + 3 + 2 + 2: a single left-over takes one worker from the previous group (no group above group_size)
    assert sorted(len(g.members) for g in groups) == [2, 2, 3, 3]
    # Everybody is in a group now: a worker finishing its group and requesting again only gets idle partners.
    for m in first.members:
        if m != 0:
            gg.request(m, now=1.0)
    for m in first.members:
        gg.ack(m, first.group_id, now=2.0)
    g = gg.request(0, now=3.0)
    assert set(g.members) <= set(first.members)
    gg.check_invariants()


def test_inter_intra_two_rounds_heads_rotate():
    node_of = [0, 0, 0, 0, 1, 1, 1, 1]
    gg = SmartGroupGenerator(8, group_size=3, node_of=node_of, seed=2, c_thres=None)
    g = gg.request(0, now=0.0)
    buffers = {w: ([g] if w == 0 else []) + gg.buffer(w) for w in range(8)}
    heads = set()
    for w, buf in buffers.items():
        assert len(buf) == 2, (w, buf)  # one Inter-phase group, then one Intra-phase group (Fig 12)
        first, second = buf
        assert first.phase in ("inter", "local") and second.phase == "intra"
        assert second.members == tuple(r for r in range(8) if node_of[r] == node_of[w])
        if first.phase == "inter":
            heads.add(w)
            assert sorted(node_of[m] for m in first.members) == [0, 1]  # one head per node
        else:
            assert {node_of[m] for m in first.members} == {node_of[w]}  # non-heads: local only
    assert len(heads) == 2
    # Every member sees its groups in the same order (same ids, same order in every buffer).
    ids = {w: [b.group_id for b in buf] for w, buf in buffers.items()}
    for w in range(8):
        for v in range(8):
            common = [x for x in ids[w] if x in ids[v]]
            assert common == [x for x in ids[v] if x in ids[w]]
    # Run everything, then a second division must pick the next local rank as head (rotation).
    gg = SmartGroupGenerator(8, group_size=3, node_of=node_of, seed=2, c_thres=None)
    res = simulate(gg, [1.0] * 8, 4, check=True)
    inter_heads = [frozenset(x.members) for x in res.groups if x.phase == "inter"]
    assert len(set(inter_heads)) > 1


def test_slowdown_filter_excludes_lagging_worker_only_for_fast_initiators():
    gg = SmartGroupGenerator(6, group_size=2, c_thres=3, seed=0, inter_intra=False)
    gg._counter[:] = [10, 10, 10, 10, 10, 2]  # worker 5 requested far fewer groups (it is slow)
    g = gg.request(0, now=0.0)
    assert all(5 not in b.members for w in range(6) for b in gg.buffer(w)) and 5 not in g.members
    assert gg.buffer(5) == []
    gg2 = SmartGroupGenerator(6, group_size=6, c_thres=3, seed=0, inter_intra=False)
    gg2._counter[:] = [10, 10, 10, 10, 10, 2]
    g = gg2.request(5, now=0.0)  # the slow worker initiates: faster idle workers may join (§5.3)
    assert g.members == (0, 1, 2, 3, 4, 5)
