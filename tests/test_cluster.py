"""Beyond one host: one job on an emulated cluster of 2 hosts x 2 ranks (scripts/cluster.sh: network namespaces,
their own host names, a bridge, 1 Gbit/s tbf links; host h2 throttled to 0.8 of a core by the cgroup cpu
controller -- really slower, no sleep).  tests/mpi/cluster_job.py passes through every sync mode by live
switches, with one rank stopping early; every rank must exit 0 with one model.  The cluster is taken down after
the test, also when it fails.  About 1-2 minutes on 2 cores (a job of 4 ranks, 9 modes traced on each).
"""
import os
import subprocess
import sys

import pytest
from conftest import MPI_ENV, ROOT, assert_ok, mpi_env

CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")


@pytest.fixture(scope="module")
def cluster():
    up = subprocess.run([CLUSTER, "up", "2", "--rate", "1gbit", "--cpu", "h2=0.8"], capture_output=True, text=True)
    assert up.returncode == 0, f"scripts/cluster.sh up failed (root, ip netns, tc and cgroups needed):\n{up.stderr}"
    yield
    down = subprocess.run([CLUSTER, "down"], capture_output=True, text=True)
    assert down.returncode == 0, down.stderr


def test_every_mode_across_two_hosts_with_a_slow_host_and_an_early_stop(cluster):
    """Every mode by live switches across 2 hosts: every rank exits 0 with one model, and that model learned (its
    test loss with BatchNorm on the test set's statistics under 0.8, an untrained model's about 2.5; see
    tests/mpi/cluster_job.py)."""
    env = mpi_env()
    # Open MPI forwards only OMPI_* variables to the other hosts' ranks: name the rest
    forward = sorted(set(MPI_ENV) - {k for k in MPI_ENV if k.startswith("OMPI_")}) + ["PYTHONPATH", "PATH"]
    cmd = [CLUSTER, "mpirun", "-H", "h1:2,h2:2", "-np", "4"]
    for name in forward:
        cmd += ["-x", name]
    cmd += [sys.executable, os.path.join(ROOT, "tests", "mpi", "cluster_job.py")]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode()
        pytest.fail(f"the 2-host job did not finish within 300 s:\n{out[-6000:]}")
    assert_ok(proc, 4)
    assert "on h1" in proc.stdout and "on h2" in proc.stdout, proc.stdout[-3000:]
