"""The benchmark's per-run probe (benchmarks/quota.py): what a stored run says about the machine it ran on.

A rank's group that used more CPU than its quota shows throttled periods over the job and an idle group none; the
machine's busy seconds over a stretch hold what a process used in it.  These read real cgroups (root and the cgroup
v1 ``cpu`` controller, which the benchmarks need too)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import quota  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir(quota.CPU_ROOT),
                                reason="per-rank CPU quotas need root and the cgroup v1 cpu controller")

# Joins the group, then spins until it has used CPU_S of CPU there: more than its quota allows in one period,
# whatever the machine's pace
CPU_S = 0.03
_BURN = ("import sys, time\nopen(sys.argv[1] + '/cgroup.procs', 'w').write('0')\nbegan = time.process_time()\n"
         f"while time.process_time() - began < {CPU_S}:\n    pass\n")


def _burn_in(group):
    subprocess.run([sys.executable, "-c", _BURN, group], check=True, timeout=60)


@pytest.fixture
def quotas():
    q = quota.Quotas(2, name=f"hetsync-test-probe-{os.getpid()}")
    yield q
    q.remove()


def test_a_group_that_used_more_than_its_quota_shows_throttled_periods_and_an_idle_one_none(quotas):
    quotas.set([0.01, 0.01])  # 1 ms of every 100 ms: the spinner needs at least 30 periods
    before, machine_before = quotas.throttling(), quota.machine_cpu()
    _burn_in(quotas._group(0))
    change = quota.difference(quotas.throttling(), before)
    assert change[0]["throttled"] >= 10 and change[0]["periods"] >= change[0]["throttled"]
    assert change[0]["throttled_s"] > 0
    assert change[1]["throttled"] == 0 and change[1]["throttled_s"] == 0
    assert quota.difference(quota.machine_cpu(), machine_before)["busy"] >= CPU_S - 0.01  # ticks: 10 ms


def test_a_groups_measured_phase_is_a_fraction_of_the_period_and_group_0_is_the_zero(quotas):
    quotas.set([0.45, 0.09])
    phases = quotas.phases(seconds=0.3)
    assert phases[0] == 0.0 and 0.0 <= phases[1] < quota.PERIOD_US / 1e6
    assert open(os.path.join(quotas._group(1), "cpu.cfs_quota_us")).read().strip() == "9000"  # set back
