"""sync="auto"'s start (auto_policy.AutoPolicy, "Start"): it trains in the straggler candidate (ripples-smart) with
the straggler class in force, and the straggler's exit test (a rank's *median* iteration 1.25x typical) keeps it
there -- but only against evenness, until a straggler has been seen by the entry test.  Random slow device steps
move the job to eager-solo as soon as they are seen: in small windows some rank's median reads 1.3x typical by
chance (an unstored `random-gpu` run, DEBUG log: straggler, random, straggler, random, and the switch at step 80),
and a rank whose every step is a little slower (CPU contention) keeps that reading up.

The jobs: 4-8 ranks at their own pace in ripples-smart (each step also waits for a partner's), reports in bursts of
8 steps, the policy with its default settings; one rank's device steps ``slower`` times the others'.  Seeded, so
every run reads the same.
"""
import random
import statistics

from auto_sim import rank_steps, reported
from hetsync.coordinator.switchboard.auto_policy import AutoPolicy

START = "ripples-smart"


def _proposal(n, seed, slower, slow_share, seen_from_the_start=False, until=30.0):
    """(seconds, mode) of the policy's first proposal, or (None, None) in ``until`` s.  ``seen_from_the_start``:
    as if a straggler had been seen by the entry test (the exit test then holds the class, as it did at the start
    before)."""
    rng = random.Random(seed)
    lag = rng.randrange(n)
    steps = [rank_steps(rng, until, slower=slower if r == lag else 1.0, slow_share=slow_share) for r in range(n)]
    policy = AutoPolicy(n)
    for t, r, samples in reported(n, lambda r: steps[r]):
        for when, compute in samples:
            policy.add(r, when, compute)
        if seen_from_the_start and policy.state == "straggler":
            policy.straggler_seen = True
        proposal = policy.evaluate(t, START)
        if proposal is not None:
            return t, proposal[0]
    return None, None


def _jobs(slower, slow_share, seen_from_the_start=False):
    return [_proposal(n, seed, slower, slow_share, seen_from_the_start) for n in range(4, 9) for seed in range(20)]


def test_random_slow_steps_leave_the_start_as_soon_as_seen():
    """Even ranks, a quarter of steps 4x slow: all 100 jobs propose eager-solo, in 4.2 s at the median; held by
    the exit test from the start, as before, in 5.9 s (the 1.3x medians of small windows)."""
    now, before = _jobs(1.0, 0.25), _jobs(1.0, 0.25, seen_from_the_start=True)
    assert all(mode == "eager-solo" for _, mode in now), [j for j in now if j[1] != "eager-solo"][:3]
    assert all(mode == "eager-solo" for _, mode in before)
    fast, slow = statistics.median(t for t, _ in now), statistics.median(t for t, _ in before)
    assert fast < 4.5 and slow > fast + 1.0, (fast, slow)


def test_a_slightly_slower_rank_with_random_slow_steps_no_longer_holds_the_start():
    """One rank 1.35x slower in every step (over the 1.25x exit, under the 1.5x entry), the same random slow
    steps: 58 of 100 jobs propose eager-solo (the others see the rank cross the entry test by chance, and keep
    ripples-smart); held by the exit test from the start, none did."""
    now, before = _jobs(1.35, 0.25), _jobs(1.35, 0.25, seen_from_the_start=True)
    assert sum(mode == "eager-solo" for _, mode in now) >= 50, now
    assert {mode for _, mode in now} <= {"eager-solo", None}
    assert all(mode is None for _, mode in before), before


def test_without_random_slowdowns_the_start_still_holds_a_slightly_slower_rank_and_keeps_a_straggler():
    """Without random slow steps nothing moves the job: a rank 1.35x slower keeps ripples-smart (the start's exit
    test, not allreduce), and so does a rank 2x slower with random slow steps (a straggler by the entry test)."""
    assert all(mode is None for _, mode in _jobs(1.35, 0.0))
    assert all(mode is None for _, mode in _jobs(2.0, 0.25))
