"""Hop's queue logic as a pure state machine (tf_ops/engine/hop_state.cc through ctypes): property tests.

A small discrete-event simulation runs n workers, each with the engine's own HopState, over per-pair FIFO channels
(MPI's non-overtaking order) with random delivery and random per-worker compute times (one worker slowed).  After
every event it checks Hop's guarantees:
  - Table 1 / Theorem 2: Iter(i) - Iter(j) never exceeds the bound of the setting;
  - §4.2: the update queue never holds more than (1 + max_ig) |N_in(i)| entries;
  - Theorem 2's identity, with tokens in flight counted: tokens_i[j] + in flight(j -> i) == Iter(j) - Iter(i) +
    max_ig, also across jumps (§5);
  - every Recv takes exactly what its rule says (eq. 1 / backup workers: all updates tagged k that arrived, at least
    |N_in| - N of them; staleness: each in-neighbour's newest update within s, eq. (2) weights), and the reduce
    matches numpy.
"""
import collections
import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsync import ops  # a missing native library fails this module (no skip)
from hetsync.algorithms import hop_topology as topo


def state_api():
    """The C API over the engine's pure HopState (the bottom of tf_ops/engine/hop_state.cc), through ctypes: the
    queue rules are tested as the engine runs them."""
    c = ctypes.CDLL(ops._LIB_PATH)
    P, I, I64, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_double
    IP, I64P, DP = ctypes.POINTER(I), ctypes.POINTER(I64), ctypes.POINTER(D)
    sigs = {
        "hetsync_hop_state_new": ([I, I, IP, I, IP, I, I, I, I], P),
        "hetsync_hop_state_free": ([P], None),
        "hetsync_hop_state_update": ([P, I64, I, D], I),
        "hetsync_hop_state_tokens": ([P, I, I64, I64], None),
        "hetsync_hop_state_absent": ([P, I, I], None),
        "hetsync_hop_state_try_recv": ([P, I64, I, IP, IP, I64P, DP, DP, DP], I),
        "hetsync_hop_state_plan": ([P, I, I], I64),
        "hetsync_hop_state_try_advance": ([P, I64], I),
        "hetsync_hop_state_should_send": ([P, I], I),
        "hetsync_hop_state_iter": ([P], I64),
        "hetsync_hop_state_token_count": ([P, I], I64),
        "hetsync_hop_state_queue_size": ([P], I64),
        "hetsync_hop_state_dropped": ([P], I64),
    }
    for fn, (args, res) in sigs.items():
        getattr(c, fn).argtypes = args
        getattr(c, fn).restype = res
    return c


API = state_api()
CAP = 64


class Worker:
    def __init__(self, rank, ins, outs, max_ig, backup, staleness, compute, reuse=False):
        arr = lambda xs: (ctypes.c_int * max(1, len(xs)))(*xs)  # noqa: E731
        self.h = API.hetsync_hop_state_new(rank, len(ins), arr(ins), len(outs), arr(outs), max_ig, backup,
                                           -1 if staleness is None else staleness, int(reuse))
        self.rank, self.ins, self.outs, self.compute = rank, ins, outs, compute
        self.x = float(rank)
        self.phase, self.ticks, self.jump = "send", 0, 0

    def __del__(self):
        API.hetsync_hop_state_free(self.h)

    @property
    def iter(self):
        return API.hetsync_hop_state_iter(self.h)

    def recv(self, k):
        n = ctypes.c_int()
        senders, iters = (ctypes.c_int * CAP)(), (ctypes.c_int64 * CAP)()
        values, weights, self_w = (ctypes.c_double * CAP)(), (ctypes.c_double * CAP)(), ctypes.c_double()
        ok = API.hetsync_hop_state_try_recv(self.h, k, CAP, ctypes.byref(n), senders, iters, values, weights,
                                            ctypes.byref(self_w))
        if not ok:
            return None
        m = n.value
        return [(senders[i], iters[i], values[i], weights[i]) for i in range(m)], self_w.value


