"""Run under horovodrun -np 4: live sync-mode switches in Keras' fit, rank 3 5x slower (README "Switching").

Scenario ``pairs`` (arguments: modes, default every registered one; then the route, ``pairs`` or ``cycle``):
- part 1, at epoch ends: a SyncModeCallback schedule walks the route -- ``pairs``: an Eulerian circuit of the complete
  directed graph on the modes, so every ordered pair (a, b) switches once (``make test-full``); ``cycle``: a cycle
  through the modes, so every mode is switched into and out of once (``make test``) --, each switch at an epoch
  start;
- part 2, mid-epoch: the same route again through ``request`` from a rank that changes with each switch, so
  every pair of the route switches once more, at the step the Switch Board negotiated;
- during part 2: ranks 1 and 2 request different modes at the same step: one is accepted, the other superseded, and
  one switch results; an unknown mode and a bad option raise ValueError on the requesting rank only;
- after every switch: model.optimizer is the new mode's, and every rank holds the same model, iterations and slots
  (momentum) -- a consistent cut, whatever the old mode left on each rank; the iteration count never goes back;
- while a synchronous mode (allreduce) is in force, at EVERY step: every rank holds the same model and iterations;
- every rank carried out the same switches at the same steps; at the end every rank holds one model and it reaches
  a loss target.

Scenario ``warmup`` follows in the same job (issue 18's deadlock): a lazily built model, SGD with momentum, rank 3
3x slower, sync="esync" (its local iterations put the fast ranks' ``iterations`` ahead -- made certain at batch 30,
whatever the machine's timing gave ESync: rank r sets its count to the ranks' largest plus r); at batch 30 rank 0
asks for od-sgd with a warm-up that ends a few dozen steps after the switch.  After the switch ``iterations`` is
equal on every rank at every step; during the warm-up (plain allreduce) so is the model; the job crosses the warm-up
boundary into OD-SGD's one-step delay and ends with one model under the loss target.
Prints OK rank=R.
"""
import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.marks  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
import hetsync.testing  # noqa: E402
from common import shard, task  # noqa: E402

SLOW, FACTOR, BASE = 3, 5, 0.004
STEPS_PER_EPOCH = {"pairs": 3, "cycle": 6}  # the cycle's 21 switches: each mode trains longer, to the same target
GAP = 1  # steps a mode runs before the next request


def cycle(nodes):
    """A cycle through ``nodes``: every node is left once and entered once."""
    return list(nodes) + [nodes[0]]


def circuit(nodes):
    """An Eulerian circuit of the complete directed graph on ``nodes`` (Hierholzer): every ordered pair once."""
    out = {a: [b for b in reversed(nodes) if b != a] for a in nodes}
    stack, path = [nodes[0]], []
    while stack:
        v = stack[-1]
        if out[v]:
            stack.append(out[v].pop())
        else:
            path.append(stack.pop())
    return path[::-1]


SYNCHRONOUS = ("allreduce",)  # modes in which every step ends with identical replicas


def same_everywhere(model, what, weights=True):
    """Collective: asserts that every rank holds the same ``iterations`` (and model weights)."""
    it = int(model.optimizer.iterations.numpy())
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()
    everyone = hvd_tf.allgather_object((it, digest[:16] if weights else ""))
    assert len(set(everyone)) == 1, f"ranks differ at {what}: {everyone}"
    return it


def opt_state(optimizer):
    v = optimizer.variables
    return [np.array(x.numpy()) for x in (v() if callable(v) else v)]


