"""sync="esync" option validation (no MPI: the options are checked before anything is set up)."""
import pytest
import tensorflow as tf

import hetsync


@pytest.mark.parametrize("options, needle", [
    ({"global_lr": 0}, "global_lr must be a number > 0"),
    ({"global_lr": True}, "global_lr must be a number > 0"),
    ({"epsilon": -0.1}, "epsilon must be a number >= 0"),
    ({"non_blocking": "yes"}, "non_blocking must be True or False"),
    ({"timeout": 0}, "timeout must be a number > 0"),
    ({"staleness": 2}, "unknown option(s) ['staleness'] for sync='esync'"),
])
def test_bad_options_raise_value_error_naming_them(options, needle):
    with pytest.raises(ValueError) as e:
        hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), sync="esync", **options)
    assert needle in str(e.value)