class Sim:
    def __init__(self, in_lists, max_ig, backup, staleness, skip, trigger, slow, factor, seed, reuse=False):
        self.rng = np.random.default_rng(seed)
        self.in_lists, self.outs = in_lists, topo.out_lists(in_lists)
        self.max_ig, self.backup, self.staleness, self.skip, self.trigger = max_ig, backup, staleness, skip, trigger
        n = len(in_lists)
        self.workers = [Worker(r, in_lists[r], self.outs[r], max_ig, backup, staleness,
                               factor if r == slow else 1, reuse) for r in range(n)]
        self.reuse = reuse
        self.chan = collections.defaultdict(collections.deque)  # (src, dst) -> messages
        self.delivered = collections.defaultdict(dict)  # dst -> {(sender, iter): value} arrived, not yet consumed
        self.newest = collections.defaultdict(dict)      # dst -> {sender: (iter, value)} (staleness shadow)
        self.reduced = collections.defaultdict(set)      # dst -> senders whose newest update dst reduced already
        self.dist = topo.distances(in_lists)
        self.max_queue = 0
        self.full_checks = True  # False: only the queue bound (long runs)

    # -- one event -----------------------------------------------------------------------------------------
    def step(self):
        busy = [c for c, q in self.chan.items() if q]
        if busy and self.rng.random() < 0.5:
            self.deliver(busy[self.rng.integers(len(busy))])
        else:
            self.act(self.workers[self.rng.integers(len(self.workers))])
        self.check()

    def deliver(self, key):
        src, dst = key
        kind, it, payload = self.chan[key].popleft()
        w = self.workers[dst]
        if kind == "token":
            API.hetsync_hop_state_tokens(w.h, src, it, payload)
            return
        kept = API.hetsync_hop_state_update(w.h, it, src, payload)
        if self.staleness is None:
            assert kept == (it >= w.iter), f"update ({src}, {it}) at iteration {w.iter}: kept={kept}"
            if kept:
                self.delivered[dst][(src, it)] = payload
        else:
            old = self.newest[dst].get(src)
            if old is None or it > old[0]:
                self.newest[dst][src] = (it, payload)
                self.reduced[dst].discard(src)

    def act(self, w):
        if w.phase == "send":
            for j in w.outs:
                if API.hetsync_hop_state_should_send(w.h, j):
                    self.chan[(w.rank, j)].append(("update", w.iter, w.x))
            w.phase, w.ticks = "compute", int(self.rng.integers(1, 3)) * w.compute
        elif w.phase == "compute":
            w.ticks -= 1
            if w.ticks <= 0:
                w.phase = "recv"
        elif w.phase == "recv":
            if self.receive(w, w.iter):
                w.x -= 0.01 * (w.rank + 1)
                w.jump = API.hetsync_hop_state_plan(w.h, self.skip, self.trigger) if self.skip else 0
                w.phase = "jump" if w.jump else "advance"
        elif w.phase == "jump":
            if self.receive(w, w.iter + w.jump):  # §5: Recv(k' - 1) + Reduce before jumping to k'
                w.phase = "advance"
        elif w.phase == "advance":
            steps = 1 + w.jump
            if API.hetsync_hop_state_try_advance(w.h, steps):
                for j in w.ins:
                    self.chan[(w.rank, j)].append(("token", w.iter, steps))
                w.jump, w.phase = 0, "send"

    # -- the receive rules, checked against the shadow -----------------------------------------------------
    def receive(self, w, k):
        got = w.recv(k)
        if got is None:
            return False
        entries, self_w = got
        senders = sorted(s for s, _, _, _ in entries)
        if self.staleness is None:
            want = {s: v for (s, it), v in self.delivered[w.rank].items() if it == k}
            assert senders == sorted(want), f"rank {w.rank} Recv({k}) took {senders}, rule says {sorted(want)}"
            need = len(w.ins) - self.backup
            assert len(senders) >= need, f"Recv({k}) with {len(senders)} < |N_in| - backup = {need}"
            assert self_w == 1 and all(wt == 1 for _, _, _, wt in entries)
            weights = {s: 1.0 for s in want}
            for key in [key for key in self.delivered[w.rank] if key[1] <= k]:
                del self.delivered[w.rank][key]
        else:
            lo = k - self.staleness
            good = {s: (it, v) for s, (it, v) in self.newest[w.rank].items() if it >= lo}
            assert len(good) >= len(w.ins) - self.backup, "Recv returned before enough satisfactory updates"
            # §4.4: N_in^(k) = the satisfactory updates received since the last Reduce; "newest": all of them
            want = good if self.reuse else {s: x for s, x in good.items() if s not in self.reduced[w.rank]}
            self.reduced[w.rank] |= set(want)
            assert senders == sorted(want), f"rank {w.rank} Recv({k}) took {senders}, rule says {sorted(want)}"
            weights = {s: float(want[s][0] - lo + 1) for s in want}  # eq. (2)
            assert self_w == self.staleness + 1
            for s, it, _, wt in entries:
                assert it == want[s][0] and wt == weights[s], f"eq. (2) weight of {s}: {wt} != {weights[s]}"
            want = {s: v for s, (_, v) in want.items()}
        total = self_w + sum(weights.values())
        expected = (self_w * w.x + sum(weights[s] * want[s] for s in want)) / total
        got_avg = (self_w * w.x + sum(wt * v for _, _, v, wt in entries)) / total
        assert np.isclose(got_avg, expected), (got_avg, expected)
        w.x = expected
        return True

    # -- invariants after every event ----------------------------------------------------------------------
    def check(self):
        if not self.full_checks:
            for w in self.workers:
                size = API.hetsync_hop_state_queue_size(w.h)
                assert size <= (1 + self.max_ig) * len(w.ins), f"queue {size} > (1 + max_ig) |N_in|"
                self.max_queue = max(self.max_queue, size)
            return
        iters = [w.iter for w in self.workers]
        for i, wi in enumerate(self.workers):
            for j in range(len(self.workers)):
                bound = topo.gap_bound(self.dist, i, j, self.max_ig, self.backup, self.staleness)
                assert iters[i] - iters[j] <= bound, f"Iter({i}) - Iter({j}) = {iters[i] - iters[j]} > {bound}"
            for j in wi.outs:
                flying = sum(n for kind, _, n in self.chan[(j, i)] if kind == "token")
                tokens = API.hetsync_hop_state_token_count(wi.h, j)
                assert tokens + flying == iters[j] - iters[i] + self.max_ig, "Theorem 2's token identity broke"
            size = API.hetsync_hop_state_queue_size(wi.h)
            assert size <= (1 + self.max_ig) * len(wi.ins), f"queue {size} > (1 + max_ig) |N_in|"
            self.max_queue = max(self.max_queue, size)


