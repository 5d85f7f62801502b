"""The CPU-starvation signal of sync="auto" against the real kernel (hetsync/training/run_delay.py).

A step that wanted the CPU and did not get it must show run-delay; a step that waited off the CPU (a sleep, as a
device wait is) must not.  The test makes its own starvation: this thread and two busy processes pinned to one
CPU, so this thread gets about a third of it whatever else the machine runs.  Nothing here depends on the
machine's load: more load on that CPU only adds run-delay to the busy step, and a sleeping thread has none.
"""
import os
import subprocess
import sys
import threading
import time

import pytest

from hetsync.training.run_delay import RunDelayMeter
from hetsync.training.step_clock import StepClock

BURN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"
STEP_S = 0.4


def _busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.fixture
def starved_cpu():
    """This thread and two CPU burners pinned to one CPU; the thread's affinity is restored afterwards."""
    if not RunDelayMeter().available:
        pytest.fail("no /proc/self/task: hetsync's run-delay needs Linux")
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    burners = [subprocess.Popen([sys.executable, "-c", BURN], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
               for _ in range(2)]
    os.sched_setaffinity(0, {cpu})  # this thread only (Linux: pid 0 is the calling thread)
    try:
        _busy(0.1)  # the burners are running by now
        yield
    finally:
        os.sched_setaffinity(0, before)
        for p in burners:
            p.kill()
            p.wait()


def _step(clock, work):
    start = clock.run_delay()
    began = time.monotonic()
    work(STEP_S)
    clock.step(None, time.time(), began, time.monotonic(), False, split=False, delay_start=start)
    (_, compute, rate), = clock.take_samples()
    return compute, rate


def test_a_cpu_starved_step_shows_run_delay_and_a_sleeping_one_does_not(starved_cpu):
    """Both steps last as long; only the busy one, sharing its CPU with two busy processes, was runnable without
    running (expected two thirds of it: a rate of 0.67 s per second).  The sleeping step, as long, must show almost
    none: were run-delay wall time, or CPU time, the two would not be told apart."""
    clock = StepClock()
    busy_compute, busy_rate = _step(clock, _busy)
    sleep_compute, sleep_rate = _step(clock, time.sleep)
    clock.close()
    assert busy_compute >= STEP_S and sleep_compute >= STEP_S
    assert busy_rate >= 0.3, (busy_rate, sleep_rate)
    assert sleep_rate <= 0.05 and sleep_rate < busy_rate / 5, (busy_rate, sleep_rate)


def test_threads_that_end_take_nothing_away(starved_cpu):
    """Run-delay is per thread: a thread that accrued some and ended leaves the sum where it was, not lower."""
    meter = RunDelayMeter()
    cpu = min(os.sched_getaffinity(0))

    def work():
        os.sched_setaffinity(0, {cpu})
        _busy(0.4)

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.05)
    first = meter.read()   # the thread's first reading: counted from here
    time.sleep(0.2)
    during = meter.read()
    t.join()
    after = meter.read()
    meter.close()
    assert during - first >= 0.05, (first, during)  # about two thirds of 0.2 s
    assert after >= during, (during, after)
