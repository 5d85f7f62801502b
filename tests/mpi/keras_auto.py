"""Run under horovodrun -np 4: ``sync="auto"`` follows the job's heterogeneity (README "sync='auto'").

Every step sleeps 20 ms of emulated compute; rank 3 is 5x slower during the middle phase only
(hetsync.testing.PhasedSlowdownCallback).  The policy's window is 3 s: it decides once every rank has
``min_samples`` (5) samples in it, and the slow rank gives one per step -- at ~0.25 s a step on a loaded machine, a
1.5 s window saw too few and auto never switched.  ``settle`` is 3 s: while rank 3's slow samples are still the
minority of its window (up to ~2.4 s after the slowdown starts) the policy sees "random" (slow samples among fast
ones), and with a 0.5 s settle a fresh clone's run switched to eager-solo first.  Measured: the switch to esync
~60 steps into the 120-step slow phase, the one back ~105 steps into the last phase (quiet machine).  Checked on every rank:
- phase 1 (homogeneous): auto stays on allreduce;
- phase 2: it switches to the straggler mode (esync), with evidence naming rank 3;
- phase 3: once the slowdown has ended it switches back to allreduce ("homogeneous");
- every rank made the same switches at the same steps, and the model reaches a loss target;
- before any switch, the candidates' train steps (and ESync's aggregation) were already traced (``pretrace``);
  no switch traced a train step, and each traced function was reused, not traced again, when it ran.
The heterogeneity report goes to LOGDIR (argument): every rank's records, written by rank 0 through its report
callback (the only one, placed as Horovod users place TensorBoard); rank 1's TensorBoard alone gets no hetsync
scalars.  Auto starts in its homogeneous candidate here (``start="homogeneous"``) with esync as its straggler
candidate, so that all three classes and two switches happen in one job; its default start, in the straggler
candidate, is tests/test_dropin.py's.  Prints OK rank=R.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.marks  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
import hetsync.testing  # noqa: E402
from common import shard, task  # noqa: E402

COMPUTE, SLOW, FACTOR = 0.02, 3, 5
PHASES = (50, 120, 180)


class Traced(tf.keras.callbacks.Callback):
    """At step 5 (before any switch): how often esync's train step and its aggregation have been traced."""

    counts = None

    def on_train_batch_end(self, batch, logs=None):
        if self.counts is None and batch == 5:
            family = hetsync.marks.family_of(self.model.optimizer)
            esync = [e for e in family.entries.values() if e.mode == "esync"][0]
            self.counts = (esync.train_function.experimental_get_tracing_count(),
                           esync.algorithm._aggregation.fn.experimental_get_tracing_count())


def main():
    logdir = sys.argv[1]
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    (x, y, x_test, y_test), build, loss, metrics = task("digits", 0)
    tf.keras.utils.set_random_seed(0)
    model = build()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), sync="auto", window=3.0,
                                       settle=3.0, min_interval=1.5, start="homogeneous", pretrace=True,
                                       candidates={"straggler": "esync"})
    model.compile(opt, loss=loss, metrics=metrics)
    slow = hetsync.testing.SlowdownCallback("deterministic", ranks=[SLOW], factor=FACTOR, base_time=COMPUTE)
    phased = hetsync.testing.PhasedSlowdownCallback([(PHASES[0], None), (PHASES[1], slow), (PHASES[2], None)])
    traced = Traced()
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hetsync.testing.EmulatedComputeCallback(COMPUTE), phased,
                 traced]
    if rank == 0:  # the report asked for, beside the user's TensorBoard
        callbacks.append(tf.keras.callbacks.TensorBoard(log_dir=logdir, update_freq="epoch"))
        callbacks.append(hetsync.callbacks.HeterogeneityReportCallback(logdir))
        from hetsync.report import write_phases  # the injected slowdown, for `hetsync report` to hatch

        write_phases(logdir, [(PHASES[0], PHASES[0] + PHASES[1], f"rank {SLOW} {FACTOR}x slower")])
    if rank == 1:  # a TensorBoard callback alone gets nothing of hetsync's (scalars only when asked)
        callbacks.append(tf.keras.callbacks.TensorBoard(log_dir=os.path.join(logdir, "rank1-board"),
                                                        update_freq="epoch"))
    # (the report on rank 0 only, as Horovod users place TensorBoard: it writes every rank's records; the other
    # ranks have no report callback)
    hetsync.keras.fit(model, shard(x, y, rank, size, 32, 0), steps_per_epoch=50, epochs=sum(PHASES) // 50, callbacks=callbacks,
              verbose=0)
    if rank == 1:
        assert not os.path.exists(os.path.join(logdir, "rank1-board", "hetsync")), "unasked hetsync scalars"
    history = hetsync.marks.family_of(model.optimizer).history
    summary = [(h["from"], h["to"], h["position"]) for h in history]
    everyone = hvd_tf.allgather_object(summary)
    assert all(e == everyone[0] for e in everyone), f"ranks switched differently: {everyone}"
    if rank == 0:
        for h in history:
            print(f"switch at step {h['position']}: {h['from']} -> {h['to']}: {h['reason']}", flush=True)
    assert history, "auto never switched"
    first = history[0]
    assert first["to"] == "esync" and first["position"] > PHASES[0], summary
    assert "straggler" in first["reason"] and "rank 3 " in first["reason"], first["reason"]
    back = [h for h in history[1:] if h["to"] == "allreduce"]
    assert back and back[0]["position"] > PHASES[0] + PHASES[1], summary
    assert "homogeneous" in back[0]["reason"], back[0]["reason"]
    assert not any(h["traced"] for h in history), [(h["to"], h["traced"]) for h in history]
    family = hetsync.marks.family_of(model.optimizer)
    esync = [e for e in family.entries.values() if e.mode == "esync"][0]
    assert traced.counts == (1, 2), f"before the first switch, esync's step/aggregation traced {traced.counts}"
    assert esync.train_function.experimental_get_tracing_count() == 1, "esync's train step traced again"
    assert esync.algorithm._aggregation.fn.experimental_get_tracing_count() == 2, "esync's aggregation traced again"
    final = model.evaluate(x_test, y_test, verbose=0)[0]
    assert final < 0.5, f"loss {final:.3f}"
    print(f"OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
