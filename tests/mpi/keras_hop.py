"""Run under horovodrun -np 4.  sync="hop" in Keras' fit, as a user runs it:
  - bad options that need the world size raise ValueError on every rank (backup_workers >= |N_in|, a disconnected
    user graph);
  - the hybrid (staleness + backup workers + skipping, Table 1) with rank 3 5x slower trains the digits MLP to a
    loss target and ends with one model; the slow rank jumps (§5) and the metrics report queues, tokens and gaps.
Prints OK rank=R.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.marks  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.testing  # noqa: E402
from common import shard, task  # noqa: E402

TARGET = float(sys.argv[1]) if len(sys.argv) > 1 else 0.9


def expect_value_error(needle, **options):
    try:
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="hop", **options)
    except ValueError as e:
        assert needle in str(e), f"rank {hvd.rank()}: {e}"
        return
    raise AssertionError(f"rank {hvd.rank()}: no ValueError for {options}")


def main():
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    expect_value_error("backup_workers=3 must be < |N_in|", topology="ring-based", backup_workers=3)
    expect_value_error("not strongly connected", topology=[[1], [0], [3], [2]])

    (x, y, x_test, y_test), build, loss, metrics = task("digits", 0)
    tf.keras.utils.set_random_seed(0)
    model = build()
    # per-rank epochs: every rank's 80 steps, so the queue counters are comparable (job epochs: test_dropin.py)
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="hop", topology="ring",
                                       staleness=2, backup_workers=1, skip=2, skip_trigger=1, max_ig=4,
                                       job_epochs=False)
    model.compile(optimizer=opt, loss=loss, metrics=metrics)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hetsync.testing.SlowdownCallback("deterministic", ranks=[3], factor=5, base_time=0.01)]
    hetsync.keras.fit(model, shard(x, y, rank, size, 32, 0), steps_per_epoch=40, epochs=2, callbacks=callbacks, verbose=0)
    result = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    assert result["loss"] <= TARGET, f"rank {rank}: consensus loss {result['loss']:.3f} > {TARGET}"
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    everyone = hvd.allgather(tf.constant(flat[None, :])).numpy()
    assert np.allclose(everyone, everyone[:1], atol=1e-6), "ranks ended with different models"
    m = hetsync.marks.algorithm_of(opt).metrics()
    assert m["steps"] == 80 and m["max_queue"] <= 2, m  # staleness keeps the newest update per in-neighbour
    assert f"tokens_from_{(rank + 1) % size}" in m, m  # (gaps are live gauges: none right after the final average)
    skips = hvd.allgather(tf.constant([m["skips"]])).numpy()
    assert skips[3] > 0, f"the slow rank never jumped: {skips}"
    print(f"rank {rank}: loss {result['loss']:.3f} metrics {m}", flush=True)
    print(f"OK rank={rank}", flush=True)
    hetsync.shutdown()


if __name__ == "__main__":
    main()
