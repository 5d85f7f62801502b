"""Kill and resume, as a user's job meets them (under mpirun -np 2; tests/test_resume.py runs it).

    kill_resume.py first DIR MODE     Horovod's Keras recipe with ``hetsync.DistributedOptimizer(Adam, sync=MODE)``:
                                      ``ModelCheckpoint`` writes the whole model (``.h5``) on rank 0 at each epoch
                                      end, and rank 0 notes what it saved (the optimizer's ``iterations`` and a
                                      digest of its slots and of the weights, ``saved-<epoch>.json``).  Rank 1 is
                                      SIGKILLed during epoch 3 (batch 2, once the epoch-2 checkpoint is on disk) and
                                      prints the time.time() of its death: the job must end by itself.
    kill_resume.py first-host DIR MODE
                                      The same, across 2 hosts (scripts/cluster.sh): the second host's ranks stop
                                      during epoch 3 (batch 2, once the epoch-2 checkpoint is on disk), one of them
                                      writes ``<MODE>-kill-host`` in DIR, and the test kills every process on that
                                      host (tests/test_cluster.py).
    kill_resume.py resume DIR MODES KILLED
                                      Per mode, an uninterrupted 4-epoch run of the same seed and data order, then
                                      the same script restarted: rank 0 finds the last checkpoint and broadcasts
                                      its epoch (Horovod's ``resume_from_epoch``), loads it with
                                      ``hetsync.load_model(path, sync=MODE)`` -- ``iterations``, slots and weights
                                      bit for bit what was saved -- and ``fit(initial_epoch=...)`` finishes to epoch
                                      4 (every rank's first step begins from the checkpoint's weights and
                                      optimizer state).  The modes in KILLED (comma list) resume from their killed
                                      job's checkpoint; the others from the uninterrupted run's epoch-2 checkpoint
                                      (the same recipe, ``ModelCheckpoint`` and the note on rank 0; it saves every
                                      epoch, and the restart takes the one a kill in epoch 3 would have left last).
                                      Rank 0 prints one ``RESULT {json}`` line per mode: both runs' loss, accuracy,
                                      final weights' digests, the step counts and where the checkpoint came from.

Also: ``hetsync.load_model`` without ``sync`` is a TypeError naming it.  The test (tests/test_resume.py) asserts
on what these print: the job's end, the step counts, the accuracies and final weights.
"""
import hashlib
import json
import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.marks  # noqa: E402
from hetsync.algorithms._wrap import optimizer_variables  # noqa: E402
from common import digits, without_autotune  # noqa: E402
import rank_files  # noqa: E402

EPOCHS, KILLED_IN, STEPS, BATCH, SEED = 4, 3, 16, 32, 7
# OD-SGD leaves its warm-up (plain allreduce) after 20 steps: the checkpoint at step 32 is of its one-step delay
OPTIONS = {"od-sgd": {"warmup_steps": 20}}


def dataset(rank, size, epoch=0):
    """This rank's shard, shuffled with a fixed seed, from ``epoch``'s first batch on (a resumed run continues
    where the interrupted one was, so a lockstep mode repeats the uninterrupted run's steps)."""
    tf.keras.utils.set_random_seed(SEED + rank)  # the shuffle's order: the same in every process and run
    x, y, xt, yt = digits(seed=0)
    ds = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).repeat().shuffle(
        512, seed=SEED + rank).batch(BATCH).skip(epoch * STEPS)
    # scored over all 1,797 digits: two runs that train alike differ less there than on the 360 held out, so a run
    # that lost something stands out of the noise of an own-pace mode
    return without_autotune(ds), (np.concatenate([x, xt]), np.concatenate([y, yt]))


def build(mode, rank):
    tf.keras.utils.set_random_seed(SEED + rank)  # different initial weights: the broadcast must align them
    model = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=hetsync.DistributedOptimizer(tf.keras.optimizers.Adam(0.01), sync=mode,
                                                         **OPTIONS.get(mode, {})),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]


