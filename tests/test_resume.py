"""Kill and resume in every mode (docs/resume.md), with real processes: tests/mpi/kill_resume.py on 2 ranks.

A job trains with Horovod's Keras recipe (``ModelCheckpoint`` of the whole model on rank 0) and its rank 1 is
SIGKILLed during epoch 3: the job must end by itself, non-zero, leaving no process behind, in every mode (each
leaves its own services behind: Ripples' Group Generator and P-Reduce, eager-SGD's partial collectives, Hop's
queues, ESync's State Server, OD-SGD's delayed allreduce, balanced's plan exchange).  Then one job restarts
every mode's script from its last checkpoint (Horovod's ``resume_from_epoch`` recipe, ``hetsync.load_model`` on
rank 0) and finishes to epoch 4, beside an uninterrupted 4-epoch run of the same seed and data order: a killed mode
from its killed job's checkpoint, any other from the uninterrupted run's epoch-2 checkpoint (the one a kill in
epoch 3 leaves last).  The same job restarts custom loops (``hetsync.job_steps``) from a ``tf.train.Checkpoint``,
and resumes jobs whose mode a live switch or a schedule had changed (tests/mpi/resume_mode.py).
"""
import re
import time

import pytest
from conftest import assert_passed, leftovers, run_mpi, run_together, tagged

from hetsync import algorithms
from hetsync.algorithms import available_modes

MODES = available_modes()
STEPS, SAVED_EPOCH, EPOCHS = 16, 2, 4  # tests/mpi/kill_resume.py
# Modes whose resumed run must repeat the uninterrupted one bit for bit on 2 ranks: synchronous and deterministic
# (OD-SGD resumes past its 20-step warm-up: every epoch end completes its delayed allreduce, so the checkpoint holds
# its global weights with nothing in flight, docs/resume.md)
DETERMINISTIC = ("allreduce", "od-sgd")
LOOP_MODES = ("allreduce", "ripples-smart")  # lockstep; P-Reduce, own pace
LOSS_RATIO = 1.5  # the resumed run's loss over the digits against the uninterrupted run's, at most (see the test)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """The checkpoints' directory and {mode: (job, seconds from rank 1's death to the job's end, processes left)},
    filled by the kill tests that ran."""
    return tmp_path_factory.mktemp("kill_resume"), {}


@pytest.mark.parametrize("mode", MODES)
def test_a_killed_rank_ends_the_job_by_itself_and_leaves_nothing(mode, killed):
    """SIGKILL of rank 1 during epoch 3, after rank 0 saved epoch 2: the launcher ends the job, non-zero, within
    seconds, and no process of it is left."""
    where, jobs = killed
    proc = run_mpi(2, "tests/mpi/kill_resume.py", "first", where, mode, timeout=180)
    ended = time.time()
    died = re.search(r"KILLED rank=1 at ([0-9.]+)", proc.stdout)
    after_death, left = ended - float(died.group(1)) if died else None, leftovers(str(where))
    jobs[mode] = after_death
    tail = proc.stdout[-4000:]
    assert after_death is not None, f"rank 1 was never killed (the job exited {proc.returncode}):\n{tail}"
    assert proc.returncode != 0, tail
    assert "Traceback" not in proc.stdout and "outlived" not in proc.stdout, tail
    assert not left, f"processes left behind: {left}"
    # timing property, bounded generously: measured 1.1 s in every mode; 30 s is far below HETSYNC_TIMEOUT-style
    # waits (a rank waiting for the dead one to come back would hang until mpirun's own timeout, 180 s here)
    assert after_death < 30, f"the job ended {after_death:.1f} s after rank 1 died"


@pytest.fixture(scope="module")
def restarted(killed):
    """One job restarting every mode's script from its checkpoint (a mode whose kill test ran: its killed job's;
    a mode whose kill test was deselected: the uninterrupted run's epoch-2 checkpoint),
    then the custom loops' restore; and the modes resumed from a killed job."""
    where, jobs = killed
    died = sorted(m for m, after_death in jobs.items() if after_death is not None)
    proc = run_together(2, [["resume", "tests/mpi/kill_resume.py", "resume", where, ",".join(MODES), ",".join(died)],
                            ["loop", "tests/mpi/loop_resume.py", ",".join(LOOP_MODES)],
                            ["mode", "tests/mpi/resume_mode.py", where]], timeout=600)
    return proc, died


