"""Heterogeneity injection, following the papers' own protocols so benchmarks compare with their figures.

Four modes, all seeded and all per step (under hetsync the sleep runs inside the train step, as a slower GPU's
compute would, before the step's synchronization; on a plain Horovod model, in ``on_train_batch_begin``):

* ``deterministic`` (Ripples §7.4): the given ``ranks`` are ``factor`` times slower: each of their batches sleeps
  (factor - 1) x the normal iteration time.  ``factors`` (one per rank, e.g. ESync's capacities 1:2:3:5) gives every
  rank its own factor instead.  (The paper's text says "adding 2 or 5 times the normal iteration time
  of sleep"; we follow the issue's reading that "5x slower" means a 5x longer step, i.e. a sleep of 4 normal steps.)
* ``random`` (Hop §7.3.1): each rank, independently at each batch, is ``factor`` times slower with probability
  ``probability`` (default 1/n, n = workers).
* ``random-one`` (eager-SGD §6.2.1): at each batch ONE rank, drawn by an RNG every rank seeds alike, is ``factor``
  times slower (the paper delays one random process per step by 200/300/400 ms, i.e. factor 2, 2.5, 3 of its step).
* ``imbalance`` (eager-SGD §6.2.3): every rank sleeps a delay from ``delay_range`` (seconds; n values spread evenly
  over the range), and the assignment of delays to ranks shifts by one rank after each step.

A local iteration that computes a share ``work`` of one batch (sync="balanced"'s micro-batches) sleeps ``work`` x
the delay: an emulated slower GPU is slower per sample.  (Real GPUs are not quite linear at small batches; the
README's balanced benchmark says so.)

The normal iteration time is ``base_time`` when given (benchmarks pass it so every mode sleeps the same), otherwise
the median of this rank's first ``warmup`` batch times, measured before any sleep is injected.
"""
import time

import numpy as np

from hetsync import training
from hetsync.training.hooks import TrainStepCallback

MODES = ("deterministic", "random", "random-one", "imbalance")


class _PerIteration(TrainStepCallback):
    """Acts once per local iteration.  Under hetsync's fit the training layer calls ``on_local_iteration_begin``/
    ``_end`` inside the train step -- once per Keras step, or per local iteration in modes that take several per
    step (ESync) -- so the delay counts as the step's compute (hetsync.training.hooks.TrainStepCallback).  Without
    it (a plain Horovod model) they run around each Keras batch."""

    def on_train_batch_begin(self, batch, logs=None):
        if not self.per_local_iteration:
            self.on_local_iteration_begin()

    def on_train_batch_end(self, batch, logs=None):
        if not self.per_local_iteration:
            self.on_local_iteration_end()

    def on_local_iteration_begin(self, work=1.0):
        """``work``: the share of one of this rank's batches the iteration computes (sync="balanced" gives a
        rank micro-batches of other sizes: an emulated compute time scales with the samples, as a GPU's would)."""

    def on_local_iteration_end(self):
        pass


def _rank_size():
    import horovod.tensorflow as hvd

    return hvd.rank(), hvd.size()