class NoteSaved(tf.keras.callbacks.Callback):
    """Rank 0, after ModelCheckpoint in the list: what the epoch's checkpoint holds, then a marker for rank 1."""

    def __init__(self, where, mode):
        super().__init__()
        self.where, self.mode = where, mode

    def on_epoch_end(self, epoch, logs=None):
        note = {"iterations": int(self.model.optimizer.iterations.numpy()),
                "optimizer": digest(optimizer_variables(self.model.optimizer)), "weights": digest(self.model.weights)}
        path = os.path.join(self.where, f"{self.mode}-saved-{epoch + 1}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(note, out)
        os.replace(path + ".tmp", path)  # whole or absent: the marker rank 1 waits for


class DiesDuringEpoch3(tf.keras.callbacks.Callback):
    """At epoch 3's batch 2, once rank 0 has saved epoch 2 (a made order, not a raced one), this rank dies: by its
    own SIGKILL (rank 1), or (``host``) by the test's, which kills every process of the second host once that
    host's first rank asks for it with a marker file (its ranks wait there; bounded: 120 s, then the job fails)."""

    def __init__(self, where, mode, host):
        super().__init__()
        self.where, self.mode, self.host, self.epoch = where, mode, host, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch != KILLED_IN - 1 or batch != 2:
            return
        rank_files.wait_for(self.where, [f"{self.mode}-saved-{KILLED_IN - 1}.json"], timeout=60)
        if not self.host:
            print(f"KILLED rank={hvd.rank()} at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if hvd.local_rank() == 0:
            rank_files.mark(self.where, f"{self.mode}-kill-host")
        time.sleep(120)
        raise AssertionError(f"rank {hvd.rank()}: the host was not killed within 120 s")


class FirstBatch(tf.keras.callbacks.Callback):
    """The weights and optimizer state (step count, slots) every rank begins the resumed fit's first step with."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0 and not hasattr(self, "state"):
            self.state = (digest(self.model.weights), digest(optimizer_variables(self.model.optimizer)))


def checkpointing(where, mode):
    """Horovod's recipe: the whole model saved by rank 0 at each epoch end, and rank 0's note of what it holds."""
    if hvd.rank() != 0:
        return []
    return [tf.keras.callbacks.ModelCheckpoint(os.path.join(where, mode + "-{epoch}.h5")), NoteSaved(where, mode)]


def first(where, mode, host=False):
    """Trains until killed: rank 1 by itself, or (``host``) every rank of the second host by the test."""
    rank, size = hvd.rank(), hvd.size()
    ds, _ = dataset(rank, size)
    model = build(mode, rank)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] + checkpointing(where, mode)
    if (hvd.cross_rank() == 1) if host else (rank == 1):
        callbacks.append(DiesDuringEpoch3(where, mode, host))
    hetsync.keras.fit(model, ds, steps_per_epoch=STEPS, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    raise AssertionError(f"rank {rank}: the job outlived its killed {'host' if host else 'rank 1'}")


def last_saved(where, mode, up_to):
    """Horovod's resume_from_epoch: the last epoch whose checkpoint is complete (rank 0 decides), up to ``up_to``
    (a killed job's directory holds nothing later than its last save; an uninterrupted run's holds every epoch)."""
    done = [e for e in range(up_to, 0, -1) if os.path.exists(os.path.join(where, f"{mode}-saved-{e}.json"))]
    return done[0] if done else 0


def resumed(where, mode, up_to):
    """The restarted script: Horovod's resume recipe with hetsync.load_model on rank 0."""
    rank, size = hvd.rank(), hvd.size()
    epoch = hvd_tf.broadcast_object(last_saved(where, mode, up_to) if rank == 0 else None, name=f"kr.epoch.{mode}")
    ds, (xt, yt) = dataset(rank, size, epoch)
    assert epoch == KILLED_IN - 1, f"{mode}: resuming from epoch {epoch}, not the last one saved before the kill"
    if rank == 0:
        model = hetsync.load_model(os.path.join(where, f"{mode}-{epoch}.h5"), sync=mode, **OPTIONS.get(mode, {}))
        note = json.load(open(os.path.join(where, f"{mode}-saved-{epoch}.json")))
        assert hetsync.marks.is_hetsync(model.optimizer) and hetsync.current_mode(model) == mode, mode
        loaded = {"iterations": int(model.optimizer.iterations.numpy()),
                  "optimizer": digest(optimizer_variables(model.optimizer)), "weights": digest(model.weights)}
        assert loaded == note, f"{mode}: loaded {loaded}, saved {note}"  # bit for bit
        saved_iterations = note["iterations"]
    else:
        model, saved_iterations = build(mode, rank), None
    saved_iterations, saved_state = hvd_tf.broadcast_object(
        (saved_iterations, (note["weights"], note["optimizer"]) if rank == 0 else None), name=f"kr.it.{mode}")
    probe = FirstBatch()
    hetsync.keras.fit(model, ds, steps_per_epoch=STEPS, initial_epoch=epoch, epochs=EPOCHS, verbose=0,
                      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), probe])
    began = hvd_tf.allgather_object(probe.state, name=f"kr.began.{mode}")
    assert began == [saved_state] * size, f"{mode}: the resumed fit's first step began from {began}, " \
                                          f"not the checkpoint's {saved_state} on every rank"
    iterations = hvd_tf.allgather_object(int(model.optimizer.iterations.numpy()), name=f"kr.its.{mode}")
    scores = [float(v) for v in model.evaluate(xt, yt, verbose=0)]  # loss, accuracy
    final = digest(model.weights)
    tf.keras.backend.clear_session()  # (rank 0 made more Keras layers: the next model's names match everywhere)
    return saved_iterations, iterations, scores, final


