"""The C++ engine and P-Reduce op under real mpirun jobs (4 ranks, real TensorFlow, Horovod and MPI; no mocks).

Each script combines several checks (see the scripts' docstrings); the 4-rank scripts run in one job, the 3-rank
ones in another (tests/mpi/together.py: each script starts and shuts down its own engine).
"""
import subprocess
import sys

import pytest

from conftest import ROOT, assert_ok, assert_passed, run_mpi, run_together


@pytest.fixture(scope="module", autouse=True)
def native_library():
    """(Re)builds hetsync/_lib/hetsync_ops.so incrementally, so the tests never run a stale library."""
    proc = subprocess.run(["make", "-C", "tf_ops", f"PYTHON={sys.executable}"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, f"make -C tf_ops failed:\n{proc.stdout[-6000:]}"


@pytest.fixture(scope="module")
def four(native_library):
    """The 4-rank scripts one after another in one job (tests/mpi/together.py); the dead-rank one runs last."""
    runs = [["basic", "tests/mpi/engine_basic.py"], ["failures", "tests/mpi/engine_failures.py"],
            ["away", "tests/mpi/engine_away.py"], ["partial-all", "tests/mpi/engine_partial_all.py"],
            ["partial", "tests/mpi/engine_partial.py"]]
    return run_together(4, runs, timeout=600)


@pytest.fixture(scope="module")
def three(native_library):
    """The 3-rank scripts (a world that is not a power of two) in one job."""
    return run_together(3, [["async", "tests/mpi/engine_async.py"],
                            ["partial-quick", "tests/mpi/engine_partial.py", "quick"]], timeout=480)


def test_preduce_groups_dtypes_shapes_cache_and_bad_input(four):
    assert_passed(four, "basic", 4)


def test_withdrawal_sessions_timeout_and_restart(four):
    assert_passed(four, "failures", 4)


def test_availability_exclusion_exclude_op_late_headers_and_fp16(four):
    assert_passed(four, "away", 4)


def test_partial_allreduce_solo_majority_persistent_mismatch_dead_rank(four):
    assert_passed(four, "partial", 4)


def test_partial_allreduce_non_power_of_two_world(three):
    assert_passed(three, "partial-quick", 3)


def test_hop_queues_standard_backup_staleness_skip_withdrawal_failures():
    proc = run_mpi(6, "tests/mpi/engine_hop.py", timeout=240)
    assert_ok(proc, 6)


def test_partial_allreduce_all_mode_waits_for_present_ranks_only(four):
    assert_passed(four, "partial-all", 4)


def test_non_blocking_allreduce_start_wait_overlap_and_silent_rank(three):
    assert_passed(three, "async", 3)
