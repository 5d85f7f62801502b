"""Run under mpirun -np 4 (tests/test_switching.py, in conftest's keras_job): a request made at a fit's last step,
whose agreed step falls past the fit, is carried out in the process's next fit (docs/switching.md), and the rank
that asked is told so at the first fit's end.

In ``allreduce`` (every rank steps together) rank 0 asks for ``ripples-static`` after the first fit's last batch.
Every rank has by then sent the report of the step after it (reports go a step ahead), so the Switch Board's step
for the request is past the fit: no rank switches in it, and every rank leaves it with the request unanswered or
pending.  Positions count on across fits, so in the second fit every rank switches at the same step, within its
first three, and every rank ends with one model in the new mode.  A reading of the protocol that restarted
positions with each fit, or dropped a decision at a fit's end, fails here (no switch, ranks switching apart, or a
rank past the decision's step).  Rank 0, which asked, logs one warning naming the carried request at the first
fit's end and none at the second's (it was carried out); no other rank logs one.
Prints OK rank=R.
"""
import hashlib
import logging
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
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
from common import shard, task  # noqa: E402

STEPS, TARGET = 6, "ripples-static"


class LastStepRequest(tf.keras.callbacks.Callback):
    """Rank 0 asks for TARGET after the first fit's last batch (hetsync's own callback ran before: its report of
    the next step is on its way)."""

    def __init__(self, switch):
        super().__init__()
        self.switch, self.answer = switch, None

    def on_train_batch_end(self, batch, logs=None):
        if hvd.rank() == 0 and batch == STEPS - 1 and self.answer is None:
            self.answer = self.switch.request(TARGET)


class FirstInMode(tf.keras.callbacks.Callback):
    """The first batch of each fit that ended in TARGET (hetsync's callback, which switches, ran before)."""

    def on_train_begin(self, logs=None):
        self.batch = None

    def on_train_batch_end(self, batch, logs=None):
        if self.batch is None and hetsync.current_mode(self.model) == TARGET:
            self.batch = batch


class Warnings(logging.Handler):
    """The messages of hetsync.callbacks' warnings on this rank."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def checksum(model):
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    return hashlib.sha1(flat.tobytes()).hexdigest()


def main():
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    (x, y, _, _), build, loss, _ = task("digits", 0)
    tf.keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.05), sync="allreduce"), loss=loss)
    switch = hetsync.callbacks.SyncModeCallback()
    asker, first = LastStepRequest(switch), FirstInMode()
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), switch, asker, first]
    data = shard(x, y, rank, size, 32, 0)
    warned = Warnings()
    logging.getLogger("hetsync.callbacks").addHandler(warned)
    hetsync.keras.fit(model, data, steps_per_epoch=STEPS, epochs=1, callbacks=callbacks, verbose=0)
    told = [m for m in warned.messages if "next fit" in m]
    assert len(told) == (1 if rank == 0 else 0) and all(TARGET in m for m in told), (rank, warned.messages)
    assert switch.history == [] and first.batch is None, f"rank {rank} switched in the first fit: {switch.history}"
    assert rank != 0 or asker.answer == "accepted", asker.answer
    assert hetsync.current_mode(model) == "allreduce", hetsync.current_mode(model)
    hetsync.keras.fit(model, data, steps_per_epoch=STEPS, epochs=1, callbacks=callbacks, verbose=0)
    assert [m for m in warned.messages if "next fit" in m] == told, (rank, warned.messages)
    done = [(h["to"], h["position"]) for h in switch.history]  # (positions count over the process's fits)
    # The board decides at the first report after the request: at the latest the one for the second fit's second
    # step, so its step is at most the second fit's third.
    assert len(done) == 1 and done[0][0] == TARGET and first.batch is not None and first.batch <= 2, (done, first.batch)
    everyone = hvd_tf.allgather_object((done, first.batch, checksum(model)))
    assert all(e == everyone[0] for e in everyone), f"ranks differ: {everyone}"
    assert hetsync.current_mode(model) == TARGET, hetsync.current_mode(model)
    print(f"rank {rank}: switched to {TARGET} at the second fit's batch {first.batch} (step {done[0][1]})", flush=True)
    print(f"OK rank={rank}", flush=True)
    hetsync.shutdown()


if __name__ == "__main__":
    main()
