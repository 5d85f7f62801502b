"""SlowdownCallback protocols (no processes needed: rank and size are given explicitly)."""
import numpy as np
import pytest

from hetsync.testing import PhasedSlowdownCallback, SlowdownCallback
from hetsync.training import rank_state


def delays(cb, steps):
    return [cb.delay_for_step(s) for s in range(steps)]


def test_deterministic_slows_only_the_given_ranks_by_factor_minus_one():
    slow = SlowdownCallback("deterministic", ranks=[3], factor=5, base_time=0.1, rank=3, size=4)
    fast = SlowdownCallback("deterministic", ranks=[3], factor=5, base_time=0.1, rank=1, size=4)
    assert delays(slow, 10) == pytest.approx([0.4] * 10)
    assert delays(fast, 10) == [0.0] * 10


def test_nothing_is_slowed_unless_ranks_are_named():
    """No default slows a rank: a SlowdownCallback without ``ranks`` (or ``factors``) sleeps on none of them."""
    for rank in range(4):
        assert delays(SlowdownCallback(factor=5, base_time=0.1, rank=rank, size=4), 10) == [0.0] * 10


def test_deterministic_measures_the_normal_time_before_slowing():
    cb = SlowdownCallback("deterministic", ranks=[0], factor=3, warmup=3, rank=0, size=2)
    assert cb.delay_for_step(0) == 0.0  # nothing measured yet
    cb._warm_times = [0.010, 0.030, 0.020]
    assert cb.delay_for_step(3) == pytest.approx(2 * 0.020)


def test_random_is_seeded_and_has_the_requested_probability():
    a = delays(SlowdownCallback("random", factor=6, base_time=1.0, seed=7, rank=2, size=8), 4000)
    b = delays(SlowdownCallback("random", factor=6, base_time=1.0, seed=7, rank=2, size=8), 4000)
    other = delays(SlowdownCallback("random", factor=6, base_time=1.0, seed=7, rank=3, size=8), 4000)
    assert a == b, "same seed and rank: same slow steps"
    assert a != other, "ranks draw independently"
    assert set(a) == {0.0, 5.0}
    assert np.mean(np.array(a) > 0) == pytest.approx(1 / 8, abs=0.02)  # default p = 1/n (Hop §7.3.1)


def test_random_one_slows_exactly_one_rank_per_step_the_same_on_every_rank():
    per_rank = [delays(SlowdownCallback("random-one", factor=2.5, base_time=1.0, seed=3, rank=r, size=8), 2000)
                for r in range(8)]
    per_step = np.array(per_rank).T
    assert np.all((per_step > 0).sum(axis=1) == 1), "one slowed rank per step"
    assert set(per_step.ravel()) == {0.0, 1.5}
    counts = (per_step > 0).sum(axis=0)
    assert counts.min() > 2000 / 8 * 0.7, counts  # every rank gets its turn


def test_imbalance_shifts_the_delays_across_ranks_each_step():
    size = 4
    cbs = [SlowdownCallback("imbalance", delay_range=(0.05, 0.4), rank=r, size=size) for r in range(size)]
    for step in range(6):
        row = [cb.delay_for_step(step) for cb in cbs]
        assert sorted(row) == pytest.approx(list(np.linspace(0.05, 0.4, size)))  # every delay used once
    assert cbs[0].delay_for_step(1) == pytest.approx(cbs[1].delay_for_step(0))  # shifted by one rank per step


@pytest.mark.parametrize("kwargs, word", [
    (dict(mode="fast"), "mode"),
    (dict(factor=0.5), "factor"),
    (dict(probability=1.5, mode="random"), "probability"),
    (dict(delay_range=(0.4, 0.1), mode="imbalance"), "delay_range"),
    (dict(ranks=[9]), "out of range"),
    (dict(base_time=-1), "base_time"),
])
def test_bad_arguments_name_the_problem(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SlowdownCallback(**{"rank": 0, "size": 4, **kwargs})


def test_phases_count_from_the_callbacks_first_fit_not_from_the_process_start(monkeypatch):
    """Earlier fits in the process (hetsync's step count at 100) do not move the phases: the slow phase starts
    50 steps into this callback's first fit, and a later fit goes on counting from that first one."""
    slow = SlowdownCallback("deterministic", ranks=[1], factor=5, base_time=0.1, rank=1, size=2)
    phased = PhasedSlowdownCallback([(50, None), (20, slow), (10, None)])
    monkeypatch.setitem(rank_state._PROCESS, "position", 100)
    phased.on_train_begin()
    seen = []
    for step in (100, 149, 150, 169, 170):
        rank_state._PROCESS["position"] = step
        seen.append(phased._current())
    assert seen == [None, None, slow, slow, None]
    rank_state._PROCESS["position"] = 160
    phased.on_train_begin()  # a second fit with the same callback: still counted from the first
    assert phased._current() is slow