def straight(mode, where=None):
    """The same job uninterrupted: 4 epochs from the same seed (checkpointed into ``where`` when given)."""
    rank, size = hvd.rank(), hvd.size()
    ds, (xt, yt) = dataset(rank, size)
    model = build(mode, rank)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    callbacks += checkpointing(where, mode) if where else []
    hetsync.keras.fit(model, ds, steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    scores = [float(v) for v in model.evaluate(xt, yt, verbose=0)]  # loss, accuracy
    final = digest(model.weights)
    tf.keras.backend.clear_session()
    return scores, final


def resume_all(where, modes, killed):
    """Per mode, the uninterrupted run, then the restart: from the killed job's checkpoint (a mode in ``killed``), else
    from the uninterrupted run's epoch-2 checkpoint, the last one a kill in epoch 3 would have left."""
    for mode in modes:
        reference, reference_final = straight(mode, None if mode in killed else where)
        up_to = EPOCHS if mode in killed else KILLED_IN - 1
        saved_iterations, iterations, scores, final = resumed(where, mode, up_to)
        if hvd.rank() == 0:
            print("RESULT " + json.dumps({"mode": mode, "saved_iterations": saved_iterations,
                                          "iterations": iterations, "resumed": scores[1], "straight": reference[1],
                                          "resumed_loss": scores[0], "straight_loss": reference[0],
                                          "resumed_weights": final, "straight_weights": reference_final,
                                          "from": "killed" if mode in killed else "uninterrupted"}), flush=True)


def main():
    hvd.init()
    hetsync.init()
    phase, where = sys.argv[1], sys.argv[2]
    if phase in ("first", "first-host"):
        first(where, sys.argv[3], host=phase == "first-host")
    else:
        try:
            hetsync.load_model(os.path.join(where, "unused.h5"))
            raise AssertionError("load_model without sync= was accepted")
        except TypeError as exc:
            assert "sync" in str(exc), exc
        resume_all(where, sys.argv[3].split(","), [m for m in sys.argv[4].split(",") if m])
    hetsync.shutdown()
    print(f"OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