def graphs(n):
    names = ["ring", "ring-based"] + (["double-ring"] if n >= 4 and n % 2 == 0 else [])
    return st.sampled_from(names).map(lambda t: topo.build(t, n)) | st.just(_directed_cycle_plus(n))


def _directed_cycle_plus(n):
    """A directed graph (not symmetric): i <- i-1, plus i <- i+2."""
    return topo.validate_adjacency([[(i - 1) % n, (i + 2) % n] for i in range(n)], n)


VARIANTS = {  # name: (backup, staleness, skip, stale_reduce="newest")
    "standard": (0, None, None, False), "backup": (1, None, None, False), "staleness": (0, 2, None, False),
    "staleness-newest": (0, 2, None, True), "hybrid": (1, 1, None, False), "backup+skip": (1, None, 3, False),
    "staleness+skip": (0, 3, 2, False),
}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 7), data=st.data(), max_ig=st.integers(1, 4), variant=st.sampled_from(sorted(VARIANTS)),
       factor=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_queues_keep_hops_guarantees_under_random_delays(n, data, max_ig, variant, factor, seed):
    in_lists = data.draw(graphs(n))
    backup, staleness, skip, reuse = VARIANTS[variant]
    sim = Sim(in_lists, max_ig, backup, staleness, skip, 1 if skip else 0, slow=0, factor=factor, seed=seed,
              reuse=reuse)
    for _ in range(600):
        sim.step()
    assert max(w.iter for w in sim.workers) >= 2, "the simulation made no progress"


def test_skipping_lets_a_slow_worker_keep_up_and_keeps_token_accounting():
    def run(skip):
        sim = Sim(topo.build("ring-based", 6), 6, 1, None, skip=skip, trigger=1, slow=2, factor=6, seed=3)
        for _ in range(5000):
            sim.step()  # every event also checks the token identity across the jumps
        return sim.workers[2].iter, min(w.iter for w in sim.workers if w.rank != 2)

    slow_skip, others_skip = run(3)
    slow_plain, others_plain = run(None)
    assert slow_skip > slow_plain + 10, (slow_skip, slow_plain)
    assert others_skip > others_plain, "the others are held back less when the slow worker skips"


