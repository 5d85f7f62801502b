"""sync="esync" and sync="od-sgd" option validation (no MPI: the options are checked before anything is set up)."""
import pytest

from hetsync import algorithms


@pytest.mark.parametrize("options, needle", [
    ({"global_lr": 0}, "option global_lr=0 (int) is invalid: expected a number > 0"),
    ({"global_lr": True}, "option global_lr=True (bool) is invalid: expected a number > 0"),
    ({"epsilon": -0.1}, "option epsilon=-0.1 (float) is invalid: expected a number >= 0"),
    ({"non_blocking": "yes"}, "option non_blocking='yes' (str) is invalid: expected True or False"),
    ({"on_ready": "discard"}, "option on_ready='discard' (str) is invalid: expected 'finish' or 'abort'"),
    ({"batch_data_test": 1}, "option batch_data_test=1 (int) is invalid: expected True or False"),
    ({"timeout": 0}, "option timeout=0 (int) is invalid: expected a number > 0 or None"),
    ({"staleness": 2}, "unknown option(s) ['staleness'] for sync='esync'"),
])
def test_esync_bad_options_raise_value_error_naming_them(options, needle):
    with pytest.raises(ValueError) as e:
        algorithms.create("esync", **options)  # what DistributedOptimizer does first (no Model.fit hook here)
    assert needle in str(e.value)


@pytest.mark.parametrize("options, needle", [
    ({"warmup_steps": -1}, "option warmup_steps=-1 (int) is invalid: expected an int >= 0"),
    ({"warmup_steps": 1.5}, "option warmup_steps=1.5 (float) is invalid: expected an int >= 0"),
    ({"local_updater": "adam"}, "option local_updater='adam' (str) is invalid: expected 'sgd' or 'dc-asgd-c' or 'dc-asgd-a' or 'optimizer'"),
    ({"local_updater": "optimizer", "local_lr": 0.1}, "local_lr set with local_updater='optimizer'"),
    ({"local_updater": "optimizer", "dc_lambda": 0.1}, "dc_lambda set with local_updater='optimizer'"),
    ({"local_lr": 0}, "option local_lr=0 (int) is invalid: expected a number > 0 or None"),
    ({"dc_lambda": -0.1}, "option dc_lambda=-0.1 (float) is invalid: expected a number >= 0"),
    ({"mean_square_decay": 1.0}, "option mean_square_decay=1.0 (float) is invalid: expected a number >= 0 and < 1"),
    ({"timeout": -2}, "option timeout=-2 (int) is invalid: expected a number > 0 or None"),
    ({"local_updaters": "sgd"}, "unknown option(s) ['local_updaters'] for sync='od-sgd'"),
])
def test_od_sgd_bad_options_raise_value_error_naming_them(options, needle):
    with pytest.raises(ValueError) as e:
        algorithms.create("od-sgd", **options)
    assert needle in str(e.value)
