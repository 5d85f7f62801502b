"""P-Reduce correctness on 4 ranks: group sizes 1-4, dtypes, shapes, eager and tf.function, disjoint concurrent
groups, hundreds of random groups, the communicator cache and its threshold, bad groups, header mismatches."""
import numpy as np
import tensorflow as tf

from engine_util import (assert_close, barrier, expect_error, expected_mean, group_of, hvd, random_partition,
                         run, start, value)

PARTITIONS = [
    [[0], [1], [2], [3]],
    [[0, 1], [2, 3]],
    [[0, 2], [1, 3]],
    [[0, 3], [1, 2]],
    [[0, 1, 2], [3]],
    [[1, 2, 3], [0]],
    [[0, 1, 3], [2]],
    [[0, 1, 2, 3]],
]
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]
SHAPES = [(), (7,), (3, 4)]


def check_groups_dtypes_shapes(ops, rank):
    key = 0
    for p, partition in enumerate(PARTITIONS):
        group = group_of(partition, rank)
        for dtype in DTYPES:
            for shape in SHAPES:
                key += 1
                got = ops.p_reduce(tf.constant(value(rank, key, shape, dtype)), group)
                want = expected_mean([value(g, key, shape, dtype) for g in group])
                assert_close(got.numpy(), want, f"group {group} {np.dtype(dtype).name} {shape}")
            # a list of mixed shapes (one fused buffer), given as a numpy group
            key += 1
            shapes = [(2, 3), (), (0,), (5,)]  # (0,): an empty tensor in the fused buffer
            got = ops.p_reduce([tf.constant(value(rank, (key, i), s, dtype)) for i, s in enumerate(shapes)],
                               np.array(group))
            for i, s in enumerate(shapes):
                want = expected_mean([value(g, (key, i), s, dtype) for g in group])
                assert_close(got[i].numpy(), want, f"group {group} list item {i}")
        # mixed dtypes in one call, and a tf.Variable: one engine op per wire dtype, results in input order
        key += 1
        specs = [((2, 2), np.float32), ((3,), np.int64), ((4,), np.float16), ((), np.float64), ((2,), np.int32)]
        inputs = [tf.constant(value(rank, (key, i), s, d)) for i, (s, d) in enumerate(specs)]
        inputs[0] = tf.Variable(inputs[0])
        got = ops.p_reduce(inputs, tuple(group))
        for i, (s, d) in enumerate(specs):
            assert_close(got[i].numpy(), expected_mean([value(g, (key, i), s, d) for g in group]),
                         f"mixed dtypes item {i} in group {group}")


def check_tf_function(ops, rank):
    @tf.function
    def fixed_group(a, b, c):
        # two p_reduce calls in one graph: stateful ops keep program order (auto control dependencies)
        first = ops.p_reduce([a, b], [0, 1, 2, 3])
        second = ops.p_reduce(c, [0, 1] if rank < 2 else [2, 3])
        return first, second

    @tf.function(input_signature=[tf.TensorSpec([3, 2], tf.float32), tf.TensorSpec([None], tf.int32)])
    def tensor_group(x, group):
        return ops.p_reduce(x, group)

    for step in range(3):
        a = value(rank, (500, step), (3, 2), np.float32)
        b = value(rank, (501, step), (4,), np.int32)
        c = value(rank, (502, step), (5,), np.float16)
        (ga, gb), gc = fixed_group(tf.constant(a), tf.constant(b), tf.constant(c))
        assert_close(ga.numpy(), expected_mean([value(g, (500, step), (3, 2), np.float32) for g in range(4)]), "fn a")
        assert_close(gb.numpy(), expected_mean([value(g, (501, step), (4,), np.int32) for g in range(4)]), "fn b")
        pair = [0, 1] if rank < 2 else [2, 3]
        assert_close(gc.numpy(), expected_mean([value(g, (502, step), (5,), np.float16) for g in pair]), "fn c")
        for group in ([0, 1, 2, 3], group_of([[0, 3], [1, 2]], rank)):
            x = value(rank, (503, step), (3, 2), np.float32)
            got = tensor_group(tf.constant(x), tf.constant(group, tf.int32))
            assert_close(got.numpy(), expected_mean([value(g, (503, step), (3, 2), np.float32) for g in group]),
                         f"fn tensor group {group}")


def check_disjoint_concurrent(ops, rank):
    """{0,1} and {2,3} reduce large buffers at the same time, on the same engine communicator."""
    group = [0, 1] if rank < 2 else [2, 3]
    barrier()
    for step in range(5):
        x = value(rank, (600, step), (250_000,), np.float32)
        got = ops.p_reduce(tf.constant(x), group)
        assert_close(got.numpy(), expected_mean([value(g, (600, step), (250_000,), np.float32) for g in group]),
                     "disjoint concurrent")


