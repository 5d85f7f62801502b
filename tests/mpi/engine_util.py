"""Helpers for the tests/mpi/engine_*.py scripts (each runs under ``mpirun -np 4``; no mocks).

Every script ends with ``OK rank=R`` on each rank; on failure it prints the traceback and ``FAIL rank=R`` and
exits 1 at once, so mpirun tears the job down instead of leaving peers hanging.
"""
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import hetsync  # noqa: E402,F401 -- before hvd.init(), as scripts do: MPI is hetsync's to finalize (docs/engine.md)
import horovod.tensorflow as hvd  # noqa: E402

INT_DTYPES = (np.int32, np.int64)


def start(timeout=60.0, cache_size=None):
    """hvd.init() then the engine, as hetsync.init() does; returns hetsync.ops."""
    hvd.init()
    from hetsync import ops

    ops.engine_start(timeout=timeout, cache_size=cache_size)
    return ops


def run(main):
    try:
        main()
    except BaseException:  # noqa: BLE001 -- report anything, then die loudly
        traceback.print_exc()
        print(f"FAIL rank={hvd.rank()}", flush=True)
        sys.stderr.flush()
        os._exit(1)
    print(f"OK rank={hvd.rank()}", flush=True)


def barrier():
    """A Horovod allreduce used as a barrier (Horovod's own communicator, not the engine's)."""
    hvd.allreduce(tf.constant(1.0), op=hvd.Sum)


def value(rank, key, shape, dtype):
    """Deterministic per-(rank, key) input, known to every rank so each can compute the expected average."""
    rng = np.random.default_rng([rank, *key] if isinstance(key, tuple) else [rank, key])
    if np.dtype(dtype) in map(np.dtype, INT_DTYPES):
        return rng.integers(-50, 50, size=shape).astype(dtype)  # negatives exercise truncation toward zero
    return (rng.standard_normal(shape) * 10).astype(dtype)


def expected_mean(arrays):
    """What P-Reduce must return: float mean, or integer sum divided with truncation toward zero."""
    dtype = arrays[0].dtype
    if np.issubdtype(dtype, np.integer):
        s = np.sum(np.stack([a.astype(np.int64) for a in arrays]), axis=0)
        n = len(arrays)
        return (np.sign(s) * (np.abs(s) // n)).astype(dtype)
    acc = np.float64 if dtype == np.float64 else np.float32
    return (np.sum(np.stack([a.astype(acc) for a in arrays]), axis=0) / len(arrays)).astype(dtype)


def assert_close(got, want, what):
    got = np.asarray(got)
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"rank {hvd.rank()}: {what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
    if np.issubdtype(want.dtype, np.integer):
        ok = np.array_equal(got, want)
    else:
        rtol = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5}.get(want.dtype, 1e-12)
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol * 10)
    if not ok:
        raise AssertionError(f"rank {hvd.rank()}: {what}: got {got}, want {want}")


def expect_error(exc_type, fn, *needles):
    """Runs fn, which must raise exc_type with every needle in its message; returns the message."""
    try:
        fn()
    except exc_type as e:
        msg = getattr(e, "message", None) or str(e)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise AssertionError(f"rank {hvd.rank()}: error lacks {missing}: {msg}") from e
        return msg
    raise AssertionError(f"rank {hvd.rank()}: expected {exc_type.__name__} containing {needles}")


def group_of(partition, rank):
    return next(g for g in partition if rank in g)


def random_partition(rng, size):
    """A random partition of range(size) into groups (sizes 1..size), identical on every rank for the same rng."""
    perm = rng.permutation(size).tolist()
    groups, i = [], 0
    while i < size:
        k = int(rng.integers(1, size - i + 1))
        groups.append(sorted(perm[i:i + k]))
        i += k
    return groups
