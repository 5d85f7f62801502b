"""Per-rank CPU quotas on one host: a cgroup v1 ``cpu`` group per rank, ``cpu.cfs_quota_us`` = quota x period.

A quota of 0.09 lets the rank's threads run 9 ms of every 100 ms on the whole machine: a node about 5x slower than
one with 0.45, for TensorFlow's compute, Horovod's and hetsync's threads alike -- real heterogeneity, no sleep.
``None`` is no limit.  A :class:`Quotas` is made once per benchmark (root needed), changed between and during runs
(a shared node's quota moving mid-run), and removed at the end; benchmarks/in_cgroup.sh moves each rank into its
group before it execs the training script.
"""
import json
import os
import subprocess
import sys
import threading
import time

CPU_ROOT = "/sys/fs/cgroup/cpu"
PERIOD_US = 100_000


class QuotaError(RuntimeError):
    """The machine cannot give ranks CPU quotas (no cgroup v1 cpu controller, or not root)."""


class Quotas:
    """One cgroup per rank under ``<CPU_ROOT>/<name>``: ``r0`` ... ``r<n-1>``."""

    def __init__(self, ranks, name="hetsync-bench", root=CPU_ROOT):
        if not os.path.isdir(root):
            raise QuotaError(f"{root} is not mounted: per-rank quotas need the cgroup v1 cpu controller")
        if os.geteuid() != 0:
            raise QuotaError("per-rank CPU quotas need root (cgroup directories under /sys/fs/cgroup/cpu)")
        self.path = os.path.join(root, name)
        self.ranks = int(ranks)
        for r in range(self.ranks):
            os.makedirs(self._group(r), exist_ok=True)
            self._write(r, "cpu.cfs_period_us", PERIOD_US)

    def _group(self, rank):
        return os.path.join(self.path, f"r{rank}")

    def _write(self, rank, knob, value):
        with open(os.path.join(self._group(rank), knob), "w") as f:
            f.write(f"{value}\n")

    def set(self, quotas):
        """``quotas[r]``: rank r's share of one core (``None``: unlimited)."""
        if len(quotas) != self.ranks:
            raise ValueError(f"{len(quotas)} quotas for {self.ranks} ranks")
        for r, q in enumerate(quotas):
            self.set_one(r, q)

    def set_one(self, rank, quota):
        if quota is not None and not 0.001 <= quota <= os.cpu_count():
            raise ValueError(f"rank {rank}: quota {quota} is not between 0.001 and {os.cpu_count()} cores")
        self._write(rank, "cpu.cfs_quota_us", -1 if quota is None else int(quota * PERIOD_US))

    def phases(self, seconds=0.6):
        """Each group's CFS period phase in seconds after group 0's, measured.  A group's phase is fixed for its life
        (idle gaps included) and differs between groups at random: not by when a group was made, its quota set or
        anything first ran in it (each tried, measured with this).  Plain Horovod's pace under quotas depends on
        the phases (docs/benchmarks.md, "Per-run probe"), so every repeat gets new groups and its records these
        phases.  A spinner in each group, at a quota of 2% for the while (so that no spinner waits for another's
        CPU, only for its period), notes when it resumes after a throttle.  The quotas are set back after."""
        quotas = [open(os.path.join(self._group(r), "cpu.cfs_quota_us")).read().strip() for r in range(self.ranks)]
        for r in range(self.ranks):
            self._write(r, "cpu.cfs_quota_us", PERIOD_US // 50)
        try:
            procs = [_spin_in(self._group(r), seconds) for r in range(self.ranks)]
            resumed = [json.loads(p.communicate()[0] or "null") for p in procs]
        finally:
            for r, quota in enumerate(quotas):
                self._write(r, "cpu.cfs_quota_us", quota)
        if resumed[0] is None:
            return [None] * self.ranks
        period = PERIOD_US / 1e6
        return [None if t is None else round((t - resumed[0]) % period, 4) for t in resumed]

    def throttling(self):
        """Each rank's group's ``cpu.stat`` counters now: scheduler periods, periods that throttled it, and seconds
        throttled (stored per run as the difference over the job: how much of its quota's windows a rank waited)."""
        out = []
        for r in range(self.ranks):
            stat = dict(line.split() for line in open(os.path.join(self._group(r), "cpu.stat")))
            out.append({"periods": int(stat["nr_periods"]), "throttled": int(stat["nr_throttled"]),
                        "throttled_s": int(stat["throttled_time"]) / 1e9})
        return out

    def remove(self):
        """Removes the groups (a group with processes left in it stays: a failed job's ranks are killed first)."""
        for r in range(self.ranks):
            try:
                os.rmdir(self._group(r))
            except OSError:
                pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass


_SPINNER = """
import sys, time
open(sys.argv[1] + "/cgroup.procs", "w").write("0")  # this process joins the group (its start-up ran outside)
end = time.monotonic() + float(sys.argv[2]); last = time.monotonic(); resumed = None
while last < end:
    now = time.monotonic()
    if now - last > 0.004:
        resumed = now
    last = now
print("null" if resumed is None else resumed)
"""


def _spin_in(group, seconds):
    """A process that joins ``group``, spins for ``seconds`` and prints the last time it resumed after a pause."""
    return subprocess.Popen([sys.executable, "-c", _SPINNER, group, str(seconds)], stdout=subprocess.PIPE,
                            text=True)


def machine_cpu():
    """The whole machine's CPU seconds so far from /proc/stat: ``busy`` (every process's, the job's and any other),
    ``idle`` and ``steal`` (taken by the hypervisor for other guests).  The difference over a job, set beside the
    ranks' own CPU, says whether anything else ran on the machine meanwhile."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return {"busy": (user + nice + system + irq + softirq) / tick, "idle": (idle + iowait) / tick,
            "steal": steal / tick}


def difference(after, before):
    """``after - before`` key by key, for the nested dicts and lists of :func:`machine_cpu` and
    :meth:`Quotas.throttling`, rounded to milliseconds."""
    if isinstance(after, dict):
        return {k: difference(after[k], before[k]) for k in after}
    if isinstance(after, list):
        return [difference(a, b) for a, b in zip(after, before)]
    return round(after - before, 3)


class Schedule(threading.Thread):
    """Applies ``changes`` -- (seconds after the zero, rank, quota) -- to ``quotas`` on the driver's clock while a job
    runs (a node whose share changes mid-run, transient slowdowns).  ``stop()`` ends it early.

    The zero is the job's launch, or with ``zero_file`` the moment that file appears: the training's start
    (benchmarks/keras_example.py ``--started-file``, written right after its common-start allreduce).  Counted from
    the launch, a change meant for mid-training lands wherever each mode's start-up left it (a fast mode had
    finished before a node's share changed at 30 s, a slow one met it in its first epoch).  The driver only sees
    the file appear: no clock of the job's is read.

    ``started_file`` (the same file; default ``zero_file``) is watched in any case: ``started_s`` is how many seconds
    after the launch (the thread's start) it appeared, None if it never did -- where a launch-timed change fell in
    the training (benchmarks/stored.py ``changed_share``)."""

    POLL_S = 0.05

    def __init__(self, quotas, changes, zero_file=None, started_file=None):
        super().__init__(daemon=True)
        self.quotas, self.changes, self._halt = quotas, sorted(changes), threading.Event()
        self.zero_file = zero_file
        self.started_file = started_file or zero_file
        self.applied = []
        self.started_s = None
        self._launched = None

    def _sight(self):
        """Notes when the start file appeared (polled: the driver's clock, to POLL_S)."""
        if self.started_s is None and self.started_file is not None and os.path.exists(self.started_file):
            self.started_s = round(time.monotonic() - self._launched, 2)

    def _wait_until(self, deadline):
        """Waits until ``deadline`` (time.monotonic()) watching for the start file; True when stopped first."""
        while True:
            self._sight()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            watching = self.started_s is None and self.started_file is not None
            if self._halt.wait(min(left, self.POLL_S) if watching else left):
                return True

    def _await_start(self):
        """Polls for the start file until it appears; False when stopped first."""
        while self.started_s is None:
            self._sight()
            if self.started_s is None and self._halt.wait(self.POLL_S):
                return False
        return True

    def run(self):
        self._launched = time.monotonic()
        if self.zero_file is not None and not self._await_start():
            return  # stopped before the training started: nothing applied
        began = time.monotonic()
        for at, rank, quota in self.changes:
            if self._wait_until(began + at):
                return
            self.quotas.set_one(rank, quota)
            self.applied.append((round(time.monotonic() - began, 2), rank, quota))
        if self.started_file is not None:
            self._await_start()  # a launch-timed schedule: when the training began, until the job ends

    def stop(self):
        self._halt.set()
        self.join()
