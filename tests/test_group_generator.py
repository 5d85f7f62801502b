"""Unit and property tests of the Ripples Group Generator state machines (no gRPC).

Paper: Ripples, §4.1 (random GG, lock vector, pending queue, acks), §5.1 (Group Buffer, Global Division), §5.2
(Inter-Intra), §5.3 (slowdown filter), §3.3 (connectivity).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetsync.coordinator.group_generator import (
    GroupFailed,
    InvalidArgument,
    ProtocolViolation,
    RandomGroupGenerator,
    SmartGroupGenerator,
    WorkerEvicted,
    _BaseGroupGenerator,
    make_generator,
)
from conftest import connected
from gg_sim import simulate


class ScriptedGG(_BaseGroupGenerator):
    """Random GG whose 'random' choices are scripted, to replay the paper's figures exactly."""

    mode = "scripted"

    def __init__(self, size, script, **kw):
        super().__init__(size, **kw)
        self.script = list(script)

    def _generate(self, requester, now):
        members = self.script.pop(0)
        assert requester in members
        self._new_group(members, requester, "random", now)


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


# --------------------------------------------------------------------------- heterogeneity (simulation)
def _fast_slow_run(gg, n, slow, iters=120):
    ct = [1.0] * n
    ct[slow] = 5.0
    res = simulate(gg, ct, [iters if w != slow else iters // 5 for w in range(n)], comm_time=0.1, check=True)
    fast = [w for w in range(n) if w != slow]
    return res, fast


@pytest.mark.parametrize("nodes", [1, 2])
def test_slow_worker_does_not_block_fast_ones_with_smart_gg(nodes):
    n, slow = 8, 3
    node_of = [i * nodes // n for i in range(n)]
    smart, fast = _fast_slow_run(SmartGroupGenerator(n, 3, node_of=node_of, c_thres=4, seed=11), n, slow)
    rand, _ = _fast_slow_run(RandomGroupGenerator(n, 3, seed=11), n, slow)
    ideal = 1.0 + 0.1
    t_smart = smart.mean_iteration_time(fast)
    t_rand = rand.mean_iteration_time(fast)
    print(f"nodes={nodes}: fast-worker iteration time smart={t_smart:.3f} random={t_rand:.3f} ideal={ideal}")
    assert t_smart < 1.25 * ideal
    assert t_rand > 1.5 * t_smart  # the random GG keeps dragging fast workers into the slow worker's groups
    # The slow worker is not starved: it still synchronizes with others in a good share of its iterations
    # (all of them with one node; about half with Inter-Intra, whose 2-deep buffers leave fewer workers idle).
    slow_groups = [g for g in smart.groups if slow in g.members and len(g.members) > 1]
    print(f"slow worker synchronized in {len(slow_groups)} of {len(smart.iteration_ends[slow])} iterations")
    assert len(slow_groups) >= (0.9 if nodes == 1 else 0.35) * len(smart.iteration_ends[slow])


def test_exclude_laggards_extension():
    counters = [10, 10, 10, 3, 3, 2]  # 0-2 fast; 3 and 4 lag (e.g. dragged down by 5 early on); 5 is slow
    paper = SmartGroupGenerator(6, group_size=6, c_thres=3, seed=0, inter_intra=False, exclude_laggards=False)
    paper._counter[:] = counters
    assert paper.request(3, now=0.0).members == (0, 1, 2, 3, 4, 5)  # c_3 - c_w < 3 for everybody
    ext = SmartGroupGenerator(6, group_size=6, c_thres=3, seed=0, inter_intra=False)
    ext._counter[:] = counters
    assert ext.request(3, now=0.0).members == (0, 1, 2, 3)  # laggards 4, 5 are not drafted


def test_without_filter_slow_worker_blocks_smart_gg():
    n, slow = 8, 3
    on, fast = _fast_slow_run(SmartGroupGenerator(n, 3, c_thres=4, seed=1, inter_intra=False), n, slow)
    off, _ = _fast_slow_run(SmartGroupGenerator(n, 3, c_thres=None, seed=1, inter_intra=False), n, slow)
    assert on.mean_iteration_time(fast) < off.mean_iteration_time(fast)


@pytest.mark.parametrize(
    "make",
    [
        lambda n, s: RandomGroupGenerator(n, 3, seed=s),
        lambda n, s: SmartGroupGenerator(n, 3, seed=s, c_thres=3, inter_intra=False),
        lambda n, s: SmartGroupGenerator(n, 3, node_of=[i % 3 for i in range(n)], seed=s, c_thres=3),
        lambda n, s: SmartGroupGenerator(n, 2, node_of=[i // 4 for i in range(n)], seed=s, c_thres=None),
    ],
    ids=["random", "smart", "smart-inter-intra-3nodes", "smart-inter-intra-gs2"],
)
def test_long_random_runs_connect_all_workers_without_deadlock(make):
    for seed in range(3):
        rng = random.Random(seed)
        n = rng.randint(5, 12)
        speed = [rng.choice([1.0, 1.0, 1.3, 3.0]) for _ in range(n)]
        gg = make(n, seed)
        res = simulate(gg, lambda w, it: speed[w] * rng.uniform(0.5, 1.5), 60, comm_time=0.05, check=(seed == 0))
        assert connected(n, [g.members for g in res.groups]), (n, seed)  # §3.3: information of any worker reaches every worker
        m = gg.metrics()
        assert m["groups_failed"] == 0 and m["pending_groups"] == 0 and m["active_groups"] == 0
        assert all(len(res.iteration_ends[w]) == 60 for w in range(n))
        # consistency: a given id always names the same members
        seen = {}
        for g in res.groups:
            assert seen.setdefault(g.group_id, g.members) == g.members


# ------------------------------------------------------------------------------- hypothesis properties
class Driver:
    """Drives a generator with arbitrary interleavings and checks, after every event, the generator's own
    invariants plus externally observed atomicity and consistency."""

    def __init__(self, gg):
        self.gg = gg
        self.now = 0.0
        self.handed = {}  # gid -> members as first handed out
        self.open = {}  # gid -> members of groups handed out and not yet completed
        self.events = 0

    def _completed(self, gid):
        return gid not in self.gg._groups

    def _taking_part(self, gid, members):
        """The members that run the group's P-Reduce (AwayDriver: not those that were away before receiving it)."""
        return set(members)

    def observe(self, w, g):
        assert g is not None and w in g.members
        assert self.handed.setdefault(g.group_id, g.members) == g.members, "inconsistent group"
        for gid in [x for x in self.open if self._completed(x)]:
            del self.open[gid]
        for gid, members in self.open.items():
            if gid != g.group_id:
                overlap = self._taking_part(gid, members) & self._taking_part(g.group_id, g.members)
                assert not overlap, f"atomicity: {overlap} in groups {gid} and {g.group_id}"
        if not g.is_singleton:
            self.open[g.group_id] = g.members

    def step(self, w, kind):
        gg = self.gg
        state = gg.worker_state(w)
        self.events += 1
        try:
            if kind == 3:
                for g in gg.finish(w, self.now):
                    self.observe(w, g)
            elif kind == 4:
                self.now += 1.0
                gg.expire(self.now)
            elif kind == 5:
                gid = random.Random(self.events).randint(1, gg._next_gid + 2)
                try:
                    gg.ack(w, gid, self.now)
                except (InvalidArgument, ProtocolViolation):
                    pass
            elif state in ("idle", "waiting") or kind == 2:
                g = gg.request(w, self.now) if state != "waiting" or kind == 2 else gg.poll(w, self.now)
                if g is not None:
                    self.observe(w, g)
            elif gg.held_group(w) is not None:
                gg.ack(w, gg.held_group(w), self.now)
        except GroupFailed as exc:
            assert w not in exc.workers
        except WorkerEvicted:
            assert state == "evicted"
        except ProtocolViolation:
            assert kind == 2 or state == "finished", (kind, state)
        gg.check_invariants()

    def act(self, w):
        """What a well-behaved worker does next; returns False if it has nothing to do."""
        gg = self.gg
        state = gg.worker_state(w)
        if gg.held_group(w) is not None:
            gg.ack(w, gg.held_group(w), self.now)
        elif state in ("idle", "waiting"):
            try:
                g = gg.request(w, self.now)
            except GroupFailed:
                return True
            if g is not None:
                self.observe(w, g)
        else:
            return False
        gg.check_invariants()
        return True


configs = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["random", "smart"]),
        "size": st.integers(2, 9),
        "group_size": st.integers(2, 4),
        "nodes": st.integers(1, 3),
        "c_thres": st.sampled_from([None, 1, 2, 4]),
        "inter_intra": st.booleans(),
        "ack_timeout": st.sampled_from([None, 3.0, 50.0]),
        "seed": st.integers(0, 2**16),
    }
)
ops = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 12)), min_size=1, max_size=120)


