"""Hop's update and token queues in the engine (Hop §4-§6) under real mpirun jobs, with random per-rank delays and
one slow rank.  Run on 6 ranks (so the ring has paths of length 3).  Checked:
  - standard (ring, max_ig=2, rank 1 5x slower): the result is exactly the synchronous D-PSGD recursion computed
    in numpy (the receive rule makes it timing-independent); iteration gaps never exceed Theorem 2's bound;
    the update queue never holds more than (1 + max_ig) |N_in| entries (§4.2);
  - backup workers (ring-based, 6x slowdowns with p = 1/n): gaps within max_ig * len(Path i->j) (Table 1), at
    least |N_in| - 1 updates per Recv, bounded queues;
  - staleness + skipping (rank 2 4x slower): gaps within Table 1's bound, the slow rank jumps, and at the end every
    token count equals Iter(j) - Iter(i) + max_ig (Theorem 2's identity);
  - a neighbour that withdraws (finished): the others go on without waiting; after rejoin every queue set starts
    again at iteration 0;
  - a silent neighbour (dead): Recv fails within its timeout naming it; ranks sending updates of another size:
    InvalidArgumentError naming both sizes; a bad configuration is refused.
"""
import time

from engine_util import barrier, expect_error, hvd, run, start

import numpy as np
import tensorflow as tf

from hetsync import ops_hop
from hetsync.algorithms import hop_topology as topo

DIM = 300
LR = 0.01


def gather(x):
    return hvd.allgather(tf.constant(np.asarray(x)[None])).numpy()


def check_gaps(histories, in_lists, bound, what):
    """histories[r]: (iteration, ns) entries of rank r.  Replays them in time order; every pair's gap <= bound."""
    dist = topo.distances(in_lists)
    n = len(in_lists)
    events = sorted((t, r, k) for r, h in enumerate(histories) for k, t in h)
    iters = [0] * n
    worst = 0
    for t, r, k in events:
        iters[r] = max(iters[r], k)
        for j in range(n):
            gap = iters[r] - iters[j]
            limit = bound(dist, r, j)
            worst = max(worst, gap)
            if gap > limit:
                raise AssertionError(f"{what}: Iter({r}) - Iter({j}) = {gap} > bound {limit} at t={t}")
    return worst


def histories_of(name):
    hist = ops_hop.hop_query(name).history
    padded = np.full((20000, 2), -1, np.int64)
    padded[:len(hist)] = hist
    everyone = gather(padded)
    return [[tuple(row) for row in h if row[0] >= 0] for h in everyone]


def step_delay(rng, rank, slow, factor, base=0.004, p_random=None):
    d = rng.uniform(0, base)
    if rank == slow:
        d *= factor
    if p_random is not None and rng.random() < p_random:
        d = base * factor
    time.sleep(d)


def iterate(name, rank, n_iter, delay, check, gradient=0.0, timeout=None):
    """n_iter iterations of the parallel graph on a parameter vector: Send, compute (delay), Recv + Reduce,
    Apply (a constant "gradient"), advance.  check(info) looks at each Recv."""
    x = np.full(DIM, float(rank), np.float32)
    for _ in range(n_iter):
        ops_hop.hop_send([x], name)
        delay()
        (avg,), info = ops_hop.hop_recv([x], name, timeout=timeout)
        check(info)
        x = avg.numpy() - gradient
        ops_hop.hop_advance(name, timeout=timeout)
    return x


def standard(rank, size):
    in_lists = topo.build("ring", size)
    outs = topo.out_lists(in_lists)
    name, max_ig, n_iter = "std", 2, 40
    ops_hop.hop_configure(name, in_lists[rank], outs[rank], max_ig)
    rng = np.random.default_rng(rank)

    def check(info):
        assert int(info[1]) == len(in_lists[rank]), f"standard Recv used {int(info[1])} updates"

    x = iterate(name, rank, n_iter, lambda: step_delay(rng, rank, slow=1, factor=5), check, LR * (rank + 1))
    # numpy: x_{k+1,i} = mean over {i} + N_in(i) of x_{k,j}, minus the rank's constant "gradient"
    want = np.array([float(r) for r in range(size)])
    for _ in range(n_iter):
        want = np.array([np.mean([want[j] for j in [i] + in_lists[i]]) - LR * (i + 1) for i in range(size)])
    got = gather(x)
    assert np.allclose(got[:, 0], want, atol=1e-4), f"standard D-PSGD result {got[:, 0]} != numpy {want}"
    assert np.allclose(got, got[:, :1], atol=1e-6)
    worst = check_gaps(histories_of(name), in_lists, lambda d, i, j: topo.gap_bound(d, i, j, max_ig), "standard")
    stats = ops_hop.hop_query(name).stats
    assert stats["max_queue"] <= (1 + max_ig) * len(in_lists[rank]), stats
    return worst


def backup(rank, size):
    in_lists = topo.build("ring-based", size)
    outs = topo.out_lists(in_lists)
    name, max_ig, n_iter = "bkp", 3, 60
    ops_hop.hop_configure(name, in_lists[rank], outs[rank], max_ig, backup=1)
    rng = np.random.default_rng(100 + rank)

    def check(info):
        assert int(info[1]) >= len(in_lists[rank]) - 1, f"backup Recv used {int(info[1])} updates"

    iterate(name, rank, n_iter, lambda: step_delay(rng, rank, slow=-1, factor=6, p_random=1.0 / size), check)
    worst = check_gaps(histories_of(name), in_lists,
                       lambda d, i, j: topo.gap_bound(d, i, j, max_ig, backup=1), "backup")
    stats = ops_hop.hop_query(name).stats
    assert stats["max_queue"] <= (1 + max_ig) * len(in_lists[rank]), stats
    return worst


