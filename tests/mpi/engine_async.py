"""Run under mpirun -np 3: the engine's non-blocking allreduce (start -> handle, wait(handle)).

- sums of several tensors, two calls outstanding at once, waited in reverse order;
- the transfer overlaps the caller's work: started, then 2 s of "compute", then waited: done before the wait;
- each handle can be waited once; a bad dtype raises;
- a rank that never starts one is named by the others after the timeout (then the engine refuses work).
Prints OK rank=R.
"""
import time

from engine_util import barrier, hvd, run, start

import numpy as np
import tensorflow as tf


def main():
    ops = start(timeout=30)
    rank, size = hvd.rank(), hvd.size()
    a = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1))
    b = tf.constant([float(rank)], tf.float32)
    h1 = ops.allreduce_start([a, b])
    h2 = ops.allreduce_start([tf.constant([1.0, 2.0], tf.float64) * rank])
    (s2,), _ = ops.allreduce_wait(h2, [tf.zeros([2], tf.float64)])
    (sa, sb), times = ops.allreduce_wait(h1, [a, b])
    tri = size * (size + 1) / 2
    np.testing.assert_array_equal(sa.numpy(), np.arange(6).reshape(2, 3) * tri)
    assert sb.numpy()[0] == sum(range(size)) and list(s2.numpy()) == [sum(range(size)), 2 * sum(range(size))]
    t = times.numpy()
    assert t[0] <= t[1] <= t[2] and t[0] <= t[3], t

    big = tf.ones([1 << 20], tf.float32)
    began = time.monotonic()
    h = ops.allreduce_start([big])
    # the caller computes; the progress thread moves the data meanwhile.  Timing property: 2 s of "compute" (it
    # was 0.3 s) leaves the 4 MB sum (its time printed below) ample time on a loaded machine, and a transfer that
    # only moved inside allreduce_wait still ends after the wait began
    time.sleep(2.0)
    waited = time.monotonic()
    (s,), times = ops.allreduce_wait(h, [big])
    t = times.numpy()
    if rank == 0:
        print(f"4 MB non-blocking allreduce: {t[2] - t[0]:.3f} s from start to done", flush=True)
    assert float(s.numpy()[7]) == size
    assert began <= t[0] <= t[1] <= t[2] < waited <= t[3], (began, t, waited)  # done while the caller was busy

    try:
        ops.allreduce_wait(h, [big])
        raise AssertionError("second wait on one handle did not fail")
    except tf.errors.InvalidArgumentError as e:
        assert "already waited" in e.message, e.message
    try:
        ops.allreduce_start([tf.constant([1], tf.int32)])
        raise AssertionError("int32 accepted")
    except TypeError as e:
        assert "float32 or float64" in str(e)

    # A rank that never starts the next one is named (the last rank stays silent).
    if rank != size - 1:
        t0 = time.monotonic()
        h = ops.allreduce_start([tf.ones([4])], timeout=2.0)
        try:
            ops.allreduce_wait(h, [tf.ones([4])])
            raise AssertionError("no timeout")
        except tf.errors.DeadlineExceededError as e:
            assert f"waiting for ranks [{size - 1}]" in e.message, e.message
            assert time.monotonic() - t0 >= 1.9
    barrier()
    ops.engine_shutdown()  # (a script after this one in the same job starts a fresh engine)


if __name__ == "__main__":
    run(main)
