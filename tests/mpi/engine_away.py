"""Availability and exclusion (docs/engine.md): no rank waits on a rank that is not coming. 4 ranks.

1. AWAY: rank 3 reports AWAY and blocks inside a Horovod allreduce (a user's global collective); ranks 0-2 run
   P-Reduces over all four ranks. Rank 3's progress thread answers EXCLUDE, so they average among themselves and
   reach the allreduce (with a 60 s engine timeout, a wait on rank 3 would fail the test). Back IN_STEP, rank 3
   runs the same instances and gets its own values: it decided OUT of them, and everybody agrees.
2. BETWEEN: rank 3 leaves its "step" (BETWEEN) and blocks in an allreduce: after away_after it counts as away.
3. BETWEEN, coming back in time: with a long away_after, rank 3 sleeps briefly between steps and is waited for.
4. Exclude(stream, seqs): a coordinator takes rank 2 out of two instances before anyone starts them.
5. Late headers: rank 1 runs an instance of a stream ahead of rank 0 that rank 0 then skips (resolves past it):
   rank 0 answers EXCLUDE as a late instance.
6. fp16 compression: half the wire bytes, results within fp16 precision.
"""
import time

import numpy as np
import tensorflow as tf

from engine_util import assert_close, barrier, hvd, run, start

ALL = [0, 1, 2, 3]


def vec(rank, k):
    return np.array([rank * 10.0 + k, 1.0, -rank], np.float32)


def mean_of(ranks, k):
    return np.mean([vec(r, k) for r in ranks], axis=0).astype(np.float32)


def reduce(ops, k, group=ALL, stream=5, rank=None):
    return ops.p_reduce(tf.constant(vec(rank, k)), group, instance=(stream, k)).numpy()


def check_away(ops, rank):
    if rank == 3:
        ops.set_availability(ops.AWAY)
        barrier()  # blocks until ranks 0-2 finished their P-Reduces (a user's global collective)
        ops.set_availability(ops.IN_STEP)
        for k in (1, 2, 3):
            assert_close(reduce(ops, k, rank=rank), vec(3, k), f"rank 3 was OUT of instance {k}")
    else:
        for k in (1, 2, 3):
            assert_close(reduce(ops, k, rank=rank), mean_of([0, 1, 2], k), f"instance {k} without rank 3")
        barrier()
    stats = ops.engine_stats()
    if rank == 3:
        assert stats["self_excluded"] >= 3 and stats["away_events"] >= 1, stats
    barrier()


def check_between(ops, rank):
    ops.set_away_after(0.3)
    if rank == 3:
        ops.set_availability(ops.BETWEEN)
        barrier()
        ops.set_availability(ops.IN_STEP)
        assert_close(reduce(ops, 1, stream=6, rank=rank), vec(3, 1), "rank 3 counted as away after away_after")
    else:
        assert_close(reduce(ops, 1, stream=6, rank=rank), mean_of([0, 1, 2], 1), "between too long: excluded")
        barrier()
    barrier()
    # 3: back within away_after -> waited for (a computing rank is coming)
    ops.set_away_after(30.0)
    if rank == 3:
        ops.set_availability(ops.BETWEEN)
        time.sleep(0.5)
        ops.set_availability(ops.IN_STEP)
    assert_close(reduce(ops, 2, stream=6, rank=rank), mean_of(ALL, 2), "a rank back in time is included")
    ops.set_away_after(ops.DEFAULT_AWAY_AFTER_S)
    barrier()


def check_exclude(ops, rank):
    if rank == 2:
        ops.exclude(7, [1, 2])
    barrier()
    for k in (1, 2):
        want = vec(2, k) if rank == 2 else mean_of([0, 1, 3], k)
        assert_close(reduce(ops, k, stream=7, rank=rank), want, f"excluded instance {k}")
    assert_close(reduce(ops, 3, stream=7, rank=rank), mean_of(ALL, 3), "instance after the excluded ones")
    barrier()


def check_late(ops, rank):
    if rank in (0, 1):
        if rank == 1:
            # instance 1 of stream 8 with rank 0, which rank 0 never runs: it resolves instance 2 first
            assert_close(reduce(ops, 1, group=[0, 1], stream=8, rank=rank), vec(1, 1), "late: rank 0 skipped it")
        else:
            assert_close(reduce(ops, 2, group=[0], stream=8, rank=rank), vec(0, 2), "singleton")
    barrier()


def check_fp16(ops, rank):
    x = np.linspace(-4, 4, 1000).astype(np.float32) * (rank + 1)
    before = ops.engine_stats()["wire_bytes"]
    got = ops.p_reduce([tf.constant(x), tf.constant(x[:10])], ALL, compression="fp16")
    after = ops.engine_stats()["wire_bytes"]
    want = np.mean([np.linspace(-4, 4, 1000).astype(np.float32) * (r + 1) for r in ALL], axis=0)
    assert np.allclose(got[0].numpy(), want, rtol=2e-3, atol=1e-2), "fp16 average"
    assert np.allclose(got[1].numpy(), want[:10], rtol=2e-3, atol=1e-2), "fp16 average, second tensor"
    assert after - before == 1010 * 2, (before, after)
    before = after
    ops.p_reduce([tf.constant(x), tf.constant(x[:10])], ALL)
    assert ops.engine_stats()["wire_bytes"] - before == 1010 * 4
    barrier()


def main():
    ops = start(timeout=60.0)
    rank = hvd.rank()
    check_away(ops, rank)
    check_between(ops, rank)
    check_exclude(ops, rank)
    check_late(ops, rank)
    check_fp16(ops, rank)
    assert ops.engine_stats()["failed"] == 0
    ops.engine_shutdown()


if __name__ == "__main__":
    run(main)
