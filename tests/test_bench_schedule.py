"""The benchmark's quota changes (benchmarks/quota.py ``Schedule``): a scenario whose changes count from the
training's start applies none of them before the job says it started, and then each at its offset from there."""
import os
import sys
import threading
import time

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import quota  # noqa: E402
import run  # noqa: E402


class _Recorder:
    """Stands in for the cgroups (which need root): records each change and says when one came."""

    def __init__(self):
        self.changes, self.changed = [], threading.Event()

    def set_one(self, rank, value):
        self.changes.append((rank, value))
        self.changed.set()


def test_changes_wait_for_the_training_start(tmp_path):
    started = tmp_path / "started"
    quotas = _Recorder()
    schedule = quota.Schedule(quotas, [(0.0, 3, 0.09), (0.2, 3, 0.45)], zero_file=str(started))
    schedule.start()
    try:
        # A launch-relative schedule applies the first change at once; this one must wait however long it takes.
        assert not quotas.changed.wait(0.5), f"applied before the training started: {quotas.changes}"
        started.touch()
        assert quotas.changed.wait(30), "never applied after the start file appeared"
    finally:
        schedule.join(30)
        schedule.stop()
    assert quotas.changes == [(3, 0.09), (3, 0.45)]
    assert [rank for _, rank, _ in schedule.applied] == [3, 3]
    assert schedule.applied[1][0] >= 0.2, "the second change's offset counts from the start file"


def test_a_stopped_schedule_that_never_started_applies_nothing(tmp_path):
    quotas = _Recorder()
    schedule = quota.Schedule(quotas, [(0.0, 1, 0.09)], zero_file=str(tmp_path / "never"))
    schedule.start()
    schedule.stop()  # a job that failed before its training started
    assert not schedule.is_alive() and quotas.changes == []


def test_start_relative_scenarios_say_what_their_times_count_from():
    """A scenario with ``changes_from="start"`` must have changes to apply, inside a job's training."""
    relative = [name for name, spec in run.SCENARIOS.items() if spec.get("changes_from") == "start"]
    assert "shared-mid-run" in relative and "transient-mid-run" in relative
    for name in relative:
        spec = run.SCENARIOS[name]
        assert spec["changes"] and all(at >= 0 for at, _, _ in spec["changes"]), name
        assert "after training starts" in spec["what"], f"{name}'s description must say what its times count from"


def test_a_launch_timed_schedule_also_sees_when_the_training_started(tmp_path):
    """Changes counted from the launch go on without the start file; when it appears, ``started_s`` says how long
    after the launch (stored as ``training_start_s``: where the changes fell in the training)."""
    started = tmp_path / "started"
    quotas = _Recorder()
    schedule = quota.Schedule(quotas, [(0.0, 3, 0.09)], started_file=str(started))
    schedule.start()
    try:
        assert quotas.changed.wait(30), "a launch-timed change waited for the start file"
        time.sleep(0.3)
        assert schedule.started_s is None, "saw a start file that is not there"
        started.touch()
        deadline = time.monotonic() + 30
        while schedule.started_s is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        schedule.stop()
    assert not schedule.is_alive(), "stop() must end a schedule whose changes are all applied"
    assert schedule.started_s is not None and schedule.started_s >= 0.3, schedule.started_s
