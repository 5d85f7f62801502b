"""Partial allreduce mode "all" (the engine's all-ranks rule, for ESync's aggregation), 4 ranks:
  - under random per-rank delays, round i holds exactly call i of every rank (NAP = active = 4), the same exact
    average on every rank, rank 0 coordinating;
  - a rank that is away (here: inside a Horovod barrier, marked AWAY as hetsync/training/ marks it) is not waited for: the
    others' rounds run with it passive (NAP 3) -- if they waited, the barrier it sits in would never complete;
  - ops_partial.partial_discard: with late="accumulate", the rounds a rank missed while away are dropped: its next call
    returns none of them.
"""
import time

from engine_util import barrier, hvd, run, start

import numpy as np
import tensorflow as tf

from hetsync import ops_partial

K = 20


def onehot(rank, i, size):
    v = np.zeros(size * K)
    v[rank * K + i] = 1.0
    return v


def main():
    ops = start(timeout=60)
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(rank)
    for i in range(K):
        time.sleep(rng.uniform(0, 0.01) * (5 if rank == 1 else 1))
        res = ops_partial.partial_allreduce(tf.constant(onehot(rank, i, size)), mode="all", name="all-a")
        want = sum(onehot(r, i, size) for r in range(size)) / size
        assert bool(res.included) and int(res.nap) == size and int(res.active) == size, res
        assert int(res.round) == i and int(res.initiator) == 0, (int(res.round), int(res.initiator))
        np.testing.assert_allclose(res.tensors.numpy(), want, err_msg=f"rank {rank} call {i}")
    barrier()
    # rank 3 goes away into a Horovod barrier; the others' rounds must not wait for it
    if rank == 3:
        ops.set_availability(ops.AWAY)
        barrier()
    else:
        for i in range(5):
            res = ops_partial.partial_allreduce(tf.constant(onehot(rank, i, size)), mode="all", name="all-b")
            assert int(res.nap) == size - 1 and res.contributors.numpy().tolist()[3] == 0, res
            want = sum(onehot(r, i, size) for r in range(size - 1)) / (size - 1)
            np.testing.assert_allclose(res.tensors.numpy(), want, err_msg=f"rank {rank} away-phase call {i}")
        ops.set_availability(ops.AWAY)
        barrier()
    ops.set_availability(ops.IN_STEP)
    barrier()
    # accumulate + discard: rank 3 is away for 3 rounds, then drops them and takes part in the next
    if rank == 3:
        ops.set_availability(ops.AWAY)
        barrier()
        while ops.engine_stats()["partial_rounds"] < K + 5 + 3:  # its engine ran the 3 rounds passively
            time.sleep(0.01)
        ops_partial.partial_discard("all-c")
    else:
        for i in range(3):
            ops_partial.partial_allreduce(tf.constant(onehot(rank, i, size)), mode="all", name="all-c", late="accumulate")
        ops.set_availability(ops.AWAY)
        barrier()
    ops.set_availability(ops.IN_STEP)
    res = ops_partial.partial_allreduce(tf.constant(onehot(rank, 10, size)), mode="all", name="all-c", late="accumulate")
    if rank == 3:  # nothing of the 3 rounds it dropped (without the discard: 0.25 at each of those deposits)
        got = res.tensors.numpy()
        missed = [got[r * K + i] for r in range(3) for i in range(3)]
        assert not any(missed), f"rank 3 got rounds it discarded: {missed}"
    ops.set_availability(ops.AWAY)  # whoever still waits for a round runs it without the others
    barrier()
    ops.engine_shutdown()  # (a script after this one in the same job starts a fresh engine)


if __name__ == "__main__":
    run(main)
