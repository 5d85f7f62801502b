"""Per-rank CPU quotas on one host: a cgroup v1 ``cpu`` group per rank, ``cpu.cfs_quota_us`` = quota x period.

A quota of 0.09 lets the rank's threads run 9 ms of every 100 ms on the whole machine: a node about 5x slower than
one with 0.45, for TensorFlow's compute, Horovod's and hetsync's threads alike -- real heterogeneity, no sleep.
``None`` is no limit.  A :class:`Quotas` is made once per benchmark (root needed), changed between and during runs
(a shared node's quota moving mid-run), and removed at the end; benchmarks/in_cgroup.sh moves each rank into its
group before it execs the training script.
"""
import os
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

    def usage_s(self):
        """CPU seconds each rank's group has used (cpuacct, when mounted with cpu; else None per rank)."""
        out = []
        for r in range(self.ranks):
            path = os.path.join(self._group(r), "cpuacct.usage")
            out.append(int(open(path).read()) / 1e9 if os.path.exists(path) else None)
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


class Schedule(threading.Thread):
    """Applies ``changes`` -- (seconds after the zero, rank, quota) -- to ``quotas`` on the driver's clock while a job
    runs (a node whose share changes mid-run, transient slowdowns).  ``stop()`` ends it early.

    The zero is the job's launch, or with ``zero_file`` the moment that file appears: the training's start
    (benchmarks/keras_example.py ``--started-file``, written right after its common-start allreduce).  Counted from
    the launch, a change meant for mid-training lands wherever each mode's start-up left it (a fast mode had
    finished before a node's share changed at 30 s, a slow one met it in its first epoch).  The driver only sees
    the file appear: no clock of the job's is read."""

    POLL_S = 0.05

    def __init__(self, quotas, changes, zero_file=None):
        super().__init__(daemon=True)
        self.quotas, self.changes, self._halt = quotas, sorted(changes), threading.Event()
        self.zero_file = zero_file
        self.applied = []

    def _zero(self):
        """time.monotonic() of the zero, or None when stopped before it came."""
        while self.zero_file is not None and not os.path.exists(self.zero_file):
            if self._halt.wait(self.POLL_S):
                return None
        return time.monotonic()

    def run(self):
        began = self._zero()
        if began is None:
            return
        for at, rank, quota in self.changes:
            if self._halt.wait(max(0.0, at - (time.monotonic() - began))):
                return
            self.quotas.set_one(rank, quota)
            self.applied.append((round(time.monotonic() - began, 2), rank, quota))

    def stop(self):
        self._halt.set()
        self.join()