class Checks(tf.keras.callbacks.Callback):
    """After each switch: the state moved over; iterations never go back.  Drives part 2's requests."""

    def __init__(self, switch, route, part1):
        super().__init__()
        self.switch, self.route, self.part1 = switch, route, part1
        self.seen, self.last_iterations, self.states_checked, self.lockstep_checks = 0, 0, 0, 0
        self.epoch, self.steps_in_mode = 0, 0
        self.asked = set()      # part 2 switches this rank requested
        self.concurrent = None  # this rank's status in the concurrent requests (ranks 1 and 2)
        self.errors = []

    def _check_switch(self):
        history = self.switch.history
        if len(history) == self.seen:
            return
        assert len(history) == self.seen + 1, "two switches between two checks"
        record = history[-1]
        family = hetsync.marks.family_of(self.model.optimizer)
        old = [e for e in family.entries.values() if e.mode == record["from"]][0].optimizer
        assert self.model.optimizer is family.current_entry.optimizer
        assert family.current_entry.mode == record["to"]
        new = opt_state(self.model.optimizer)
        assert [a.shape for a in opt_state(old)] == [b.shape for b in new], "optimizer state not carried over"
        # A consistent cut: right after the switch every rank holds the same model and the same optimizer state
        # (iterations: the ranks' largest, slots: their mean), whatever the old mode left on each.
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in new + self.model.get_weights()))
        digests = hvd_tf.allgather_object(digest.hexdigest()[:16], name=f"switch.cut.{len(history)}")
        assert len(set(digests)) == 1, f"ranks differ after {record['from']} -> {record['to']}: {digests}"
        # ... and that state is the ranks' largest count and their slots' mean: the old mode's optimizer keeps each
        # rank's own state as of the switch (its drain included)
        theirs = hvd_tf.allgather_object(opt_state(old), name=f"switch.old.{len(history)}")
        for k, mine in enumerate(new):
            column = np.stack([state[k] for state in theirs])
            if mine.dtype.kind in "iu":
                assert mine == column.max(), (record, k, mine, column)
            else:
                np.testing.assert_allclose(mine, column.mean(axis=0), rtol=1e-5, atol=1e-7, err_msg=str(record))
        self.states_checked += 1
        self.seen = len(history)
        self.steps_in_mode = 0

    def _lockstep(self):
        """In a synchronous mode every step ends with one model and one ``iterations`` on every rank."""
        if hetsync.marks.family_of(self.model.optimizer).current_entry.mode not in SYNCHRONOUS:
            return
        self.lockstep_checks += 1
        same_everywhere(self.model, f"lockstep {self.lockstep_checks} ({self.switch.mode})")

    def _iterations(self):
        it = int(self.model.optimizer.iterations.numpy())
        assert it >= self.last_iterations, f"iterations went back: {self.last_iterations} -> {it}"
        self.last_iterations = it

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._check_switch()
        self._iterations()

    def on_epoch_end(self, epoch, logs=None):
        # all switches done (both circuits and the concurrent one): stop.  Every rank applies a switch at the same
        # step, so every rank sees the same history at the same epoch end and all stop together.
        if len(self.switch.history) >= 2 * self.part1 + 1:
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        self._check_switch()
        self._iterations()
        self._lockstep()
        self.steps_in_mode += 1
        done = len(self.switch.history) - self.part1
        if self.epoch <= self.part1 or done < 0 or self.steps_in_mode < GAP:
            return
        rank = hvd.rank()
        if done < len(self.route) - 1:  # part 2: the circuit again, requested by rank k % size
            if done % hvd.size() == rank and done not in self.asked:
                status = self.switch.request(self.route[done + 1])
                assert status in ("accepted", "superseded"), f"request {done}: {status}"
                if status == "accepted":  # superseded: a rank has not reported the last switch yet; next step
                    self.asked.add(done)
        elif done == len(self.route) - 1 and self.concurrent in (None, "retry") and rank in (1, 2):
            # ranks 1 and 2 ask for different modes at the same step: one switch.  Superseded by the circuit's last
            # switch (the slow rank has not carried it out yet, so the board is not free): both ask again next step
            others = sorted(set(self.route) - {self.switch.mode})
            first = self.concurrent is None
            self.concurrent = self.switch.request(others[rank - 1])
            if self.concurrent == "superseded" and self.switch.requests[-1][3] == self.switch.mode:
                self.concurrent = "retry"
            if rank == 2 and first:
                for mode, options in (("no-such-mode", {}), ("hop", {"max_ig": 0})):
                    try:
                        self.switch.request(mode, options)
                    except ValueError as exc:
                        self.errors.append(str(exc))