class SlowdownCallback(_PerIteration):
    """Makes some workers slower, per batch, the way the papers do.  See the module docstring for the modes.

    ``"deterministic"`` slows the ``ranks`` it is given (none by default) or every rank by its entry of ``factors``.
    """

    def __init__(self, mode="deterministic", ranks=(), factor=5.0, probability=None, delay_range=(0.05, 0.4),
                 base_time=None, warmup=5, seed=0, rank=None, size=None, factors=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"unknown SlowdownCallback mode {mode!r}; valid modes: {', '.join(MODES)}")
        if factor < 1:
            raise ValueError(f"factor must be >= 1 (1 = not slowed), got {factor}")
        if probability is not None and not 0 <= probability <= 1:
            raise ValueError(f"probability must be in [0, 1], got {probability}")
        lo, hi = delay_range
        if not 0 <= lo <= hi:
            raise ValueError(f"delay_range must be (low, high) seconds with 0 <= low <= high, got {delay_range}")
        if base_time is not None and base_time <= 0:
            raise ValueError(f"base_time must be > 0 seconds, got {base_time}")
        if rank is None or size is None:
            rank, size = _rank_size()
        bad = [r for r in ranks if not 0 <= r < size]
        if bad:
            raise ValueError(f"SlowdownCallback ranks {bad} out of range for {size} workers")
        if factors is not None:
            if mode != "deterministic" or len(factors) != size or min(factors) < 1:
                raise ValueError(f"factors needs mode 'deterministic' and one factor >= 1 per rank ({size}), "
                                 f"got {list(factors)} with mode {mode!r}")
            ranks, factor = range(size), float(factors[rank])
        self.mode, self.ranks, self.factor = mode, set(ranks), float(factor)
        self.probability = 1.0 / size if probability is None else probability
        self.delays = np.linspace(lo, hi, size)
        self.base_time, self.warmup = base_time, warmup
        self.rank, self.size = rank, size
        self._rng = np.random.default_rng([seed, rank])
        self._shared_rng = np.random.default_rng([seed, 1 << 20])  # the same draws on every rank (random-one)
        self._step = 0
        self._warm_times = []
        self._batch_start = None
        self._work = 1.0
        self.slept = 0.0
        self.per_local_iteration = False  # set by hetsync's fit hook (see on_local_iteration_begin)

    def delay_for_step(self, step):
        """Seconds this rank sleeps at ``step`` (0 while the normal iteration time is still being measured)."""
        if self.mode == "imbalance":
            return float(self.delays[(self.rank + step) % self.size])
        # drawn every step, warm-up included, so the shared sequence stays aligned across ranks
        chosen = int(self._shared_rng.integers(self.size)) if self.mode == "random-one" else None
        normal = self.normal_time()
        if normal is None:
            return 0.0
        if self.mode == "deterministic":
            slowed = self.rank in self.ranks
        elif self.mode == "random-one":
            slowed = chosen == self.rank
        else:
            slowed = self._rng.random() < self.probability
        return (self.factor - 1.0) * normal if slowed else 0.0

    def normal_time(self):
        if self.base_time is not None:
            return self.base_time
        if len(self._warm_times) < self.warmup:
            return None
        return float(np.median(self._warm_times))

    def on_local_iteration_begin(self, work=1.0):
        """Before one local iteration (see _PerIteration: inside the train step under hetsync)."""
        delay = self.delay_for_step(self._step) * work
        self._work = work
        if delay > 0:
            time.sleep(delay)
            self.slept += delay
        self._batch_start = time.perf_counter()

    def on_local_iteration_end(self):
        if self.base_time is None and len(self._warm_times) < self.warmup and self._batch_start is not None:
            self._warm_times.append((time.perf_counter() - self._batch_start) / max(self._work, 1e-6))
        self._step += 1


class EmulatedComputeCallback(_PerIteration):
    """Adds a fixed sleep to every step of every worker, standing for model compute the machine does not have.

    Benchmarks use it so that 8 workers fit on 2 CPU cores: most of a step is this sleep, so ranks do not fight for
    cores, while the real model's forward/backward still runs in the step.  Its time counts as compute, so a
    SlowdownCallback's ``base_time`` should include it.
    """

    def __init__(self, seconds):
        super().__init__()
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self.seconds = seconds
        self.per_local_iteration = False  # set by hetsync's fit hook (see SlowdownCallback.on_local_iteration_begin)

    def on_local_iteration_begin(self, work=1.0):
        if self.seconds:
            time.sleep(self.seconds * work)


class PhasedSlowdownCallback(_PerIteration):
    """A heterogeneity that changes during the job: ``phases`` = [(steps, SlowdownCallback or None), ...].

    Phase i lasts ``steps`` Keras steps of the job (hetsync's step count, the same on every rank), counted from the
    first ``fit`` this callback is in (a process's earlier fits do not move its phases), or with ``unit="seconds"``
    that many seconds since this rank's first such ``fit`` began (the environment changes in time, whatever the
    method does); the last phase lasts to the end.  None is a homogeneous phase.  Each SlowdownCallback keeps its own
    RNG and step count.  ``phase_at(x)`` says which phase a step (or second) is in.
    """

    def __init__(self, phases, unit="steps"):
        super().__init__()
        if unit not in ("steps", "seconds"):
            raise ValueError(f"unit must be 'steps' or 'seconds', got {unit!r}")
        if not phases:
            raise ValueError("phases must be a non-empty list of (length, SlowdownCallback or None)")
        for length, slowdown in phases:
            if not isinstance(length, (int, float)) or isinstance(length, bool) or length <= 0 \
                    or not (slowdown is None or isinstance(slowdown, SlowdownCallback)):
                raise ValueError(f"each phase is (length > 0, SlowdownCallback or None), got {(length, slowdown)!r}")
        self.phases, self.unit = list(phases), unit
        self._began = self._first_step = None
        self.per_local_iteration = False
        self._active = None
        self.slept = 0.0

    def phase_at(self, step):
        end = 0
        for i, (steps, _) in enumerate(self.phases):
            end += steps
            if step < end:
                return i
        return len(self.phases) - 1

    def on_train_begin(self, logs=None):
        if self._began is None:
            self._began, self._first_step = time.monotonic(), training.position()

    def _current(self):
        if self.unit == "seconds":
            return self.phases[self.phase_at(time.monotonic() - (self._began or time.monotonic()))][1]
        return self.phases[self.phase_at(training.position() - (self._first_step or 0))][1]

    def on_local_iteration_begin(self, work=1.0):
        self._active = self._current()
        if self._active is not None:
            before = self._active.slept
            self._active.on_local_iteration_begin(work)
            self.slept += self._active.slept - before

    def on_local_iteration_end(self):
        if self._active is not None:
            self._active.on_local_iteration_end()
