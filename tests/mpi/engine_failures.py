"""Withdrawal and sessions, then a member that never arrives (timeout), then recovery by restart. 4 ranks."""
import numpy as np
import tensorflow as tf

from engine_util import (assert_close, barrier, expect_error, expected_mean, group_of, hvd, random_partition,
                         run, start)


def steps_of(r):
    return 5 + 3 * r  # rank r stops after this many steps: ranks leave at different times


def vec(rank, step, session):
    return np.array([rank * 100.0 + step, session - rank, 1.0], np.float64)


def check_withdrawal(ops, rank):
    rng = np.random.default_rng(7)
    schedule = [random_partition(rng, 4) for _ in range(steps_of(3))]  # shared group schedule
    for step in range(steps_of(rank)):
        group = group_of(schedule[step], rank)
        got = ops.p_reduce(tf.constant(vec(rank, step, 0)), group).numpy()
        # members that already withdrew (they ran fewer steps) are excluded
        alive = [g for g in group if step < steps_of(g)]
        assert_close(got, expected_mean([vec(g, step, 0) for g in alive]), f"session 0 step {step} group {group}")
    ops.withdraw()
    ops.withdraw()  # idempotent
    expect_error(tf.errors.FailedPreconditionError, lambda: ops.p_reduce(tf.constant([1.0]), [0, 1, 2, 3]),
                 f"rank {rank} has withdrawn from P-Reduce session 0", "rejoin()")
    stats = ops.engine_stats()
    assert stats["withdrawn"] == 1 and stats["session"] == 0, stats
    # the control plane receives every DONE as it arrives: at least the peers this rank had to go without were
    # seen (each once), at most the three others
    noticed = {g for step in range(steps_of(rank)) for g in group_of(schedule[step], rank) if step >= steps_of(g)}
    assert len(noticed) <= stats["withdrawals_seen"] <= 3, (stats, noticed)
    # global consensus (Horovod, not the engine), then everybody starts session 1
    total = hvd.allreduce(tf.constant(stats["preduces"], tf.int64), op=hvd.Sum)
    assert int(total) == sum(steps_of(r) for r in range(4)), int(total)
    ops.rejoin()
    stats = ops.engine_stats()
    assert stats["withdrawn"] == 0 and stats["session"] == 1, stats

    # session 1: rank 0 withdraws at once; the others may still address it (before its DONE arrives): rank 0's
    # control plane answers EXCLUDE, or its DONE resolves the wait; their headers are dropped as stale later
    if rank == 0:
        ops.withdraw()
    else:
        for step in range(3):
            got = ops.p_reduce(tf.constant(vec(rank, step, 1)), [0, 1, 2, 3]).numpy()
            assert_close(got, expected_mean([vec(g, step, 1) for g in (1, 2, 3)]), f"session 1 step {step}")
    barrier()
    ops.rejoin()
    # session 2: everybody, full and random groups
    rng = np.random.default_rng(8)
    for step in range(20):
        group = [0, 1, 2, 3] if step < 2 else group_of(random_partition(rng, 4), rank)
        got = ops.p_reduce(tf.constant(vec(rank, step, 2)), group).numpy()
        assert_close(got, expected_mean([vec(g, step, 2) for g in group]), f"session 2 step {step} group {group}")
    assert ops.engine_stats()["session"] == 2


def check_timeout_and_recovery(ops, rank):
    barrier()
    everyone = [0, 1, 2, 3]
    if rank != 3:  # rank 3 never arrives: it skips the call and waits at Horovod's allreduce below
        expect_error(tf.errors.DeadlineExceededError,
                     lambda: ops.p_reduce(tf.constant([1.0]), everyone, timeout=2.0),
                     "P-Reduce on group [0, 1, 2, 3] timed out after 2.0 s waiting for ranks [3]")
        # after a timeout every later operation fails at once, saying why
        expect_error(tf.errors.FailedPreconditionError, lambda: ops.p_reduce(tf.constant([1.0]), [rank]),
                     "unusable", "timed out")
        assert ops.engine_stats()["failed"] == 1
    barrier()
    # recovery: a collective restart gets a fresh communicator (rank 3's unreceived headers are drained)
    ops.engine_shutdown()
    ops.engine_start(timeout=30.0)
    got = ops.p_reduce(tf.constant([float(rank)]), everyone)
    assert_close(got.numpy(), np.array([1.5], np.float32), "after restart")
    assert ops.engine_stats()["failed"] == 0


def main():
    ops = start(timeout=60.0)
    rank = hvd.rank()
    check_withdrawal(ops, rank)
    check_timeout_and_recovery(ops, rank)
    ops.engine_shutdown()


if __name__ == "__main__":
    run(main)