def main():
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else hetsync.available_modes()
    walk = sys.argv[2] if len(sys.argv) > 2 else "pairs"
    route = {"pairs": circuit, "cycle": cycle}[walk](modes)
    (x, y, x_test, y_test), build, loss, metrics = task("digits", 0)
    tf.keras.utils.set_random_seed(0)
    model = build()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), sync=route[0])
    model.compile(opt, loss=loss, metrics=metrics)
    part1 = len(route) - 1
    schedule = {e: route[e] for e in range(1, part1 + 1)}  # epoch e starts with route[e]: every pair, at epoch ends
    switch = hetsync.callbacks.SyncModeCallback(schedule=schedule)
    checks = Checks(switch, route, part1)
    # an upper bound (Checks stops the fit once the last switch is done): a mid-epoch switch takes GAP steps plus
    # the negotiation, a few steps while the slow rank catches up ("superseded" until it has applied the last one)
    steps = STEPS_PER_EPOCH[walk]
    epochs = part1 + 1 + (len(route) + 2) * (GAP + 10) // steps
    slow = hetsync.testing.SlowdownCallback("deterministic", ranks=[SLOW], factor=FACTOR, base_time=BASE)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), switch, slow, checks]
    hetsync.keras.fit(model, shard(x, y, rank, size, 32, 0), steps_per_epoch=steps, epochs=epochs,
              callbacks=callbacks, verbose=0)
    history = switch.history
    assert checks.epoch + 1 < epochs, f"ran out of epochs after {len(history)} switches"
    pairs = [(h["from"], h["to"]) for h in history]
    everyone = hvd_tf.allgather_object([(p, h["position"]) for p, h in zip(pairs, history)])
    assert all(e == everyone[0] for e in everyone), f"ranks switched differently:\n{everyone}"
    expected = set(zip(route, route[1:]))  # pairs: every ordered pair; cycle: each mode left and entered once
    first = pairs[:part1]
    assert set(first) == expected and len(first) == len(expected), f"part 1 pairs: {first}"
    assert all(h["reason"].startswith("schedule") for h in history[:part1])
    scheduled_traced_ahead(model, route[0], history[:part1])
    second = pairs[part1:]
    assert set(second[:part1]) == expected and len(second) == part1 + 1, f"part 2 pairs: {second}"
    assert all(not h["reason"].startswith("schedule") for h in history[part1:])
    statuses = hvd_tf.allgather_object(checks.concurrent)
    # one accepted; the other superseded (or still waiting to ask again when the accepted switch came: "retry")
    asked = sorted(s for s in statuses if s is not None)
    assert len(asked) == 2 and asked[0] == "accepted" and asked[1] in ("retry", "superseded"), statuses
    if rank == 2:
        assert len(checks.errors) == 2 and "unknown sync mode 'no-such-mode'" in checks.errors[0] \
            and "max_ig" in checks.errors[1], checks.errors
    else:
        assert not checks.errors
    assert checks.states_checked == len(history)
    # part 1 alone runs each synchronous visit of the route for a whole epoch: every one of those steps is checked
    least = steps * sum(m in SYNCHRONOUS for m in route)
    assert checks.lockstep_checks >= least, f"only {checks.lockstep_checks} steps checked in lockstep, < {least}"
    final = model.evaluate(x_test, y_test, verbose=0)[0]
    weights = hvd_tf.allgather_object([w.tolist() for w in model.get_weights()][-1])
    assert all(w == weights[0] for w in weights), "ranks ended with different models"
    assert final < 0.25, f"loss {final:.3f} after {len(history)} switches"  # untrained: 2.3
    print(f"rank {rank}: {len(history)} switches ({part1} at epoch starts), final loss {final:.3f}, "
          f"modes {modes}, {checks.lockstep_checks} lockstep steps checked", flush=True)
    if "esync" in modes and "od-sgd" in modes:
        warmup_boundary(x, y, x_test, y_test, loss)
    print(f"OK rank={rank}", flush=True)


