"""The C++ engine and P-Reduce op under real mpirun jobs (4 ranks, real TensorFlow, Horovod and MPI; no mocks).

Each launch combines several checks (see the scripts' docstrings) to keep the whole file near 2 minutes on 2 cores.
"""
import subprocess
import sys

import pytest

from conftest import ROOT, assert_ok, run_mpi


@pytest.fixture(scope="module", autouse=True)
def native_library():
    """(Re)builds hetsync/_lib/hetsync_ops.so incrementally, so the tests never run a stale library."""
    proc = subprocess.run(["make", "-C", "tf_ops", f"PYTHON={sys.executable}"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, f"make -C tf_ops failed:\n{proc.stdout[-6000:]}"


def test_preduce_groups_dtypes_shapes_cache_and_bad_input():
    proc = run_mpi(4, "tests/mpi/engine_basic.py", timeout=180)
    assert_ok(proc, 4)


def test_withdrawal_sessions_timeout_and_restart():
    proc = run_mpi(4, "tests/mpi/engine_failures.py", timeout=180)
    assert_ok(proc, 4)


def test_availability_exclusion_exclude_op_late_headers_and_fp16():
    proc = run_mpi(4, "tests/mpi/engine_away.py", timeout=180)
    assert_ok(proc, 4)


def test_partial_allreduce_solo_majority_persistent_mismatch_dead_rank():
    proc = run_mpi(4, "tests/mpi/engine_partial.py", timeout=240)
    assert_ok(proc, 4)


def test_partial_allreduce_non_power_of_two_world():
    proc = run_mpi(3, "tests/mpi/engine_partial.py", "quick", timeout=240)
    assert_ok(proc, 3)


def test_hop_queues_standard_backup_staleness_skip_withdrawal_failures():
    proc = run_mpi(6, "tests/mpi/engine_hop.py", timeout=240)
    assert_ok(proc, 6)


def test_partial_allreduce_all_mode_waits_for_present_ranks_only():
    proc = run_mpi(4, "tests/mpi/engine_partial_all.py", timeout=180)
    assert_ok(proc, 4)


def test_non_blocking_allreduce_start_wait_overlap_and_silent_rank():
    proc = run_mpi(3, "tests/mpi/engine_async.py", timeout=120)
    assert_ok(proc, 3)
