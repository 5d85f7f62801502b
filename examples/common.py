"""Data, model and logging shared by the examples.  Nothing is downloaded: scikit-learn ships the digits data set,
and the hyperplane regression (eager-SGD §6.2.1) is generated from a seed.

Also the drivers' helpers (examples/benchmark.py and bench_*.py): ``Progress`` ([i/N] lines with an ETA),
``run_streamed`` (runs a job, streaming rank 0's output lines as they come) and the plot helpers.  TensorFlow is
imported only by what needs it (``task``, ``shard``, ``EvalLogger``), so a driver imports this module cheaply.
"""
import csv
import re
import subprocess
import threading
import time

import numpy as np


def load_digits():
    """scikit-learn's bundled 8x8 digits, as ``sklearn.datasets.load_digits()`` gives them: (images (1797, 8, 8)
    float64 in 0..16, target int64).  Read from the CSV file scikit-learn ships, without importing scikit-learn:
    its import (with SciPy) costs ~0.5 s of CPU per process, about 1 s per 4-rank job on 2 cores -- a minute of the
    test suite, whose jobs all load these digits.  Falls back to scikit-learn's loader if the file moved."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.exists(path):
        from sklearn.datasets import load_digits as sklearn_digits

        data = sklearn_digits()
        return data.images, data.target.astype("int64")
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype("int64")


def digit_images():
    """The digits as images for a Conv2D model: (x (1797, 8, 8, 1) float32 in [0, 1], y int64), unshuffled."""
    images, target = load_digits()
    return (images / 16.0).astype("float32")[..., None], target


def digit_images_split(seed=0):
    """The digits as images, shuffled with ``seed`` and cut 80/20: (x_train, y_train, x_test, y_test)."""
    x, y = digit_images()
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def digits(seed=0):
    """scikit-learn's bundled 8x8 digits: (x_train, y_train, x_test, y_test), features scaled to [0, 1]."""
    images, target = load_digits()
    x = (images.reshape(len(images), -1) / 16.0).astype("float32")
    y = target
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def hyperplane(n=4096, dim=256, noise=0.1, seed=0):
    """y = a . x + noise with a fixed random ``a`` (eager-SGD §6.2.1, smaller): (x_train, y_train, x_test, y_test)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, 1)).astype("float32")
    x = rng.normal(size=(n, dim)).astype("float32")
    y = x @ a + noise * rng.normal(size=(n, 1)).astype("float32")
    cut = int(0.8 * n)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def task(name, seed=0, hidden=64):
    """(data, model builder, loss, metrics) for ``digits`` (an MLP with ``hidden`` units) or ``hyperplane``."""
    import tensorflow as tf

    if name == "digits":
        data = digits(seed)

        def build():
            return tf.keras.Sequential([
                tf.keras.layers.Input((64,)),
                tf.keras.layers.Dense(hidden, activation="relu"),
                tf.keras.layers.Dense(10),
            ])

        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return data, build, loss, ["accuracy"]
    if name == "hyperplane":
        data = hyperplane(seed=seed)

        def build():
            return tf.keras.Sequential([tf.keras.layers.Input((data[0].shape[1],)), tf.keras.layers.Dense(1)])

        return data, build, tf.keras.losses.MeanSquaredError(), []
    raise ValueError(f"unknown task {name!r}; valid: digits, hyperplane")


def without_autotune(ds):
    """``ds`` with tf.data's autotuning off.  TensorFlow 2.15 can block the deletion of a long-lived iterator (the
    end of ``fit``, of a ``hetsync.job_steps`` loop) until its autotune thread's current period ends, up to 60 s,
    on one rank while the others wait for it in the next collective (docs/limitations.md).  These jobs' pipelines
    have nothing to tune; the two Horovod examples keep TensorFlow's defaults, as users write them."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def shard(x, y, rank, size, batch_size, seed):
    """This rank's shard, shuffled and repeated, in batches (tf.data autotuning off: without_autotune)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size]))
    return without_autotune(ds.shuffle(len(x), seed=seed + rank).repeat().batch(batch_size, drop_remainder=True))


def _eval_logger_class():
    import tensorflow as tf

    class EvalLogger(tf.keras.callbacks.Callback):
        """Every ``every`` steps evaluates this worker's *local* model on a fixed test set and records
        (wall time since ``t0``, step, loss[, accuracy]); written as CSV at the end of training.  With
        ``print_every``, prints a progress line every that many steps (``step S/total: ...``; the benchmarks stream
        rank 0's)."""

        def __init__(self, x, y, loss, every, t0, path, rank, print_every=0, total=None):
            super().__init__()
            self.x, self.y, self.loss, self.every, self.t0, self.path, self.rank = x, y, loss, every, t0, path, rank
            self.print_every, self.total = print_every, total
            self.rows = []
            self.step = 0
            self.last_step_time = None  # wall time (since t0) when this worker's last step ended

        def _eval(self):
            logits = self.model(self.x, training=False)
            loss = float(self.loss(self.y, logits))
            acc = float(np.mean(np.argmax(logits, axis=1) == self.y)) if logits.shape[-1] > 1 else float("nan")
            self.rows.append((time.time() - self.t0, self.step, loss, acc))

        def on_train_begin(self, logs=None):
            self._eval()

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            self.last_step_time = time.time() - self.t0
            if self.step % self.every == 0:
                self._eval()
            if self.print_every and self.step % self.print_every == 0:
                t, step, loss, _ = self.rows[-1]
                print(f"step {self.step}/{self.total or '?'}: {self.last_step_time:.1f} s, local test loss {loss:.3f} "
                      f"(at step {step})", flush=True)

        def on_train_end(self, logs=None):
            self._eval()
            if self.path:
                with open(self.path, "w", newline="") as f:
                    writer = csv.writer(f)
                    writer.writerow(["rank", "time_s", "step", "loss", "accuracy"])
                    writer.writerows((self.rank,) + row for row in self.rows)

    return EvalLogger


def __getattr__(name):  # PEP 562: ``from common import EvalLogger`` imports TensorFlow then, not before
    if name == "EvalLogger":
        globals()[name] = _eval_logger_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- plot helpers (benchmark.py, bench_*.py) ---------------------------------------------------------------------------

LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")


def curve_style(i, colour=None, linestyle=None):
    """Line style of the i-th curve of a panel: its own colour, dash pattern and marker (every tenth of the line,
    staggered between curves), slightly transparent, so curves that coincide stay visible."""
    return dict(color=colour or f"C{i % 10}", linestyle=linestyle or LINESTYLES[i % len(LINESTYLES)],
                marker=MARKERS[i % len(MARKERS)], markevery=((i % 5) * 0.02, 0.1), markersize=4, lw=1.4, alpha=0.85)


def log_axis(ax, axis="y"):
    """A log axis with several labelled ticks: Matplotlib labels only the powers of ten, so an axis within a decade
    or two shows one label (10^0).  Ticks at 1, 2, 5 x 10^k (1, 1.5, 2, 3, 5, 7 within a decade; the powers of ten
    beyond three decades) with plain numbers.  Call after plotting."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    which = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0,) if decades > 3 else (1.0, 2.0, 5.0) if decades > 1 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    which.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(NullFormatter())


# -- the drivers' progress: [i/N] lines with an ETA, each job's rank-0 output streamed as it comes ---------------------

def fmt_seconds(s):
    """42 s, 3 min 05 s, 1 h 02 min."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Progress of a driver's N jobs (benchmark.py, bench_*.py).

    ``begin(what)`` before a job prints ``[i/N] what ...  (ETA ...)``; ``end(what)`` (alias ``step``) after it prints
    ``[i/N] what  (job T; E so far, ETA ...)``.  The ETA is the mean duration of the jobs ended so far times the jobs
    left; before the first ends it is ``estimate_s`` per job (marked ``~``, "estimated"), or unknown when that is
    None.  ``end`` without ``begin`` (a driver re-reading logs) counts the time since the previous ``end``."""

    def __init__(self, total, estimate_s=None, clock=time.monotonic):
        self.total, self.estimate_s, self.clock = total, estimate_s, clock
        self.start = self.last = clock()
        self.done, self.durations, self.job_start = 0, [], None

    def eta(self, left):
        """The text of the ETA for ``left`` more jobs."""
        if left <= 0:
            return "done"
        if self.durations:
            return f"ETA {fmt_seconds(sum(self.durations) / len(self.durations) * left)}"
        if self.estimate_s is not None:
            return f"ETA ~{fmt_seconds(self.estimate_s * left)}, estimated"
        return "ETA after the first job"

    def begin(self, what):
        self.job_start = self.clock()
        return self._print(f"[{self.done + 1}/{self.total}] {what} ...  ({self.eta(self.total - self.done)})")

    def end(self, what):
        now = self.clock()
        job = now - (self.last if self.job_start is None else self.job_start)
        self.durations.append(job)
        self.done += 1
        self.last, self.job_start = now, None
        return self._print(f"[{self.done}/{self.total}] {what}  (job {fmt_seconds(job)}; "
                           f"{fmt_seconds(now - self.start)} so far, {self.eta(self.total - self.done)})")

    step = end

    @staticmethod
    def _print(line):
        print(line, flush=True)
        return line


_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")


class TaggedLines:
    """Each rank's lines from Open MPI's ``--tag-output`` (horovodrun's output).  Open MPI tags each chunk a rank
    writes, not each line, so with unbuffered Python one line can come in pieces, between other ranks' pieces:
    ``[1,1]<stdout>:hi[1,0]<stdout>:hi[1,0]<stdout>:`` then a newline.  ``feed`` takes the launcher's output line by
    line and returns the lines completed so far as (rank, text); rank None for an untagged line (the launcher's own,
    or a job without ``--tag-output``)."""

    def __init__(self):
        self.partial = {}  # (rank, stream): text of the line not yet ended

    def feed(self, raw):
        tags = list(_TAG.finditer(raw))
        if not tags:
            return [(None, raw.rstrip("\n"))] if raw.strip() else []
        out = []
        if raw[:tags[0].start()].strip():
            out.append((None, raw[:tags[0].start()]))
        for tag, after in zip(tags, tags[1:] + [None]):
            key = (int(tag.group(1)), tag.group(2))
            *ended, rest = (self.partial.pop(key, "") + raw[tag.end():after.start() if after else None]).split("\n")
            out += [(key[0], line) for line in ended]
            if rest:
                self.partial[key] = rest
        return out

    def flush(self):
        """The lines left without a newline at the end of the output."""
        out = [(key[0], text) for key, text in self.partial.items()]
        self.partial.clear()
        return out


def run_streamed(cmd, timeout=None, ranks=(0,), prefix="    rank {rank}| ", untagged="    | ", **popen_kwargs):
    """``subprocess.run(cmd, stdout=PIPE, stderr=STDOUT, text=True, timeout=timeout)`` that also prints, as they
    come, the output lines of the ranks in ``ranks`` after ``prefix``, and the untagged ones (the launcher's own, a
    job's without ``--tag-output``) after ``untagged``.  Returns the CompletedProcess with the whole output, as the
    launcher wrote it, in ``.stdout`` and every rank's lines, reassembled, in ``.lines`` ([(rank or None, text)]).
    On a timeout kills the launcher and raises TimeoutExpired, as subprocess.run does."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            bufsize=1, **popen_kwargs)
    raw, pairs, tagged = [], [], TaggedLines()

    def show(new):
        pairs.extend(new)
        for rank, text in new:
            if rank is None or rank in ranks:
                print((untagged if rank is None else prefix.format(rank=rank)) + text, flush=True)

    def pump():
        for line in proc.stdout:
            raw.append(line)
            show(tagged.feed(line))
        show(tagged.flush())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(5)
        raise subprocess.TimeoutExpired(cmd, timeout, output="".join(raw)) from None
    except BaseException:  # ^C: do not leave the job running
        proc.kill()
        proc.wait()
        raise
    reader.join(30)  # a rank's child may keep the pipe open after the launcher exits: do not hang on it
    done = subprocess.CompletedProcess(cmd, proc.returncode, "".join(raw), "")
    done.lines = pairs
    return done