def check_random_groups(ops, rank, steps=300):
    rng = np.random.default_rng(20240601)  # same seed on every rank: same partitions everywhere
    before = ops.engine_stats()
    for step in range(steps):
        group = group_of(random_partition(rng, 4), rank)
        x = np.array([rank * 1000 + step, -rank], dtype=np.int64)
        got = ops.p_reduce(tf.constant(x), group).numpy()
        want = expected_mean([np.array([g * 1000 + step, -g], dtype=np.int64) for g in group])
        assert_close(got, want, f"random step {step} group {group}")
    stats = ops.engine_stats()
    # 7 distinct groups of size >= 2 contain a given rank: all cached (limit 64), the rest are hits
    assert stats["cache_size"] <= 7 and stats["uncached_creations"] == 0, stats
    assert stats["cache_misses"] == stats["cache_size"], stats
    assert stats["cache_hits"] - before["cache_hits"] > steps // 2, (before, stats)
    assert stats["failed"] == 0, stats


def check_bad_groups(ops, rank):
    x = tf.constant([1.0])
    expect_error(ValueError, lambda: ops.p_reduce(x, []), "P-Reduce group is empty")
    expect_error(ValueError, lambda: ops.p_reduce(x, [rank, rank, 1]), "duplicate ranks", str(rank))
    expect_error(ValueError, lambda: ops.p_reduce(x, [rank, 4, -1]), "out-of-range ranks [-1, 4]",
                 "world size 4")
    other = (rank + 1) % 4
    expect_error(ValueError, lambda: ops.p_reduce(x, [other]), f"lacks the calling rank {rank}")
    # the same checks in the kernel, for groups that are tensors
    err = tf.errors.InvalidArgumentError
    expect_error(err, lambda: ops.p_reduce(x, tf.constant([], tf.int32)), "P-Reduce group is empty")
    expect_error(err, lambda: ops.p_reduce(x, tf.constant([rank, rank])), "duplicate ranks")
    expect_error(err, lambda: ops.p_reduce(x, tf.constant([rank, 9])), "out-of-range ranks [9]")
    expect_error(err, lambda: ops.p_reduce(x, tf.constant([other])), f"lacks the calling rank {rank}")
    assert ops.engine_stats()["failed"] == 0


def check_mismatches(ops, rank):
    err = tf.errors.InvalidArgumentError
    everyone = [0, 1, 2, 3]
    shape = (2, 6) if rank == 3 else (2, 5)
    expect_error(err, lambda: ops.p_reduce(tf.zeros(shape), everyone), "P-Reduce mismatch in group [0, 1, 2, 3]",
                 "rank 0 sent float32 x 10 [(2, 5)]", "rank 3 sent float32 x 12 [(2, 6)]")
    dtype = tf.float64 if rank == 1 else tf.float32
    expect_error(err, lambda: ops.p_reduce(tf.zeros((2, 5), dtype), everyone),
                 "rank 0 sent float32 x 10 [(2, 5)], rank 1 sent float64 x 10 [(2, 5)]")
    # same element count, different shapes: caught by the shape hash
    shape = (5, 2) if rank == 2 else (2, 5)
    expect_error(err, lambda: ops.p_reduce(tf.zeros(shape), everyone), "rank 2 sent float32 x 10 [(5, 2)]")
    # a mismatch with the same group leaves every message matched, so the engine stays usable
    got = ops.p_reduce(tf.constant([float(rank)]), everyone)
    assert_close(got.numpy(), np.array([1.5], np.float32), "after mismatches")


def check_cache_threshold(ops, rank):
    import os

    ops.engine_shutdown()
    os.environ["HETSYNC_COMM_CACHE_SIZE"] = "2"  # read by the engine at start when cache_size is None
    ops.engine_start(timeout=60.0)
    for _ in range(3):
        for partition in PARTITIONS[1:]:
            group = group_of(partition, rank)
            got = ops.p_reduce(tf.constant([rank], tf.int32), group)
            assert_close(got.numpy(), expected_mean([np.array([g], np.int32) for g in group]), "threshold")
    stats = ops.engine_stats()
    # the first two groups of this rank (from [[0,1],[2,3]] and [[0,2],[1,3]]) are cached on every member; the
    # others (size >= 2; size 1 needs no communicator) are created, used and freed in each of the 3 rounds
    multi = sum(len(group_of(p, rank)) > 1 for p in PARTITIONS[1:])
    assert stats["cache_size"] == 2, stats
    assert stats["cache_hits"] == 2 * 2, stats  # rounds 2 and 3 find both
    assert stats["uncached_creations"] == 3 * (multi - 2), stats
    assert stats["cache_misses"] == stats["cache_size"] + stats["uncached_creations"], stats


def main():
    ops = start(timeout=60.0)
    rank = hvd.rank()
    info = ops.engine_info()
    assert (info["rank"], info["size"]) == (rank, 4), info
    check_groups_dtypes_shapes(ops, rank)
    check_tf_function(ops, rank)
    check_disjoint_concurrent(ops, rank)
    check_random_groups(ops, rank)
    check_bad_groups(ops, rank)
    check_mismatches(ops, rank)
    check_cache_threshold(ops, rank)
    ops.engine_shutdown()
    ops.engine_shutdown()  # idempotent


if __name__ == "__main__":
    run(main)
