"""``hetsync.callbacks.HeterogeneityReportCallback``: what each worker does, for TensorBoard and ``hetsync report``.

Place it as Horovod users place TensorBoard, on rank 0 only (``if hvd.rank() == 0: callbacks.append(...)``), or on
every rank: either way rank 0 (the lowest rank that has one) writes every rank's records.  Every ``every_s`` seconds
(and at each sync point: epoch ends, the end of ``fit``) each rank takes one record:

* its step rate (iterations per second of wall time), its compute rate (iterations per second of compute: the
  worker's speed, hetsync/training/step_clock.py) and the seconds it waited in hetsync (exchanges, sync points,
  switches);
* the mode in force and, as it happens, each switch with its reason (sync="auto": the policy's evidence);
* the mode's own counters (``hetsync.metrics``: Group Generator conflicts, eager-SGD's NAP, Hop's queue depths and
  staleness, ESync's local steps, OD-SGD's exposed wait...).

How the records reach the writer: the callback needs no collective of its own (a rank without it never enters
one).  At the start of each ``fit`` hetsync's training layer learns, in the small gather it makes anyway
(keras_fit.py), which ranks have a report; then every rank's training layer takes the records (:class:`ReportFeed`,
after each Keras step) and hands them over at the sync points every rank passes anyway (one Horovod
``allgather_object`` there, only when some rank has a report).  The writer's own records are written as they are
taken; the others' arrive at each epoch end (and at the end of ``fit``).

Records go to ``LOG_DIR/hetsync/rank<R>.jsonl`` (``hetsync report LOG_DIR`` turns them into a PNG and a Markdown
summary) and to TensorBoard, in ``LOG_DIR/hetsync/rank<R>/``: scalars tagged ``hetsync/...``, the mode in force by
name (a text summary ``hetsync/mode`` and a scalar ``hetsync/mode/<name>``: 1 while in force, 0 from a switch away,
written when the mode changes), and the mode's counters as ``hetsync/<mode>/<counter>``.  Nothing goes to a user's
TensorBoard unless asked: give this callback the TensorBoard callback's ``log_dir`` to see both together.
"""
import json
import os
import time

import tensorflow as tf
from hetsync import algorithms


def _numbers(metrics, prefix=""):
    out = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, bool):
            out[prefix + key] = int(value)
        elif isinstance(value, (int, float)):
            out[prefix + key] = value
    return out


def wanted_ms(callbacks):
    """This rank's wish for the fit's gather (keras_fit.py): the shortest ``every_s`` of its reports, in ms; 0: none."""
    every = [cb.every_s for cb in callbacks if isinstance(cb, HeterogeneityReportCallback)]
    return max(1, int(round(min(every) * 1000))) if every else 0


class ReportFeed:
    """One rank's side of the report in one fit, on every rank when any rank has a HeterogeneityReportCallback."""

    def __init__(self, every_s, writer, rank):
        self.every_s, self.writer, self.rank = float(every_s), int(writer), int(rank)
        self.epoch = 0
        self.loss = None
        self.outbox = []        # this rank's records the writer has not had yet
        self.inbox = []         # the writer: records (any rank) not written yet
        self.exchanges = 0
        self._last = time.monotonic()
        self._switches = 0

    @classmethod
    def agreed(cls, wishes):
        """From every rank's :func:`wanted_ms` (the fit's gather): the feed, or None when no rank has a report."""
        import horovod.tensorflow as hvd

        wanting = [r for r, ms in enumerate(wishes) if ms > 0]
        if not wanting:
            return None
        return cls(min(wishes[r] for r in wanting) / 1000.0, wanting[0], hvd.rank())

    @property
    def writes(self):
        return self.rank == self.writer

    def step(self, state, logs):
        """After each Keras step (every rank): a record every ``every_s`` seconds."""
        if logs and "loss" in logs:
            try:
                self.loss = float(logs["loss"])
            except (TypeError, ValueError):
                pass
        if time.monotonic() - self._last >= self.every_s:
            self.take(state)

    def take(self, state):
        """One record now (and the switches since the last one)."""
        self._last = time.monotonic()
        family = state.family
        records = []
        history = family.history if family is not None else []
        for switch in history[self._switches:]:
            records.append({"kind": "switch", "rank": self.rank, **switch})
        self._switches = len(history)
        mode = family.current[0] if family is not None and family.current else state.algorithm.name
        try:
            counters = _numbers(state.algorithm.metrics())
        except Exception as exc:  # noqa: BLE001 (a report must never stop training)
            counters = {"metrics_error": str(exc)[:200]}
        records.append({"kind": "rate", "time": time.time(), "rank": self.rank, "epoch": self.epoch,
                        "position": state.position, "mode": mode, **state.clock.take(), "idle": bool(state.idle),
                        "loss": self.loss, "metrics": counters})
        (self.inbox if self.writes else self.outbox).extend(records)

    def exchange(self, state):
        """At a sync point (collective: every rank, the same points): every rank's records to the writer."""
        import horovod.tensorflow as hvd

        self.take(state)
        sent, self.outbox = self.outbox, []
        everyone = hvd.allgather_object(sent, name=f"hetsync.report.{self.exchanges}")
        self.exchanges += 1
        if self.writes:
            for rank, records in enumerate(everyone):
                if rank != self.rank:
                    self.inbox.extend(records)

    def drain(self):
        out, self.inbox = self.inbox, []
        return out


