"""Where a rank's time goes, step by step: compute, waiting in hetsync, sync points (sync="auto" and the report).

hetsync/training/ times every train step.  *Compute* is from the step's start (an injected SlowdownCallback included: it
runs inside the step, as a slower GPU would) to the moment the gradients were ready, which the mode stamps in its
graph (SyncAlgorithm.mark_compute_done) just before its exchange; ESync reports its round's local iterations
itself, one sample per local iteration.  The rest of the step is *waiting in hetsync* (the exchange: Horovod's
allreduce, a P-Reduce, a queue Recv...), and so is the time in sync points and switches.  A mode that does not
stamp counts its whole step as compute.

For sync="auto" each sample also carries its step's *run-delay rate* (run_delay.py): seconds this rank's threads
were runnable but not running, summed over threads, per second of the step.  It tells a CPU-starved slow step (a
quota, a shared node) from one that waited off the CPU (a slower device).  It is read at the step's start and end
only when auto asks for it.
"""
import time

from hetsync.training.run_delay import RunDelayMeter

WARMUP_STEPS = 2  # steps after a mode starts whose samples the policy does not get (see StepClock.warm_up)


class StepClock:
    """Per-rank accumulators since the last ``take()``, and the samples the Switch Board has not had yet."""

    def __init__(self):
        self.samples = []       # (time.monotonic(), compute s per iteration, the step's run-delay rate or None)
        self.meter = None       # RunDelayMeter, made at the first run_delay()
        self._reset()
        self.total_steps = 0
        self.warmup = 0         # steps left whose samples are dropped

    def warm_up(self, steps=WARMUP_STEPS):
        """The next ``steps`` steps give sync="auto"'s policy no sample.  A mode's first step traces its train
        function (seconds) unless it was traced before, and its first runs set up the graph; such samples are not the
        worker's speed.  On a throttled node a handful of steps fill the policy's window, so one first-step sample
        per rank was enough to read as random slowdowns and switch a job away from a good mode."""
        self.warmup = steps

    def _reset(self):
        self.since = time.monotonic()
        self.steps = self.iterations = 0
        self.compute_s = self.step_s = self.sync_s = 0.0

    def run_delay(self):
        """This rank's run-delay seconds so far (cumulative; None where the kernel does not say)."""
        if self.meter is None:
            self.meter = RunDelayMeter()
        return self.meter.read()

    def close(self):
        if self.meter is not None:
            self.meter.close()

    def step(self, algorithm, wall_start, mono_start, mono_end, local_iterations, split=True, delay_start=None,
             own_work=False):
        """One train step that ran ``[mono_start, mono_end]`` (``wall_start``: the same instant, time.time()).
        ``split=False``: nobody reads compute apart from waiting in this fit (no sync="auto", no report), so the
        mode's stamp is not read: reading it is an eager op per step, about a quarter of a millisecond on a core.
        ``delay_start``: ``run_delay()`` at the step's start (None: the samples carry no run-delay).
        ``own_work``: the step shared the rank with work of hetsync's own (a new mode's step traced ahead of a
        switch, hetsync/trace_ahead.py), and gives the policy no sample: on a node with a CPU quota the trace's
        thread starves the step, whose sample then reads as a throttled node's: a `random-gpu` job (unstored) in which
        every rank traced ahead switched ripples-smart -> eager-solo -> ripples-smart -> eager-solo at steps 36, 60
        and 92, the way back on "47% of 15 slow iterations CPU-starved"."""
        elapsed = mono_end - mono_start
        delay_end = self.run_delay() if delay_start is not None else None
        rate = max(delay_end - delay_start, 0.0) / elapsed if delay_end is not None and elapsed > 0 else None
        each = None
        timing = algorithm.last_round_timing() if local_iterations else None
        if timing is not None:
            iterations, compute = timing
            each = algorithm.last_round_iterations()
        else:
            iterations, done = 1, algorithm.compute_done_time() if split else 0.0
            compute = done - wall_start if wall_start < done <= wall_start + elapsed + 1e-3 else elapsed
        compute = min(max(compute, 0.0), elapsed)
        self.steps += 1
        self.total_steps += 1
        self.iterations += iterations
        self.compute_s += compute
        self.step_s += elapsed
        if self.warmup > 0:
            self.warmup -= 1
        elif own_work:  # no sample (see the docstring)
            pass
        elif each and len(each) == iterations:  # one sample per local iteration (ESync), scaled as compute was
            total = sum(each)
            scale = compute / total if total > 0 else 0.0
            self.samples.extend((mono_end, c * scale, rate) for c in each)
        elif iterations:
            self.samples.append((mono_end, compute / iterations, rate))
        del self.samples[:-256]

    def sync(self, seconds):
        """Time in a sync point or a switch (waiting for the others there, averaging)."""
        self.sync_s += seconds

    def take_samples(self):
        out, self.samples = self.samples, []
        return out

    def take(self):
        """The accumulators since the last take (a dict), then starts over."""
        now = time.monotonic()
        wall = max(now - self.since, 1e-9)
        out = {"interval_s": wall, "steps": self.steps, "iterations": self.iterations,
               "compute_s": self.compute_s, "step_s": self.step_s, "sync_s": self.sync_s,
               "rate": self.iterations / wall,
               "compute_rate": self.iterations / self.compute_s if self.compute_s > 0 else 0.0,
               "wait_s": max(self.step_s - self.compute_s, 0.0) + self.sync_s}
        self._reset()
        return out
