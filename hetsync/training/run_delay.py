"""How long this rank's threads were runnable but not running: the CPU-starvation signal of sync="auto".

A slow step has two kinds of cause.  Either the rank waited off the CPU (a slower or shared GPU, a longer input, an
injected sleep), or it wanted the CPU and did not get it (a CPU quota that throttled its cgroup, a node shared with
other jobs).  The compute samples look alike; the kernel tells them apart.  Linux counts, per thread, the time it
spent on a run queue waiting for a CPU, CFS throttling of its cgroup included (``/proc/<pid>/task/<tid>/schedstat``,
second field, nanoseconds).  A sleeping or blocked thread accumulates none.

The meter sums the increments over this process's threads.  It keeps each thread's file open (a read is then one
``pread``: about 0.1 ms for 30 threads, against 0.5 ms with an open per thread) and lists the threads on every read,
so threads that start are counted from their first reading and threads that end take nothing away.  Where the file
cannot be read (not Linux, a kernel without scheduler statistics) ``read()`` returns None and auto goes without it.
"""
import os

TASKS = "/proc/self/task"


class RunDelayMeter:
    """Cumulative run-delay seconds of this process's threads since the meter was made (``read()``)."""

    def __init__(self):
        self._files = {}      # tid -> open schedstat file
        self._last = {}       # tid -> its run-delay at the last read (ns)
        self._total_ns = 0
        self.available = os.path.isdir(TASKS)

    def read(self):
        """Seconds, growing only; None where the kernel does not say."""
        if not self.available:
            return None
        try:
            tids = os.listdir(TASKS)
        except OSError:
            self.available = False
            return None
        alive = set(tids)
        for tid in [t for t in self._files if t not in alive]:
            self._drop(tid)
        for tid in tids:
            value = self._value(tid)
            if value is None:
                continue
            if tid in self._last:
                self._total_ns += max(value - self._last[tid], 0)
            self._last[tid] = value
        if not self._last:
            self.available = False
            return None
        return self._total_ns / 1e9

    def _value(self, tid):
        f = self._files.get(tid)
        try:
            if f is None:
                f = self._files[tid] = open(f"{TASKS}/{tid}/schedstat", "rb", buffering=0)
            return int(os.pread(f.fileno(), 96, 0).split()[1])
        except (OSError, ValueError, IndexError):  # the thread ended in between, or no scheduler statistics
            self._drop(tid)
            return None

    def _drop(self, tid):
        f = self._files.pop(tid, None)
        self._last.pop(tid, None)
        if f is not None:
            f.close()

    def close(self):
        for tid in list(self._files):
            self._drop(tid)