class WarmupChecks(tf.keras.callbacks.Callback):
    """Scenario ``warmup``: at batch 30 the ranks' iterations differ (ESync's local steps follow speed; rank r sets
    its count to the largest plus r, so they differ whatever the State Server decided on this machine) and rank 0
    asks for od-sgd;
    checks every step after the switch."""

    def __init__(self, switch):
        super().__init__()
        self.switch, self.warmup, self.in_warmup, self.after = switch, None, 0, 0

    def on_train_batch_end(self, batch, logs=None):
        if self.warmup is None and batch == 30:  # ESync rounds: every rank is at this Keras step
            counts = hvd_tf.allgather_object(int(self.model.optimizer.iterations.numpy()))
            self.model.optimizer.iterations.assign(max(counts) + hvd.rank())
            everyone = hvd_tf.allgather_object(int(self.model.optimizer.iterations.numpy()))
            assert len(set(everyone)) == hvd.size(), everyone  # the scenario: a different count on every rank
            self.warmup = max(everyone) + 30  # the switch comes a few rounds later, below this
            if hvd.rank() == 0:
                assert self.switch.request("od-sgd", warmup_steps=self.warmup) == "accepted"
        if self.switch.mode != "od-sgd":
            return
        it = int(self.model.optimizer.iterations.numpy())
        warm = it < self.warmup
        same_everywhere(self.model, f"od-sgd step {batch} (iterations {it})", weights=warm)
        self.in_warmup += warm
        self.after += not warm
        if self.after >= 15:
            self.model.stop_training = True


def scheduled_traced_ahead(model, start, history):
    """A schedule is known from the start: each first switch into a mode that runs Keras' step took the step traced
    in a thread during the epoch before (trace_ahead.py), and none traced it at the switch (balanced runs its own
    micro-batch step, traced there)."""
    family = hetsync.marks.family_of(model.optimizer)
    keras_step = {e.mode: e.algorithm.KERAS_TRAIN_STEP for e in family.entries.values()}
    entered = {start}
    for h in history:
        first = h["to"] not in entered
        entered.add(h["to"])
        assert not (keras_step[h["to"]] and h["traced"]), f"a scheduled switch traced at the switch: {h}"
        assert h["traced_ahead"] == (first and keras_step[h["to"]]), h
    assert not family.ahead, "a trace was left unclaimed"


def traced_once_ahead(model, record):
    """The request's switch into od-sgd, its first use: the rank whose report brought the Switch Board's decision
    heard it before its step (``at`` is past every reported position) and traced od-sgd's Keras step meanwhile, in a
    thread (hetsync/trace_ahead.py); a rank that heard it at the step itself traced it there.  Each rank did exactly
    one of the two, and the step that then ran is the one traced: never traced again."""
    assert record["traced_ahead"] != record["traced"], record
    ahead = hvd_tf.allgather_object(bool(record["traced_ahead"]), name="warmup.ahead")
    assert any(ahead), f"no rank traced od-sgd's step before the switch: {ahead}"
    family = hetsync.marks.family_of(model.optimizer)
    entry = [e for e in family.entries.values() if e.mode == "od-sgd"][0]
    assert entry.train_function.experimental_get_tracing_count() == 1, "od-sgd's step was traced again"
    assert not family.ahead, "a trace was left unclaimed"


def warmup_boundary(x, y, x_test, y_test, loss):
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(10)])  # lazy
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), sync="esync")
    model.compile(opt, loss=loss, metrics=["accuracy"])
    switch = hetsync.callbacks.SyncModeCallback()
    checks = WarmupChecks(switch)
    slow = hetsync.testing.SlowdownCallback("deterministic", ranks=[SLOW], factor=FACTOR, base_time=BASE)
    hetsync.keras.fit(model, shard(x, y, rank, size, 32, 0), steps_per_epoch=200, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), switch, slow, checks])
    assert [h["to"] for h in switch.history] == ["od-sgd"], switch.history
    assert checks.in_warmup >= 5 and checks.after >= 15, (checks.in_warmup, checks.after)
    traced_once_ahead(model, switch.history[0])
    final = model.evaluate(x_test, y_test, verbose=0)[0]
    same_everywhere(model, "the end of the warm-up scenario")
    assert final < 0.6, f"warm-up scenario: loss {final:.3f}"
    print(f"rank {rank}: esync -> od-sgd (warmup_steps={checks.warmup}) at step "
          f"{switch.history[0]['position']}: {checks.in_warmup} steps checked in the warm-up, {checks.after} "
          f"after it, loss {final:.3f}", flush=True)


if __name__ == "__main__":
    main()
