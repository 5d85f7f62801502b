"""sync="esync" and sync="od-sgd" option validation (no MPI: the options are checked before anything is set up)."""
import pytest

from hetsync import algorithms


@pytest.mark.parametrize("options, needle", [
    ({"global_lr": 0}, "global_lr must be a number > 0"),
    ({"global_lr": True}, "global_lr must be a number > 0"),
    ({"epsilon": -0.1}, "epsilon must be a number >= 0"),
    ({"non_blocking": "yes"}, "non_blocking must be True or False"),
    ({"timeout": 0}, "timeout must be a number > 0"),
    ({"staleness": 2}, "unknown option(s) ['staleness'] for sync='esync'"),
])
def test_esync_bad_options_raise_value_error_naming_them(options, needle):
    with pytest.raises(ValueError) as e:
        algorithms.create("esync", **options)  # what DistributedOptimizer does first (no Model.fit hook here)
    assert needle in str(e.value)


@pytest.mark.parametrize("options, needle", [
    ({"warmup_steps": -1}, "warmup_steps must be an int >= 0"),
    ({"warmup_steps": 1.5}, "warmup_steps must be an int >= 0"),
    ({"local_updater": "adam"}, "local_updater must be one of sgd, dc-asgd-c, dc-asgd-a"),
    ({"local_lr": 0}, "local_lr must be a number > 0 or None"),
    ({"dc_lambda": -0.1}, "dc_lambda must be a number >= 0"),
    ({"mean_square_decay": 1.0}, "mean_square_decay must be in [0, 1)"),
    ({"timeout": -2}, "timeout must be a number > 0"),
    ({"local_updaters": "sgd"}, "unknown option(s) ['local_updaters'] for sync='od-sgd'"),
])
def test_od_sgd_bad_options_raise_value_error_naming_them(options, needle):
    with pytest.raises(ValueError) as e:
        algorithms.create("od-sgd", **options)
    assert needle in str(e.value)
