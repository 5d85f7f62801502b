"""Run under horovodrun -np 4: ``sync="esync"`` in Keras' fit with rank 3 5x slower (ESync §3.1, §4).

Checked on every rank:
- the slow rank takes one local iteration per round, the fast ones about 5 (its per-iteration time / theirs);
- after every round (Keras step) every rank holds the same model, bit for bit;
- the aggregation's arithmetic against numpy: w_{t+1} = w_t + ε·mean_i(w_local_i - w_t) (eqs. 6-8, ε = 0.8),
  with every rank's w_local gathered just before the aggregation;
- the consensus model reaches a loss target.
First the same with §4.2's non-blocking query (target and lockstep only), then the blocking run and
(blocking run only) a second fit in which rank 3 hangs at its 4th step: the others fail within ``timeout``
with an error naming worker 3, and nobody is left inside a Horovod collective.
Prints OK rank=R.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import keras_callbacks  # noqa: E402
from common import shard, task  # noqa: E402

SLOW, FACTOR, BASE = 3, 5, 0.04
EPS = 0.8


def flat(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


class Lockstep(tf.keras.callbacks.Callback):
    """After every Keras step (= ESync round): every rank's model is the same, bit for bit."""

    def __init__(self):
        super().__init__()
        self.checked = 0

    def on_train_batch_end(self, batch, logs=None):
        everyone = hvd.allgather(tf.constant(flat(self.model)[None, :])).numpy()
        assert (everyone == everyone[:1]).all(), f"models differ after round {batch}"
        self.checked += 1


def check_aggregation(algo, model, rounds):
    """Wraps the compiled aggregation: gathers w_local of every rank before it, compares after it with numpy."""
    inner = algo._aggregate_fn

    def aggregate(active, start, steps):
        if start:
            return inner(active, start, steps)
        w_t = np.concatenate([w.numpy().ravel() for w in algo._globals])
        local = hvd.allgather(tf.constant(np.concatenate(
            [v.numpy().ravel() for v in algo._trainable])[None, :])).numpy()
        out = inner(active, start, steps)
        expected = w_t + EPS * (local - w_t[None, :]).mean(axis=0)
        got = np.concatenate([v.numpy().ravel() for v in algo._trainable])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert not np.array_equal(local[0], local[SLOW]), "fast and slow ranks trained the same"
        rounds.append(1)
        return out

    algo._aggregate_fn = aggregate


def main():
    """Both variants in one job (one start-up): non-blocking first, then blocking and the hung rank."""
    hvd.init()
    hetsync.init()
    for non_blocking in (True, False):
        run(non_blocking)
    print(f"OK rank={hvd.rank()}", flush=True)
    hetsync.shutdown()


def run(NON_BLOCKING):  # noqa: N803 (the variant's flag, as the checks below read it)
    rank, size = hvd.rank(), hvd.size()
    (x, y, x_test, y_test), build, loss, metrics = task("digits", 0)
    tf.keras.utils.set_random_seed(0)
    model = build()
    # per-rank epochs: one ESync round per Keras step, so every round is checked (job epochs: test_dropin.py)
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.2), sync="esync", non_blocking=NON_BLOCKING,
                                       global_lr=1.0 if NON_BLOCKING else EPS, job_epochs=False)
    model.compile(optimizer=opt, loss=loss, metrics=metrics)
    algo = opt._hetsync_algorithm
    checked = []
    if not NON_BLOCKING:
        algo.attach(model, [])  # builds the aggregation so the test can wrap it (fit attaches again)
        check_aggregation(algo, model, checked)
    lockstep = Lockstep()
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 keras_callbacks.Slowdown("deterministic", ranks=[SLOW], factor=FACTOR, base_time=BASE),
                 keras_callbacks.EmulatedCompute(BASE), lockstep]
    t0 = time.monotonic()
    model.fit(shard(x, y, rank, size, 32, 0), steps_per_epoch=12, epochs=2, callbacks=callbacks, verbose=0)
    took = time.monotonic() - t0
    result = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    rounds = algo.steps_per_round
    m = algo.metrics()
    print(f"rank {rank}: {took:.1f} s, loss {result['loss']:.3f}, local steps per round {rounds}, "
          f"blocking {m['mean_blocking_s']:.3f} s, capability {m['capability_s']:.3f} s", flush=True)
    assert lockstep.checked == 24 and len(rounds) == 24, (lockstep.checked, rounds)
    assert NON_BLOCKING or len(checked) == 24, checked
    steady = rounds[2:]  # round 0: no capability measured yet; round 1: the slow rank's first slow iteration
    if rank == SLOW:
        assert all(k == 1 for k in steady), f"the slowest took more than one local step per round: {steady}"
    else:
        mean = sum(steady) / len(steady)
        low, high = (2.5, 8.0) if not NON_BLOCKING else (2.5, 9.0)
        assert low <= mean <= high, f"rank {rank}: {mean:.2f} local steps per round (expected ~{FACTOR}): {steady}"
    target = 1.2
    assert result["loss"] <= target, f"rank {rank}: consensus loss {result['loss']:.3f} > {target}"
    if not NON_BLOCKING:
        check_dead_rank(build, loss, x, y, rank, size)
        # Nobody was left inside a Horovod collective: one more completes on every rank.
        assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="after_dead")) == size


class Hang(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 3:
            time.sleep(12)


def check_dead_rank(build, loss, x, y, rank, size):
    """Rank 3 hangs: the others' aggregation fails after ``timeout`` naming it; none waits in Horovod."""
    model = build()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), sync="esync", timeout=3.0)
    model.compile(optimizer=opt, loss=loss)
    callbacks = [Hang()] if rank == SLOW else []
    t0 = time.monotonic()
    try:
        model.fit(shard(x, y, rank, size, 32, 1), steps_per_epoch=8, epochs=1, callbacks=callbacks, verbose=0)
        raise AssertionError(f"rank {rank}: fit did not fail")
    except tf.errors.DeadlineExceededError as e:
        took = time.monotonic() - t0
        print(f"rank {rank}: failed after {took:.1f} s: {e.message}", flush=True)
        assert "worker(s) 3 (last heard" in e.message, e.message
        if rank != SLOW:
            assert took < 11, f"rank {rank}: the error came after {took:.1f} s, not at the 3 s timeout"
        else:  # it came back after the others had given up: the round is abandoned, and says why
            assert "abandoned by the other workers" in e.message, e.message


if __name__ == "__main__":
    main()
