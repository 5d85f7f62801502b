"""Live sync-mode switches and sync="auto" end to end (real horovodrun, TensorFlow, Horovod and gRPC), and the
heterogeneity report (README "Switching", "sync='auto'", "Heterogeneity report")."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, assert_ok, assert_passed, run_mpi


@pytest.fixture(scope="module")
def job(keras_job):
    """make test's three switching scripts run in conftest's ``keras_job`` (tests/mpi/together.py, sync="auto"'s
    second, after balanced's: its slowdown phases count from its own fit): the job's output and the auto run's log
    directory."""
    proc, base = keras_job
    return proc, base / "auto-logs"


@pytest.mark.parametrize("walk", ["cycle", pytest.param("pairs", marks=pytest.mark.full)])
def test_every_mode_switches_in_and_out_at_epoch_ends_and_mid_epoch(walk, request):
    """4 ranks, rank 3 5x slower: every registered mode is switched into and out of (``cycle``: a cycle through the
    modes, 21 switches; ``pairs``, make test-full: every ordered pair, 181 switches) at an epoch start (schedule) and
    again mid-epoch (requests from rotating ranks); right after each switch every rank holds the same model,
    iterations and slots; in allreduce, at every step; then esync -> od-sgd across the warm-up boundary with
    iterations equal at every step;
    concurrent requests give one switch; unknown mode / bad option raise on the requesting rank only; every rank
    switches at the same steps and ends with one model under the loss target (tests/mpi/keras_switch.py)."""
    if walk == "cycle":
        assert_passed(request.getfixturevalue("job")[0], "switch-cycle", 4)
        return
    proc = run_mpi(4, "tests/mpi/keras_switch.py", "all", walk, timeout=600)
    assert_ok(proc, 4)


def test_switches_lose_no_gradient_and_a_switch_failing_on_one_rank_is_refused_everywhere(job):
    """One-hot deposits (rank r's gradient is e_r), plain SGD, backward_passes_per_step=3, rank 3 3x slower: across
    every ordered pair of the sum-preserving modes, switched mid-epoch, the final model is exactly -lr x (gradients
    each rank applied) / P per coordinate -- eager-SGD's undelivered deposits and unreturned rounds and half-filled
    accumulators are applied once at the switch, never lost or carried; a mode whose checks fail on rank 2 only is
    refused on every rank, naming rank 2, and training goes on (tests/mpi/switch_conservation.py)."""
    assert_passed(job[0], "conservation", 4)


def test_a_request_whose_step_falls_past_the_fit_is_carried_out_in_the_next_fit(job):
    """Rank 0 asks for a switch after a fit's last batch: no rank switches in that fit, and every rank switches at
    one step of the process's next fit, ending with one model (tests/mpi/late_request.py)."""
    assert_passed(job[0], "late-request", 4)


def test_auto_follows_a_straggler_and_back_and_the_report_shows_it(job):
    """sync="auto" stays on allreduce while homogeneous, moves to esync when rank 3 becomes 5x slower and back
    when it recovers (tests/mpi/keras_auto.py); then `hetsync report` turns the run's records into a PNG and a
    Markdown summary naming both switches."""
    proc, logdir = job
    assert_passed(proc, "auto", 4)
    assert (logdir / "hetsync" / "rank0").is_dir()  # TensorBoard scalars beside the user's TensorBoard logs
    out = subprocess.run([sys.executable, "-m", "hetsync.cli", "report", str(logdir)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    md = (logdir / "hetsync_report.md").read_text()
    assert "| allreduce | esync | auto: straggler" in md and "| esync | allreduce | auto: homogeneous" in md, md
    assert (logdir / "hetsync_report.png").stat().st_size > 10_000
    for rank in range(4):
        assert f"| {rank} |" in md


def test_report_of_records_and_missing_logdir(tmp_path):
    """The report from hand-written records: per-worker rates and waits, switches with reasons; a directory
    without records is a clear error (exit code 2)."""
    from hetsync.report import write_report

    folder = tmp_path / "hetsync"
    folder.mkdir()
    for rank, speed in ((0, 10.0), (1, 2.0)):
        lines = []
        for i in range(1, 6):
            lines.append({"kind": "rate", "time": 100.0 + i, "rank": rank, "epoch": 0, "position": 10 * i,
                          "mode": "allreduce" if i < 3 else "hop", "interval_s": 1.0, "steps": 10,
                          "iterations": int(speed), "compute_s": 0.5, "step_s": 0.9, "sync_s": 0.1,
                          "rate": speed, "compute_rate": 2 * speed, "wait_s": 0.5, "idle": False, "loss": 1.0,
                          "metrics": {"queue_size": i}})
            if i == 2:
                lines.append({"kind": "switch", "id": 1, "from": "allreduce", "to": "hop", "options": {},
                              "reason": "requested", "position": 25, "time": 102.5, "seconds": 0.2})
        (folder / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    from hetsync.report import write_phases

    write_phases(str(tmp_path), [(10, 30, "rank 1 5x slower"), (30, 50, "random")])  # two adjacent hatched phases
    png, md = write_report(str(tmp_path))
    text = open(md).read()
    assert "| 0 | 50 | 10.0 | 20.0 | 2.5 s (50%) | hop |" in text, text
    assert "| 1 | 10 | 2.0 | 4.0 |" in text
    assert "| 1.5 | 25 | allreduce | hop | requested | 0.20 |" in text  # t0: the first record
    assert "queue_size=5" in text and os.path.getsize(png) > 10_000
    empty = subprocess.run([sys.executable, "-m", "hetsync.cli", "report", str(tmp_path / "nothing")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "no hetsync report records" in empty.stderr


def test_sync_mode_schedule_and_auto_settings_are_checked():
    from hetsync.callbacks import SyncModeCallback

    with pytest.raises(ValueError, match="unknown sync mode 'nope'"):
        SyncModeCallback(schedule={2: "nope"})
    with pytest.raises(ValueError, match="epochs"):
        SyncModeCallback(schedule={-1: "allreduce"})
    with pytest.raises(ValueError, match="unknown option"):
        SyncModeCallback(schedule={1: ("ripples-static", {"group": 3})})
    assert SyncModeCallback(schedule={3: ("esync", {"epsilon": 0.01})}).schedule == {3: ("esync", {"epsilon": 0.01})}
    # sync="auto"'s own settings are checked before anything starts (optimizer.auto_settings: no collective)
    from hetsync.optimizer import auto_settings

    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=r"option report_every=.* is invalid: expected an int >= 1"):
            auto_settings({"report_every": bad})
    with pytest.raises(ValueError, match="option pretrace='yes' .str. is invalid: expected True or False"):
        auto_settings({"pretrace": "yes"})
    with pytest.raises(ValueError, match="unknown option.*'windw'"):
        auto_settings({"windw": 3})