class HeterogeneityReportCallback(tf.keras.callbacks.Callback):
    """Writes the heterogeneity report of every rank to ``log_dir`` (see the module docstring): on rank 0 only, as
    Horovod's TensorBoard callback, or on every rank (the lowest rank that has one writes)."""

    def __init__(self, log_dir, every_s=2.0, tensorboard=True):
        super().__init__()
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0 seconds, got {every_s!r}")
        self.log_dir, self.every_s, self.tensorboard = str(log_dir), float(every_s), bool(tensorboard)
        self._files, self._writers, self._modes = {}, {}, {}
        self._feed = None
        self.records = 0

    def on_train_begin(self, logs=None):
        points = getattr(self.model, "_hetsync_sync_points", None)  # (the model's: a RankState, or None)
        feed = points.report if points is not None else None
        self._feed = feed if feed is not None and feed.writes else None

    def on_train_batch_end(self, batch, logs=None):
        self._write()

    def on_epoch_end(self, epoch, logs=None):
        self._write()

    def on_train_end(self, logs=None):
        self._write()
        for f in self._files.values():
            f.flush()
        for w in self._writers.values():
            w.flush()

    def _write(self):
        if self._feed is None:
            return
        for record in self._feed.drain():
            self._emit(record)
            if record["kind"] == "rate" and self.tensorboard:
                self._scalars(record)

    def _folder(self):
        folder = os.path.join(self.log_dir, "hetsync")
        os.makedirs(folder, exist_ok=True)
        return folder

    def _emit(self, record):
        rank = record["rank"]
        if rank not in self._files:
            self._files[rank] = open(os.path.join(self._folder(), f"rank{rank}.jsonl"), "a", encoding="utf-8")
        self._files[rank].write(json.dumps(record, default=str) + "\n")
        self._files[rank].flush()
        self.records += 1

    def _scalars(self, record):
        rank, mode = record["rank"], record["mode"]
        if rank not in self._writers:
            self._writers[rank] = tf.summary.create_file_writer(os.path.join(self._folder(), f"rank{rank}"))
        modes = algorithms.available_modes()
        with self._writers[rank].as_default(step=record["position"]):
            for key in ("rate", "compute_rate", "wait_s", "sync_s"):
                tf.summary.scalar(f"hetsync/{key}", record[key])
            tf.summary.scalar("hetsync/mode_index", modes.index(mode) if mode in modes else -1)
            before = self._modes.get(rank)
            if mode != before:  # the mode by name, when it changes
                tf.summary.text("hetsync/mode", tf.constant(mode))
                tf.summary.scalar(f"hetsync/mode/{mode}", 1)
                if before is not None:
                    tf.summary.scalar(f"hetsync/mode/{before}", 0)
                self._modes[rank] = mode
            for key, value in record["metrics"].items():
                if isinstance(value, (int, float)):
                    tf.summary.scalar(f"hetsync/{mode}/{key}", value)
