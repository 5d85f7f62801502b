"""Launching a benchmark job on this machine or on the emulated cluster (scripts/cluster.sh; README "Across hosts").

``launcher(np_, hosts)`` is the command prefix: Horovod's ``horovodrun`` on localhost when ``hosts`` is None,
else Open MPI across the cluster's hosts (``scripts/cluster.sh mpirun -H h1:2,h2:2``; horovodrun's own ssh checks
cannot reach the emulated hosts).  ``Cluster(...)`` brings a cluster up for a ``with`` block and always takes it
down.
"""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
# Open MPI forwards only OMPI_* variables to other hosts' ranks: the rest a job needs is named with -x
FORWARD = ("PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL", "TF_NUM_INTEROP_THREADS",
           "TF_NUM_INTRAOP_THREADS")


def launcher(np_, hosts=None, env=None):
    """The command prefix that starts ``np_`` ranks (rank 0's output tagged, as horovodrun tags it)."""
    if not hosts:
        return ["horovodrun", "--mpi", "-np", str(np_), "-H", f"localhost:{np_}"]
    env = os.environ if env is None else env
    cmd = [CLUSTER, "mpirun", "-H", hosts, "-np", str(np_), "--tag-output"]
    for name in sorted(set(FORWARD) | {k for k in env if k.startswith("HETSYNC_")}):
        if name in env:
            cmd += ["-x", name]
    return cmd


class Cluster:
    """``with Cluster(2, rate="1gbit", cpu=["h2=0.4"]):`` -- the emulated hosts for the block (root)."""

    def __init__(self, hosts, rate="1gbit", cpu=(), links=(), latency=None):
        self.args = ["up", str(hosts), "--rate", rate]
        for c in cpu:
            self.args += ["--cpu", c]
        for link in links:
            self.args += ["--link", link]
        if latency:
            self.args += ["--latency", latency]

    def describe(self):
        return " ".join(self.args[1:])

    def __enter__(self):
        up = subprocess.run([CLUSTER] + self.args, capture_output=True, text=True)
        if up.returncode != 0:
            raise RuntimeError(f"scripts/cluster.sh {' '.join(self.args)} failed (root, ip netns, tc and cgroups "
                               f"are needed):\n{up.stderr}")
        return self

    def __exit__(self, *exc):
        subprocess.run([CLUSTER, "down"], capture_output=True, text=True)
        return False
