"""The benchmark's time-to-target definition (examples/benchmark.py): mean of each worker's latest local loss."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from benchmark import mean_loss_curve, time_to_target  # noqa: E402


def test_mean_of_latest_losses_and_first_time_below_target():
    curves = {  # rank: [(time, step, loss, accuracy)]
        0: [(0.0, 0, 2.0, 0.1), (1.0, 10, 0.5, 0.8), (2.0, 20, 0.2, 0.9)],
        1: [(0.0, 0, 2.0, 0.1), (3.0, 10, 0.4, 0.8)],
    }
    curve = mean_loss_curve(curves)
    assert curve[-1][0] == 3.0 and abs(curve[-1][1] - 0.3) < 1e-12
    # at t=2 rank 1 still shows its initial 2.0: the mean is 1.1, so a lagging worker delays the target
    assert dict(curve)[2.0] == 1.1
    assert time_to_target(curve, 0.35) == 3.0
    assert time_to_target(curve, 0.1) is None
