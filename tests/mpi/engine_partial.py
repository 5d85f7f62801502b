"""Partial allreduce (eager-SGD solo/majority, §4-§5.1) under random per-rank delays; run on 4 ranks and on 3.

Every contribution is a one-hot float64 vector (position rank*K + call), so a round's average reveals exactly
which deposits it holds.  Checked, for solo and majority:
  - every round's result is the exact mean of the deposits in it (0/1 entries over NAP), the same on every rank
    that returns it, with contributor flags and NAP matching its composition;
  - every deposit lands in exactly one round (stale ones carried, once), also for a rank that sleeps through
    many rounds; a call's `included` flag says whether its own deposit is in the round it returned;
  - late='accumulate': every deposit reaches every rank's sum exactly once, weight 1/P;
  - majority: each round was started by the seeded initiator (the rank its activation notices carry == the engine's
    and the Python reproduction of the RNG) and, while that rank was still calling, by its call (it is active in
    the round); on every rank; a
    waiting rank is never stuck behind an away initiator (the flush below runs while every other rank is in a
    Horovod barrier, marked AWAY);
  - compression='fp16' (half on the wire, float32 buffers);
  - thousands of rounds: no growth of buffered activations, requests in flight or resident memory;
  - tensors that differ between ranks: the same InvalidArgumentError on every rank, naming both;
  - a rank whose engine is gone: every other rank's call fails within the timeout, naming that rank.
"""
import ctypes
import functools
import re
import sys
import time

from engine_util import barrier, expect_error, hvd, run, start

import numpy as np
import tensorflow as tf

from hetsync import ops_partial

QUICK = len(sys.argv) > 1 and sys.argv[1] == "quick"
K = 30 if QUICK else 60
SEED = 7


@functools.lru_cache(maxsize=None)
def _engine_initiator_fn():
    """The engine's C function behind ops_partial.majority_initiator, bound once (ctypes)."""
    from hetsync import ops

    fn = ctypes.CDLL(ops._LIB_PATH).hetsync_majority_initiator
    fn.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def engine_majority_initiator(seed, name, round_, size):
    """The engine's own answer for ops_partial.majority_initiator."""
    return int(_engine_initiator_fn()(seed & ((1 << 64) - 1), name.encode(), int(round_), int(size)))


def onehot(rank, i, size):
    """Deposit i of `rank`; the extra last slot is rank 0's flush call."""
    v = np.zeros(size * K + 1)
    v[size * K if i < 0 else rank * K + i] = 1.0
    return v


def call_loop(ops, mode, name, sleeper):
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng([rank, 99, len(mode)])
    records = []
    for i in range(K):
        time.sleep(rng.uniform(0, 0.008))
        if rank == sleeper and i == K // 3:
            time.sleep(1.0)  # sleeps through many rounds of the others
        res = ops_partial.partial_allreduce(tf.constant(onehot(rank, i, size)), mode=mode, name=name, seed=SEED)
        records.append(dict(rank=rank, call=i, round=int(res.round), avg=res.tensors.numpy(), nap=int(res.nap),
                            contributors=res.contributors.numpy().tolist(), included=bool(res.included),
                            initiator=int(res.initiator), staleness=int(res.staleness), active=int(res.active)))
    # Flush: every rank leaves (AWAY, as hetsync/training/ marks a rank inside a Horovod collective); rank 0 calls until a
    # round includes its call -- that round takes what every send buffer still holds.
    ops.set_availability(ops.AWAY)
    barrier()
    if rank == 0:
        for _ in range(10):
            res = ops_partial.partial_allreduce(tf.constant(onehot(0, -1, size)), mode=mode, name=name, seed=SEED)
            records.append(dict(rank=0, call=-1, round=int(res.round), avg=res.tensors.numpy(), nap=int(res.nap),
                                contributors=res.contributors.numpy().tolist(), included=bool(res.included),
                                initiator=int(res.initiator), staleness=int(res.staleness),
                                active=int(res.active)))
            if res.included:
                break
    barrier()
    ops.set_availability(ops.IN_STEP)
    return records