def test_every_mode_resumes_from_its_checkpoint_and_loses_nothing(restarted):
    """Per mode: resumed from epoch 2, the last epoch saved before the kill; rank 0's loaded optimizer has bit for
    bit the ``iterations``, slots and weights it saved, and every rank's first resumed step begins from those
    weights (asserted in the script); the step counts go on from the saved one.  Against the uninterrupted run of
    the same seed and data order: bit-identical in the deterministic modes.  In the others the two runs differ by
    the mode's own nondeterminism (which rank contributes to which exchange depends on timing), so their loss over
    the digits is bounded instead: at most 1.5 times the uninterrupted run's.  Measured with this script's runs in
    2-rank jobs (27 pairs: eager-solo, eager-majority, ripples-smart, ripples-random, hop, esync, balanced), the
    resumed run's loss was 0.92 to 1.17 times the uninterrupted run's (0.24 to 0.30), while a resume that lost its
    training -- the same two epochs from fresh weights -- ended at 2.05 to 2.59 times (0.50 to 0.69).  Accuracy told
    them apart less well (42 pairs: the resumed run -2.3 to +1.1 points from the uninterrupted one, once -3.6 in a
    suite run; a lost resume only 2.6 to 9.9 points below): a bound on it was either loose or flaky.  The state
    itself is caught bit for bit above."""
    proc, died = restarted
    assert_passed(proc, "resume", 2)
    results = {r["mode"]: r for r in tagged(proc.stdout, "RESULT")}
    assert sorted(results) == sorted(MODES), sorted(results)
    for mode, r in results.items():
        print(f"{mode}: resumed loss {r['resumed_loss']:.4f} accuracy {r['resumed']:.4f}, uninterrupted loss "
              f"{r['straight_loss']:.4f} accuracy {r['straight']:.4f}, steps {r['iterations']}")
        if algorithms._REGISTRY[mode].STEPPING == "lockstep":  # Horovod's count: 16 steps per epoch on every rank
            assert r["saved_iterations"] == SAVED_EPOCH * STEPS, r
            assert r["iterations"] == [r["saved_iterations"] + (EPOCHS - SAVED_EPOCH) * STEPS] * 2, r
        else:  # rank 0's share of the job's steps was saved; on from it (the broadcast gave it to every rank)
            assert r["saved_iterations"] > 0 and min(r["iterations"]) > r["saved_iterations"], r
        assert r["from"] == ("killed" if mode in died else "uninterrupted"), r
        if mode in DETERMINISTIC:
            assert r["resumed_weights"] == r["straight_weights"], r
        assert r["resumed_loss"] <= LOSS_RATIO * r["straight_loss"], r


def test_a_custom_loop_resumes_from_a_tf_train_checkpoint(restarted):
    """``hetsync.job_steps`` loops (Horovod's TF2 loop shape) restarted from ``tf.train.Checkpoint(model, optimizer)``
    restored on every rank: the saved weights, ``iterations`` and slots bit for bit after the restore, the step count
    on from the saved one, one model at the end; allreduce bit-identical to the uninterrupted loops
    (tests/mpi/loop_resume.py)."""
    proc, _ = restarted
    assert_passed(proc, "loop", 2)
    results = {r["mode"]: r for r in tagged(proc.stdout, "LOOP")}
    assert sorted(results) == sorted(LOOP_MODES), sorted(results)
    for mode, r in results.items():
        assert min(r["iterations"]) > r["saved_iterations"], r
        if mode in DETERMINISTIC:
            assert r["resumed_weights"] == r["straight_weights"], r


def test_a_restart_resumes_in_the_mode_a_switch_or_the_schedule_had_put_in_force(restarted):
    """tests/mpi/resume_mode.py: a checkpoint written after a flag switch (allreduce -> ripples-smart) records
    ripples-smart, and the restarted script (its line still says allreduce, rank 0 loads with ``hetsync.load_model``)
    trains its first step in ripples-smart on every rank, after one switch made for the resume; a restarted script
    whose schedule had switched at epoch 1 starts at epoch 2 in the scheduled mode; and a flag switch made in that
    fit holds in the same process's next fit, where the schedule's epoch-1 entry is not applied again."""
    proc, _ = restarted
    assert_passed(proc, "mode", 2)
    rows = {r["rank"]: r for r in tagged(proc.stdout, "MODE")}
    assert sorted(rows) == [0, 1], proc.stdout[-3000:]
    assert rows[0]["saved"] == ["ripples-smart", {}], rows[0]
    for rank, r in rows.items():
        assert r["before"]["first"] == "allreduce" and r["before"]["last"] == "ripples-smart", r
        assert [to for to, _ in r["before"]["switches"]] == ["ripples-smart"], r
        assert r["resumed"]["first"] == "ripples-smart", r
        assert [to for to, _ in r["resumed"]["switches"]] == ["ripples-smart"], r
        assert r["resumed"]["switches"][0][1].startswith("resumed"), r
        assert r["scheduled"]["first"] == "eager-solo", r
        assert r["scheduled"]["switches"][0] == ["eager-solo", "schedule: epoch 1 (the fit starts at epoch 2)"], r
        assert r["scheduled"]["last"] == "allreduce", r
        assert r["next_fit"]["first"] == "allreduce", r
        assert [to for to, _ in r["next_fit"]["switches"]] == ["eager-solo", "allreduce"], r


def test_tagged_lines_are_read_whatever_another_rank_printed_beside_them():
    """The suite once failed on ``MODE {...}PASSED mode rank=0``: mpirun had put rank 0's line between rank 1's text
    and its newline.  Tagged objects are read up to their own end, with another rank's text before or after."""
    out = ('MODE {"rank": 1, "a": [1, "}"]}PASSED mode rank=0\n'
           'PASSED mode rank=1MODE {"rank": 0}\n')
    assert tagged(out, "MODE") == [{"rank": 1, "a": [1, "}"]}, {"rank": 0}]
