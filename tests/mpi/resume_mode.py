"""The mode in force across a restart (under mpirun -np 2; tests/test_resume.py runs it, docs/resume.md).

    resume_mode.py DIR

1. A job started with ``sync="allreduce"`` switches to ripples-smart by the flag (``SyncModeCallback.request``, from
   rank 1) during epoch 1; rank 0's ``ModelCheckpoint`` writes ``.h5`` files, and the one of epoch 2 records
   ripples-smart.
2. The script restarted (a new model on every rank; rank 0 loads the checkpoint with ``hetsync.load_model(path,
   sync="allreduce")``, the script's own line; Horovod's broadcast callback) trains its first step in
   ripples-smart on every rank, by one switch made before that step.
3. A restarted script whose schedule put eager-solo in force at epoch 1 (no checkpoint of the mode: a fresh
   optimizer) starts at ``initial_epoch=2`` in eager-solo.  A flag switch back to allreduce during that fit then
   holds in the same process's next fit: the schedule's epoch-1 entry, gone through already, is not applied again.

tests/test_resume.py runs it in the job after tests/mpi/loop_resume.py, whose ripples-smart loops leave the two
ranks at different step counts (an own-pace mode in a custom loop); a fit's switches name steps by that count, so
this also checks that a fit starts with the counts aligned (training/rank_state.py ``align_position``): without it
the first switch here waits 60 s for a rank that is a few steps behind, inside a step.

Each rank prints ``MODE {json}`` with the mode each fit's first step ran in and the switches' reasons; the test
asserts on them.  Without the saved mode the restarted fit of 2 starts in allreduce; without the schedule's catch-up
3 starts in allreduce; applying the missed entry at every fit's start would put 3's second fit back in eager-solo.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
from hetsync.callbacks import SyncModeCallback  # noqa: E402
from hetsync.training import saved_mode  # noqa: E402
from kill_resume import build, dataset  # noqa: E402  (the same small model and data)

STEPS = 6


class FirstStep(tf.keras.callbacks.Callback):
    """Notes the mode in force when the fit's first train step begins, and asks for a switch at one batch."""

    def __init__(self, switch, request=None):
        super().__init__()
        self.switch, self.request = switch, request  # request: (epoch, batch, rank, mode)
        self.first, self.epoch = None, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.first is None:
            self.first = self.switch.mode
        if self.request and (self.epoch, batch, hvd.rank()) == self.request[:3]:
            assert self.switch.request(self.request[3]) == "accepted"


def fit(model, callbacks, initial_epoch, epochs):
    rank, size = hvd.rank(), hvd.size()
    ds, _ = dataset(rank, size, initial_epoch)
    hetsync.keras.fit(model, ds, steps_per_epoch=STEPS, initial_epoch=initial_epoch, epochs=epochs, verbose=0,
                      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)] + callbacks)


def reasons(switch):
    return [(h["to"], h["reason"]) for h in switch.history]


def main():
    where = sys.argv[1]
    hvd.init()
    hetsync.init()
    rank = hvd.rank()
    path = os.path.join(where, "mode-{epoch}.h5")
    out = {}

    # 1. the flag's switch, then the checkpoints (rank 0)
    switch = SyncModeCallback(verbose=False)
    seen = FirstStep(switch, request=(0, 2, 1, "ripples-smart"))
    saving = [tf.keras.callbacks.ModelCheckpoint(path)] if rank == 0 else []
    fit(build("allreduce", rank), [switch, seen] + saving, 0, 2)
    out["before"] = {"first": seen.first, "last": switch.mode, "switches": reasons(switch)}
    if rank == 0:
        out["saved"] = saved_mode.read(path.format(epoch=2))
    tf.keras.backend.clear_session()

    # 2. restarted from the checkpoint: rank 0 loads it with the script's own line
    model = hetsync.load_model(path.format(epoch=2), sync="allreduce") if rank == 0 else build("allreduce", rank)
    switch = SyncModeCallback(verbose=False)
    seen = FirstStep(switch)
    fit(model, [switch, seen], 2, 3)
    out["resumed"] = {"first": seen.first, "switches": reasons(switch)}
    tf.keras.backend.clear_session()

    # 3. restarted with a schedule, no saved mode; then a flag switch, and the same process's next fit
    switch = SyncModeCallback(schedule={1: "eager-solo"}, verbose=False)
    seen = FirstStep(switch, request=(2, 0, 0, "allreduce"))
    model = build("allreduce", rank)
    fit(model, [switch, seen], 2, 4)
    out["scheduled"] = {"first": seen.first, "last": switch.mode, "switches": reasons(switch)}
    seen = FirstStep(switch)
    fit(model, [switch, seen], 4, 5)
    out["next_fit"] = {"first": seen.first, "switches": reasons(switch)}
    tf.keras.backend.clear_session()
    print("MODE " + json.dumps({"rank": rank, **out}), flush=True)


if __name__ == "__main__":
    main()