def check_rounds(ops, mode, name, records, sleeper):
    size = hvd.size()
    rounds = {}
    for rec in records:
        prev = rounds.setdefault(rec["round"], rec)
        if prev is not rec:  # the same round returned on two ranks: identical
            assert np.array_equal(prev["avg"], rec["avg"]), (mode, rec["round"], "results differ between ranks")
            assert prev["contributors"] == rec["contributors"] and prev["nap"] == rec["nap"], (mode, rec["round"])
            if mode == "majority":  # solo: several ranks may initiate one round (each sees the first to reach it)
                assert prev["initiator"] == rec["initiator"], (rec["round"], prev["initiator"], rec["initiator"])
    assert sorted(rounds) == list(range(len(rounds))), (mode, "every round is returned by a rank", sorted(rounds))
    seen = np.zeros(size * K + 1)
    last_call_round = {k: max(rec["round"] for rec in records if rec["rank"] == k and rec["call"] >= 0)
                       for k in range(size)}
    for r, rec in rounds.items():
        members = rec["avg"] > 0
        nap = rec["nap"]
        assert nap >= 1, (mode, r, rec)
        body = members[:-1]  # the flush slot holds one per flush call of rank 0 (it may call more than once)
        assert np.all(rec["avg"][:-1][body] == 1.0 / nap), (mode, r, "not the exact mean of one-hot deposits")
        assert float(rec["avg"][-1] * nap).is_integer(), (mode, r, rec["avg"][-1])
        holders = sorted({min(int(j) // K, 0 if j == size * K else size) for j in np.flatnonzero(members)})
        flagged = [k for k in range(size) if rec["contributors"][k]]
        assert holders == flagged and len(flagged) == nap, (mode, r, holders, flagged, nap)
        assert rec["active"] == sum(1 for f in rec["contributors"] if f == 2) >= 1, (mode, r, rec)
        seen += members
        if mode == "majority":
            want = ops_partial.majority_initiator(SEED, name, r, size)
            assert rec["initiator"] == want == engine_majority_initiator(SEED, name, r, size), (r, rec, want)
            if r <= last_call_round[want]:  # still calling (not away): only its call can have started the round
                assert rec["contributors"][want] == 2, (r, "majority round not started by its initiator's call", rec)
    assert np.all(seen[:-1] == 1), (mode, "deposits not in exactly one round", np.flatnonzero(seen[:-1] != 1))
    for rec in records:
        if rec["call"] < 0:
            continue
        mine = rec["avg"][rec["rank"] * K + rec["call"]] > 0
        assert mine == rec["included"], (mode, rec["rank"], rec["call"], rec["included"])
        if rec["included"]:  # its call waited for the round: active
            assert rec["contributors"][rec["rank"]] == 2, rec
        assert (rec["staleness"] >= 0) == rec["included"], rec
    if mode == "solo":  # (majority waits for a sleeper that is designated: it is inside its step, coming)
        late = [rec for rec in records if rec["rank"] == sleeper and rec["call"] == K // 3]
        assert late and not late[0]["included"], ("the sleeper's call after its sleep is late", late)
    return len(rounds)


def check_modes(ops):
    sleeper = hvd.size() - 1
    for mode in ("solo", "majority"):
        name = f"grads_{mode}"
        records = call_loop(ops, mode, name, sleeper)
        everything = [rec for part in hvd.allgather_object(records) for rec in part]
        n = check_rounds(ops, mode, name, everything, sleeper)
        calls = sum(1 for rec in everything if rec["call"] >= 0)
        mean_nap = np.mean([rec["nap"] for rec in everything])
        if hvd.rank() == 0:
            print(f"{mode}: {n} rounds for {calls} calls, mean NAP {mean_nap:.2f}", flush=True)


def check_accumulate(ops):
    """late='accumulate': a call returns every round since its previous call, each divided by the world size; so
    once rank 0's flush round is in, rank 0 has applied every deposit of every rank exactly once, weight 1/P, and
    the others each deposit at most once (they have not seen the last rounds)."""
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng([rank, 5])
    total, rounds = np.zeros(size * K + 1), 0
    for i in range(K):
        time.sleep(rng.uniform(0, 0.008) + (0.03 if rank == size - 1 and i % 5 == 0 else 0))
        res = ops_partial.partial_allreduce(tf.constant(onehot(rank, i, size)), name="acc", late="accumulate")
        total += res.tensors.numpy()
        rounds += int(res.rounds)
    ops.set_availability(ops.AWAY)
    barrier()
    if rank == 0:
        for _ in range(10):
            res = ops_partial.partial_allreduce(tf.constant(onehot(0, -1, size)), name="acc", late="accumulate")
            total += res.tensors.numpy()
            rounds += int(res.rounds)
            if res.included:
                break
        assert np.all(np.round(total[:-1] * size, 9) == 1), np.flatnonzero(np.round(total[:-1] * size, 9) != 1)
        assert rounds == int(res.round) + 1, (rounds, int(res.round))  # rounds 0..last, none missed or repeated
    else:
        assert set(np.round(total[:-1] * size, 9)) <= {0.0, 1.0}, set(np.round(total * size, 9))
    barrier()
    ops.set_availability(ops.IN_STEP)



def check_persistent(ops):
    """Thousands of rounds of one schedule: bounded state."""
    import resource  # noqa: F401  (Linux: current RSS from /proc)

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2 ** 20

    fn = tf.function(lambda x: ops_partial.partial_allreduce(x, mode="solo", name="many").tensors)
    x = tf.ones([256])
    n = 600 if QUICK else 1500
    for _ in range(n):
        fn(x)
    before = rss_mb()
    for _ in range(2 * n):
        fn(x)
    grew = rss_mb() - before
    ops.set_availability(ops.AWAY)
    barrier()
    stats = ops.engine_stats()
    assert stats["partial_rounds"] >= 3 * n, stats  # every round runs on every rank
    assert stats["partial_pending"] <= 2, stats
    assert grew < 8, f"resident memory grew {grew:.1f} MB over {2 * n} calls"
    assert stats["partial_schedules"] in (4, 5), stats  # 5: a faster rank already started the next check
    ops.set_availability(ops.IN_STEP)
    if hvd.rank() == 0:
        print(f"persistent: {stats['partial_rounds']} rounds, rss +{grew:.2f} MB, pending "
              f"{stats['partial_pending']}", flush=True)


def check_fp16(ops):
    """compression='fp16': data travels as half; a round's result is the mean of its contributors' values."""
    rank, size = hvd.rank(), hvd.size()
    res = ops_partial.partial_allreduce(tf.fill([1000], 0.25 * (rank + 1)), name="half", compression="fp16")
    flags = res.contributors.numpy()
    want = sum(0.25 * (k + 1) for k in range(size) if flags[k]) / int(res.nap)
    assert np.allclose(res.tensors.numpy(), want, rtol=1e-3), (res.tensors.numpy()[:3], want, flags)
    assert res.tensors.dtype == tf.float32
    ops.set_availability(ops.AWAY)
    barrier()
    ops.set_availability(ops.IN_STEP)


def check_mismatch(ops):
    """Rank 1 calls 'bad' with other tensors.  A round that only one calling rank took part in (the others joined
    passively, with the initiator's tensors) may return; a rank never returns a round run with tensors other than
    its own; the first round two disagreeing callers take part in fails on every rank, with one message."""
    rank = hvd.rank()
    shape = [4] if rank == 1 else [3]
    messages = []
    for _ in range(50):
        try:
            ops_partial.partial_allreduce(tf.zeros(shape, tf.float64), name="bad")
        except tf.errors.InvalidArgumentError as e:
            messages.append(e.message)
            break
        time.sleep(0.01)
    assert messages, f"rank {rank}: no error after 50 calls"
    # the lowest calling rank of that round and the lowest one with other tensors (rank 0 may have joined the
    # round passively, then rank 1 is the lowest caller)
    for needle in ("partial allreduce 'bad'", "disagree on the tensors", "float64 x 3 [(3,)]", "float64 x 4 [(4,)]"):
        assert needle in messages[0], (needle, messages[0])
    assert re.search(r"rank 1 (calls it )?with float64 x 4 \[\(4,\)\]", messages[0]), messages[0]
    assert len(set(hvd.allgather_object(messages[0]))) == 1, messages[0]  # the same words everywhere
    # the schedule stays failed; the rest of the engine is fine
    expect_error(tf.errors.InvalidArgumentError,
                 lambda: ops_partial.partial_allreduce(tf.zeros(shape, tf.float64), name="bad"), "disagree")
    expect_error(TypeError, lambda: ops_partial.partial_allreduce(tf.zeros([2], tf.int32)), "float32 or float64")
    expect_error(ValueError, lambda: ops_partial.partial_allreduce(tf.zeros([2]), mode="quorum"), "solo", "majority")
    assert ops.engine_stats()["failed"] == 0


def check_dead(ops):
    rank, size = hvd.rank(), hvd.size()
    dead = size - 1
    barrier()
    if rank == dead:
        ops._lib.hetsync_engine_shutdown(drain=False)  # its progress thread is gone, as in a dead process
    barrier()
    if rank != dead:
        t0 = time.time()
        expect_error(tf.errors.UnavailableError,
                     lambda: ops_partial.partial_allreduce(tf.ones([8]), name="after_death", timeout=3.0),
                     f"rank {dead} sent nothing")
        took = time.time() - t0
        # timing property: the call's own 3 s timeout plus the time to report the failure; size + 2 s more is the
        # slack for a loaded machine, far below the engine's 60 s default that a call ignoring its timeout would wait
        assert took < 3.0 + size + 2, took
    barrier()
    # Every engine stops before any process exits: the "dead" rank's process must not end (and its shared-memory
    # segment go) while a live engine's progress thread still polls requests that involve it (it crashed Open MPI's
    # vader transport at exit, rarely).
    if rank != dead:
        ops._lib.hetsync_engine_shutdown(drain=False)
    barrier()


def main():
    ops = start(timeout=60.0)
    check_modes(ops)
    check_accumulate(ops)
    check_persistent(ops)
    check_fp16(ops)
    check_mismatch(ops)
    check_dead(ops)


if __name__ == "__main__":
    run(main)
