"""Run under mpirun -np 4.  DistributedOptimizer wiring: allreduce == Horovod, ripples-static averages exactly the
scheduled groups, bad modes/options raise ValueError listing the valid ones."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
from hetsync.callbacks import ConsensusCallback  # noqa: E402

NO_AVERAGE = [ConsensusCallback(every=None, at_end=False)]  # inspect the groups' own averages, not the consensus


def model(seed):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.layers.Input((5,)), tf.keras.layers.Dense(4, activation="tanh"),
                                tf.keras.layers.Dense(1)])


def data(rank):
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=(64, 5)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


def check_allreduce_matches_horovod(rank):
    x, y = data(rank)
    weights = []
    for make in (lambda o: hetsync.DistributedOptimizer(o, sync="allreduce"), hvd.DistributedOptimizer):
        m = model(7)
        m.compile(optimizer=make(tf.keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
        hetsync.keras.fit(m, x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        weights.append(m.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b, err_msg="sync='allreduce' differs from hvd.DistributedOptimizer")
    # and the workers stayed identical, as under Horovod
    flat = np.concatenate([w.ravel() for w in weights[0]])
    gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
    np.testing.assert_allclose(gathered, np.repeat(gathered[:1], len(gathered), axis=0), rtol=0, atol=1e-6)


def check_ripples_static_averages_scheduled_groups(rank, size):
    # lr=0: the local update changes nothing, so after one step each group holds its members' initial average.
    m = model(1000 + rank)  # different initial weights per rank
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.0), sync="ripples-static", node_size=2)
    m.compile(optimizer=opt, loss="mse")
    before = np.concatenate([w.ravel() for w in m.get_weights()])
    everyone = hvd.allgather(tf.constant(before[None, :])).numpy()
    x, y = data(rank)
    hetsync.keras.fit(m, x[:16], y[:16], batch_size=16, epochs=1, verbose=0, callbacks=NO_AVERAGE)  # phase 0 of Layout(4, 2)
    after = np.concatenate([w.ravel() for w in m.get_weights()])
    group = {0: [0, 2], 1: [1], 2: [0, 2], 3: [3]}[rank]
    np.testing.assert_allclose(after, everyone[group].mean(axis=0), rtol=1e-5, atol=1e-6,
                               err_msg=f"rank {rank}: expected the average of group {group}")
    hetsync.keras.fit(m, x[:16], y[:16], batch_size=16, epochs=1, verbose=0, callbacks=NO_AVERAGE)  # phase 1: [0,1], [2,3]
    after2 = np.concatenate([w.ravel() for w in m.get_weights()])
    all_after = hvd.allgather(tf.constant(after[None, :])).numpy()
    node = [0, 1] if rank < 2 else [2, 3]
    np.testing.assert_allclose(after2, all_after[node].mean(axis=0), rtol=1e-5, atol=1e-6)


def check_bad_input():
    try:
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="bogus")
        raise AssertionError("unknown sync mode accepted")
    except ValueError as e:
        assert "bogus" in str(e) and "ripples-static" in str(e) and "allreduce" in str(e), e
    try:
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="ripples-static", group_sz=3)
        raise AssertionError("unknown option accepted")
    except ValueError as e:
        assert "group_sz" in str(e) and "node_size" in str(e), e
    try:
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="ripples-static", node_size=0)
        raise AssertionError("bad node_size accepted")
    except ValueError as e:
        assert "node_size" in str(e), e


def main():
    hvd.init()
    hetsync.init(timeout=60)
    rank, size = hvd.rank(), hvd.size()
    assert size == 4, "run with 4 ranks"
    check_bad_input()
    check_allreduce_matches_horovod(rank)
    check_ripples_static_averages_scheduled_groups(rank, size)
    hetsync.shutdown()
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
