"""Run under mpirun -np 4: no gradient is lost or applied twice across live switches (issue 18), and a switch that
fails its checks on one rank is refused on every rank.

The model makes every gradient known: one Dense unit without bias on one-hot inputs, rank r's input is e_r and the
loss is the unit's output, so every train step of rank r computes the gradient e_r (a "one-hot deposit").  With
plain SGD (learning rate LR) and ``backward_passes_per_step=3`` (accumulated sums), in any mode that preserves the
sum of the replicas (allreduce; eager-SGD with late="accumulate", weight 1/P per contribution; P-Reduce groups in
the Ripples modes; Hop's doubly stochastic reduce), after the final consensus every rank must hold

    w[r] = -LR * (gradients rank r computed and applied) / P       for every r,

so a deposit lost at a switch (eager-SGD's discarded send buffer), a round applied twice, or half-accumulated
gradients dropped or carried stale into a later return to their mode all show up in coordinate r.  Gradients still
accumulating when fit ends are not applied (as in Horovod): they are counted from the accumulator.  ESync and
OD-SGD are left out: they do not preserve the sum (ESync averages the deltas of the ranks that trained; OD-SGD's
local updaters step on their own); tests/mpi/keras_switch.py covers their switches.

Each rank runs its own steps_per_epoch (job_epochs=False), so every rank trains between two switches; rank 3 is 3x
slower, so the others run ahead to each switch and eager-SGD's rounds find its deposits late.  Mid-epoch, requests
from rotating ranks walk an Eulerian circuit over the modes (every ordered pair once).  Half-way, rank 1 asks for
"test-picky", a mode registered here whose checks fail on rank 2 only: every rank refuses it, naming rank 2, and
training goes on in the mode in force.
Prints OK rank=R.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "mpi"))

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
import hetsync.testing  # noqa: E402
from hetsync.algorithms import register  # noqa: E402
from hetsync.algorithms.allreduce import HorovodAllreduce  # noqa: E402
from keras_switch import circuit  # noqa: E402

LR, PASSES, SLOW, GAP, STEPS_PER_EPOCH = 0.01, 3, 3, 2, 6
MODES = ["allreduce", "eager-solo", "eager-majority", "ripples-random", "ripples-smart", "ripples-static", "hop"]


@register
class PickyAllreduce(HorovodAllreduce):
    """Horovod's allreduce, except that its checks fail on rank 2 (as ripples-static's node layout can on a rank
    whose placement is not a block layout)."""

    name = "test-picky"

    def preflight(self):
        if hvd.rank() == 2:
            raise ValueError("test-picky cannot run on rank 2 (placement)")


class Counted(tf.keras.Model):
    """One Dense unit, built lazily; counts the train steps (gradients) this rank computes."""

    def __init__(self):
        super().__init__()
        self.unit = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        self.passes = tf.Variable(0, dtype=tf.int64, trainable=False)

    def call(self, x):
        return self.unit(x)

    def train_step(self, data):
        self.passes.assign_add(1)
        return super().train_step(data)


class Route(tf.keras.callbacks.Callback):
    """Mid-epoch requests along the circuit; the picky request half-way; stops at the epoch end after the last."""

    def __init__(self, switch, route):
        super().__init__()
        self.switch, self.route = switch, route
        self.asked, self.steps_in_mode, self.seen, self.picky = set(), 0, 0, None

    def on_train_batch_end(self, batch, logs=None):
        done = len(self.switch.history)
        if done != self.seen:
            self.seen, self.steps_in_mode = done, 0
        self.steps_in_mode += 1
        if self.steps_in_mode < GAP or done >= len(self.route) - 1:
            return
        rank = hvd.rank()
        if done == len(self.route) // 2 and self.picky != "accepted" and rank == 1:
            # checked on every rank at the switch: refused.  Asked again while superseded: a request made before
            # the previous switch is carried out on every rank (rank 3 is slower) is dropped by design.
            self.picky = self.switch.request("test-picky")
            return
        if done % hvd.size() == rank and done not in self.asked and (self.picky != "accepted" or
                                                                      self.switch.refusals):
            if self.switch.request(self.route[done + 1]) == "accepted":
                self.asked.add(done)

    def on_epoch_end(self, epoch, logs=None):
        if len(self.switch.history) >= len(self.route) - 1:
            self.model.stop_training = True


def leftover(optimizer):
    """Gradients (passes) still accumulating in the mode in force when fit ended: not applied, as in Horovod."""
    ours = getattr(optimizer, "_hetsync_accumulation", None)
    if ours is not None and ours.counter is not None:
        return int(ours.counter.numpy())
    helper = getattr(optimizer, "_agg_helper", None)
    return int(helper.counter.numpy()) if helper is not None else 0


def main():
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    route = circuit(MODES)
    x = np.zeros((64, size), np.float32)
    x[:, rank] = 1.0
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros((64, 1), np.float32))).repeat().batch(8)
    model = Counted()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(LR), sync=route[0], job_epochs=False,
                                       backward_passes_per_step=PASSES)
    model.compile(opt, loss=lambda y, p: tf.reduce_mean(p))
    switch = hetsync.callbacks.SyncModeCallback()
    router = Route(switch, route)
    slow = hetsync.testing.SlowdownCallback("deterministic", ranks=[SLOW], factor=3, base_time=0.004)
    epochs = (len(route) + 4) * (GAP + 6) // STEPS_PER_EPOCH
    hetsync.keras.fit(model, data, steps_per_epoch=STEPS_PER_EPOCH, epochs=epochs, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), switch, slow, router])

    history = switch.history
    pairs = [(h["from"], h["to"]) for h in history]
    assert len(pairs) == len(route) - 1 and set(pairs) == {(a, b) for a in MODES for b in MODES if a != b}, pairs
    refusals = switch.refusals
    assert len(refusals) == 1 and refusals[0]["to"] == "test-picky", refusals
    assert "rank 2: ValueError: test-picky cannot run on rank 2" in refusals[0]["refused"], refusals
    assert all(h["to"] != "test-picky" for h in history)
    everyone = hvd_tf.allgather_object(([(p, h["position"]) for p, h in zip(pairs, history)],
                                        [(r["position"], r["refused"]) for r in refusals]))
    assert all(e == everyone[0] for e in everyone), f"ranks switched or refused differently:\n{everyone}"
    drained = sum(h["drained"].get("drained", 0) > 0 for h in history)
    flushed = sum(h["drained"]["accumulated"] > 0 for h in history)

    applied = int(model.passes.numpy()) - leftover(model.optimizer)
    counts = hvd_tf.allgather_object(applied)
    w = model.unit.kernel.numpy()[:, 0]
    expected = -LR * np.asarray(counts, np.float64) / size
    weights = hvd_tf.allgather_object(w.tolist())
    assert all(v == weights[0] for v in weights), "ranks ended with different models"
    assert np.allclose(w, expected, rtol=0, atol=2e-5), \
        f"gradients lost or applied twice: w = {w.tolist()}, expected {expected.tolist()} (passes {counts})"
    totals = hvd_tf.allgather_object((drained, flushed))
    print(f"rank {rank}: {len(history)} switches, {flushed} flushed half-accumulated gradients, {drained} drained "
          f"eager-SGD rounds/deposits here (all ranks: {totals}); passes {counts}; w = {np.round(w, 5).tolist()}",
          flush=True)
    assert sum(f for f, _ in totals) > 0 and sum(d for _, d in totals) > 0, "no switch had anything to carry: no test"
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