def test_backup_workers_queue_does_not_grow_over_5000_steps():
    sim = Sim(topo.build("ring-based", 4), 3, 1, None, None, 0, slow=1, factor=3, seed=11)
    sim.full_checks = False
    bound = (1 + 3) * 3
    while min(w.iter for w in sim.workers) < 5000:
        for _ in range(200):
            sim.step()
    assert sim.max_queue <= bound
    assert max(API.hetsync_hop_state_queue_size(w.h) for w in sim.workers) <= bound


def test_eq2_weights_and_backup_selection_directly():
    # staleness s = 2 at k = 5: updates of iterations 3, 4, 6 weigh 1, 2, 4; the worker's own 3 (eq. 2)
    w = Worker(0, [1, 2, 3], [1], 4, 0, 2, 1)
    for _ in range(5):
        API.hetsync_hop_state_tokens(w.h, 1, 9, 1)
        assert API.hetsync_hop_state_try_advance(w.h, 1)
    for sender, it, v in [(1, 3, 10.0), (2, 4, 20.0), (3, 6, 30.0), (3, 2, 99.0)]:
        API.hetsync_hop_state_update(w.h, it, sender, v)
    entries, self_w = w.recv(5)
    got = {s: (it, v, wt) for s, it, v, wt in entries}
    assert got == {1: (3, 10.0, 1.0), 2: (4, 20.0, 2.0), 3: (6, 30.0, 4.0)} and self_w == 3.0
    # an update older than k - s is not satisfactory: blocks
    w2 = Worker(0, [1], [1], 4, 0, 1, 1)
    for _ in range(3):
        API.hetsync_hop_state_tokens(w2.h, 1, 9, 1)
        API.hetsync_hop_state_try_advance(w2.h, 1)
    API.hetsync_hop_state_update(w2.h, 2, 1, 5.0)
    assert w2.recv(3) is not None
    assert w2.recv(4) is None  # iteration 2 < 4 - 1
    # backup workers: 2 of 3 needed; a third already there is taken too; a late one for k is dropped on arrival
    b = Worker(0, [1, 2, 3], [1], 2, 1, None, 1)
    API.hetsync_hop_state_update(b.h, 0, 1, 1.0)
    assert b.recv(0) is None
    API.hetsync_hop_state_update(b.h, 0, 2, 2.0)
    API.hetsync_hop_state_update(b.h, 1, 3, 3.0)  # iteration 1: not for this Recv
    entries, _ = b.recv(0)
    assert sorted(s for s, *_ in entries) == [1, 2]
    assert API.hetsync_hop_state_try_advance(b.h, 1)
    assert API.hetsync_hop_state_update(b.h, 0, 3, 4.0) == 0  # stale on arrival: dropped (§6.2 (a))
    assert API.hetsync_hop_state_dropped(b.h) == 1


@pytest.mark.parametrize("stale_reduce", ["received", "newest"])
def test_staleness_reduces_only_updates_received_in_iteration_k(stale_reduce):
    """Hop §4.4: Reduce runs on N_in^(k)(j), the satisfactory updates *received in iteration k*.  A slow
    neighbour's update, still within the bound, is not averaged in again at k + 1 under the paper's rule
    ("received"); our "newest" variant pulls it in at every iteration until a newer one arrives."""
    w = Worker(0, [1, 2], [1], 4, 0, 2, 1, reuse=stale_reduce == "newest")
    API.hetsync_hop_state_update(w.h, 0, 1, 10.0)
    API.hetsync_hop_state_update(w.h, 0, 2, 20.0)
    first, _ = w.recv(0)
    assert sorted(s for s, *_ in first) == [1, 2]
    API.hetsync_hop_state_tokens(w.h, 1, 9, 1)
    assert API.hetsync_hop_state_try_advance(w.h, 1)
    API.hetsync_hop_state_update(w.h, 1, 2, 21.0)    # only neighbour 2 sent again; 1's update of 0 is within s = 2
    second, self_w = w.recv(1)
    got = {s: (it, v, wt) for s, it, v, wt in second}
    if stale_reduce == "received":
        assert got == {2: (1, 21.0, 3.0)} and self_w == 3.0   # eq. (2): Iter(u) - (k - s) + 1
    else:
        assert got == {1: (0, 10.0, 2.0), 2: (1, 21.0, 3.0)}