def _make(cfg):
    n = cfg["size"]
    if cfg["mode"] == "random":
        return RandomGroupGenerator(n, cfg["group_size"], seed=cfg["seed"], ack_timeout=cfg["ack_timeout"],
                                    group_buffer=cfg["seed"] % 2 == 0)  # §5.1 GB variant and §4.1's rule
    return SmartGroupGenerator(
        n,
        cfg["group_size"],
        node_of=[i % cfg["nodes"] for i in range(n)],
        c_thres=cfg["c_thres"],
        seed=cfg["seed"],
        inter_intra=cfg["inter_intra"],
        ack_timeout=cfg["ack_timeout"],
    )


def _drain(gg, d, workers, rounds):
    """Lets ``workers`` run their held/waiting groups and finish (running obligations) until nothing moves."""
    for _ in range(rounds):
        progressed = False
        for w in workers:
            st_ = gg.worker_state(w)
            if gg.held_group(w) is not None or st_ == "waiting":
                progressed |= d.act(w)
            elif st_ == "idle":
                for g in gg.finish(w, d.now):
                    d.observe(w, g)
                progressed = True
            gg.check_invariants()
        if not progressed:
            break


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, script=ops)
def test_property_random_interleavings_keep_invariants_and_terminate(cfg, script):
    gg = _make(cfg)
    d = Driver(gg)
    n = cfg["size"]
    for kind, w in script:
        w %= n
        # mostly well-behaved actions; finishes (3) and clock jumps (4) rarer; 2/5 probe error paths
        kind = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 2, 6: 3, 7: 4, 8: 5}[kind]
        if kind == 3 and w % 3:
            kind = 0
        d.step(w, kind)

    # No starvation: if every live worker keeps working, every waiting worker gets its group, soon.
    waiting = {w for w in range(n) if gg.worker_state(w) == "waiting"}
    for _ in range(6 * n + 20):
        for w in range(n):
            if w in waiting and d.act(w) and gg.worker_state(w) != "waiting":
                waiting.discard(w)
            elif w not in waiting:
                d.act(w)
        if not waiting:
            break
    assert not waiting, f"starved workers {waiting}"

    # Everybody finishes (running obligations): the system drains completely (no deadlock).
    _drain(gg, d, range(n), rounds=10 * n + 20)
    assert all(gg.worker_state(w) in ("finished", "evicted") for w in range(n))
    assert all(gg.held_group(w) is None for w in range(n))
    m = gg.metrics()
    assert m["pending_groups"] == 0 and m["active_groups"] == 0
    assert m["groups_formed"] >= m["groups_completed"] + m["groups_failed"]


@settings(max_examples=40, deadline=None)
@given(
    cfg=configs,
    speeds=st.lists(st.floats(0.2, 5.0), min_size=9, max_size=9),
    iters=st.integers(1, 25),
)
def test_property_simulated_training_never_deadlocks(cfg, speeds, iters):
    gg = _make(dict(cfg, ack_timeout=None))
    n = cfg["size"]
    res = simulate(gg, speeds[:n], [iters + (w % 3) for w in range(n)], comm_time=0.05, check=True)
    assert all(len(res.iteration_ends[w]) == iters + (w % 3) for w in range(n))


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
    gg = _make(cfg)
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
    _drain(gg, d, others, rounds=10 * n + 20)
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
    gg = _make(dict(cfg, ack_timeout=None))
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
