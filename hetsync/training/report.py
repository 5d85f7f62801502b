"""``keras_callbacks.HeterogeneityReport``: what each worker does, for TensorBoard and ``hetsync report``.

Every ``every_s`` seconds (and at each epoch end and the end of ``fit``) each rank writes one record:

* its step rate (iterations per second of wall time), its compute rate (iterations per second of compute: the
  worker's speed, hetsync/training/step_clock.py) and the seconds it waited in hetsync (exchanges, sync points, switches);
* the mode in force and, as it happens, each switch with its reason (sync="auto": the policy's evidence);
* the mode's own counters (``optimizer._hetsync_algorithm.metrics()``: Group Generator conflicts, eager-SGD's NAP,
  Hop's queue depths and staleness, ESync's local steps, OD-SGD's exposed wait...).

Records go to ``LOG_DIR/hetsync/rank<R>.jsonl`` (``hetsync report LOG_DIR`` turns them into a PNG and a Markdown
summary) and, as TensorBoard scalars, to ``LOG_DIR/hetsync/rank<R>/`` (tags ``hetsync/...``).  A model trained
with a user's ``tf.keras.callbacks.TensorBoard`` callback gets this report in that log_dir by itself.
"""
import json
import os
import time

import tensorflow as tf


def _numbers(metrics, prefix=""):
    out = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, bool):
            out[prefix + key] = int(value)
        elif isinstance(value, (int, float)):
            out[prefix + key] = value
    return out


class HeterogeneityReport(tf.keras.callbacks.Callback):
    """Writes the heterogeneity report of each rank to ``log_dir`` (see the module docstring)."""

    def __init__(self, log_dir, every_s=2.0, tensorboard=True):
        super().__init__()
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0 seconds, got {every_s!r}")
        self.log_dir, self.every_s, self.tensorboard = str(log_dir), float(every_s), bool(tensorboard)
        self._file = self._writer = None
        self._last = 0.0
        self._switches_written = 0
        self.records = 0

    def _open(self):
        import horovod.tensorflow as hvd

        rank = hvd.rank()
        folder = os.path.join(self.log_dir, "hetsync")
        os.makedirs(folder, exist_ok=True)
        self._file = open(os.path.join(folder, f"rank{rank}.jsonl"), "a", encoding="utf-8")
        if self.tensorboard:
            self._writer = tf.summary.create_file_writer(os.path.join(folder, f"rank{rank}"))
        self.rank = rank

    def on_train_begin(self, logs=None):
        if self._file is None:
            self._open()
        self._last = time.monotonic()
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self._last >= self.every_s:
            self.write(logs)

    def on_epoch_end(self, epoch, logs=None):
        self.write(logs)

    def on_train_end(self, logs=None):
        self.write(logs)
        self._file.flush()
        if self._writer is not None:
            self._writer.flush()

    def write(self, logs=None):
        """One record now (and the switches since the last one)."""
        points = getattr(self.model, "_hetsync_sync_points", None)
        if points is None or self._file is None:
            return
        self._last = time.monotonic()
        family = points.family
        history = family.history if family is not None else []
        for record in history[self._switches_written:]:
            self._emit({"kind": "switch", **record})
        self._switches_written = len(history)
        stats = points.clock.take()
        mode = family.current[0] if family is not None else points.algorithm.name
        try:
            counters = _numbers(points.algorithm.metrics())
        except Exception as exc:  # a report must never stop training
            counters = {"metrics_error": str(exc)[:200]}
        record = {"kind": "rate", "time": time.time(), "rank": self.rank, "epoch": self._epoch,
                  "position": points.position, "mode": mode, **stats, "idle": bool(points.idle),
                  "loss": float(logs["loss"]) if logs and "loss" in logs else None, "metrics": counters}
        self._emit(record)
        if self._writer is not None:
            self._scalars(record, counters)

    def _emit(self, record):
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        self.records += 1

    def _scalars(self, record, counters):
        from hetsync import algorithms

        modes = algorithms.available_modes()
        with self._writer.as_default(step=record["position"]):
            for key in ("rate", "compute_rate", "wait_s", "sync_s"):
                tf.summary.scalar(f"hetsync/{key}", record[key])
            tf.summary.scalar("hetsync/mode_index", modes.index(record["mode"]) if record["mode"] in modes else -1)
            for key, value in counters.items():
                if isinstance(value, (int, float)):
                    tf.summary.scalar(f"hetsync/{record['mode']}/{key}", value)