def stale_skip(rank, size):
    in_lists = topo.build("ring-based", size)
    outs = topo.out_lists(in_lists)
    name, max_ig, s, n_iter = "stl", 6, 2, 50
    ops_hop.hop_configure(name, in_lists[rank], outs[rank], max_ig, staleness=s)
    rng = np.random.default_rng(200 + rank)
    x = np.full(DIM, float(rank), np.float32)
    it = 0
    while it < n_iter:
        ops_hop.hop_send([x], name)
        step_delay(rng, rank, slow=2, factor=4)
        (x,), _ = ops_hop.hop_recv([x], name)
        x = x.numpy()
        jump = int(ops_hop.hop_jump(name, skip=3, trigger=1))
        if jump:
            (x,), info = ops_hop.hop_recv([x], name, offset=jump)
            x = x.numpy()
        it = int(ops_hop.hop_advance(name, 1 + jump))
    worst = check_gaps(histories_of(name), in_lists,
                       lambda d, i, j: topo.gap_bound(d, i, j, max_ig, staleness=s), "staleness+skip")
    barrier()
    iters = gather([ops_hop.hop_query(name).stats["iteration"]])[:, 0]  # final: every rank has left its loop
    # every token message delivered: polled until the counts are the identity (or 30 s pass), not slept for
    deadline = time.monotonic() + 30
    while True:
        report = ops_hop.hop_query(name)
        wrong = [(nb["peer"], nb["tokens"], iters[nb["peer"]] - iters[rank] + max_ig)
                 for nb in report.neighbours if nb["out"] and nb["tokens"] != iters[nb["peer"]] - iters[rank] + max_ig]
        if not wrong or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not wrong, f"(peer, tokens, Iter(peer) - Iter(me) + max_ig): {wrong} (iters {iters})"
    skips = gather([report.stats["skips"]])[:, 0]
    assert skips[2] > 0, f"the slow rank 2 never skipped: {skips}"
    return worst, skips


def withdrawal(ops, rank, size):
    in_lists = topo.build("ring", size)
    outs = topo.out_lists(in_lists)
    name = "wd"
    ops_hop.hop_configure(name, in_lists[rank], outs[rank], 2)
    stop_at = 10 if rank == 3 else 30
    iterate(name, rank, stop_at, lambda: None, lambda info: None, timeout=20)
    if rank == 3:
        ops.withdraw()  # finished: its neighbours stop waiting for it
    assert int(ops_hop.hop_query(name).stats["iteration"]) == stop_at
    barrier()
    ops.withdraw()
    ops.rejoin()
    barrier()
    assert int(ops_hop.hop_query(name).stats["iteration"]) == 0, "a new session starts at iteration 0"
    iterate(name, rank, 5, lambda: None, lambda info: None, timeout=20)
    assert int(ops_hop.hop_query(name).stats["iteration"]) == 5


def failures(rank, size):
    in_lists = topo.build("ring", size)
    outs = topo.out_lists(in_lists)
    ops_hop.hop_configure("dead", in_lists[rank], outs[rank], 2)
    silent = size - 1
    if rank != silent:
        x = np.zeros(DIM, np.float32)
        ops_hop.hop_send([x], "dead")
        if silent in in_lists[rank]:
            expect_error(tf.errors.DeadlineExceededError, lambda: ops_hop.hop_recv([x], "dead", timeout=1.5),
                         "Recv(0)", f"[{silent}]", "waited 1.5 s")
    barrier()
    ops_hop.hop_configure("size", in_lists[rank], outs[rank], 2)
    ops_hop.hop_send([np.zeros(DIM + (7 if rank == 0 else 0), np.float32)], "size")
    if 0 in in_lists[rank]:
        expect_error(tf.errors.InvalidArgumentError, lambda: ops_hop.hop_recv([np.zeros(DIM, np.float32)], "size",
                                                                              timeout=10),
                     f"{DIM + 7} float32 elements", f"{DIM} float32")
    expect_error(tf.errors.InvalidArgumentError,
                 lambda: ops_hop.hop_configure("bad", in_lists[rank], outs[rank], 2, backup=len(in_lists[rank])),
                 "backup_workers must be in [0, 2)")
    expect_error(tf.errors.InvalidArgumentError, lambda: ops_hop.hop_configure("bad", [rank], [], 2),
                 "the self-loop is implicit")


def main():
    ops = start(timeout=60)
    rank, size = hvd.rank(), hvd.size()
    t0 = time.time()
    w_std = standard(rank, size)
    barrier()
    w_bkp = backup(rank, size)
    barrier()
    w_stl, skips = stale_skip(rank, size)
    barrier()
    withdrawal(ops, rank, size)
    barrier()
    failures(rank, size)
    barrier()
    if rank == 0:
        print(f"worst gaps: standard {w_std}, backup {w_bkp}, staleness+skip {w_stl}; skips per rank "
              f"{skips.tolist()}; {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    run(main)
