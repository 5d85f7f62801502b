"""The training layer (hetsync/training/) as users meet it, one multi-process job per property, every mode in it:

* custom loops: Horovod's TF2 example step (its first-step broadcast inside the tf.function) under
  ``hetsync.job_steps``, with a slow rank, uneven shards and per-rank stops (tests/mpi/custom_loops.py);
* prompt ends: per-rank time budgets inside one 100,000-step epoch, every mode and auto (tests/mpi/long_epoch.py);
* real models and optimizers, three fits per mode: a lazily built Sequential with BatchNorm and Dropout (its Adam
  rebuilt by get_config/from_config), a functional model with an Embedding (sparse gradients), a legacy optimizer
  with momentum and Horovod's register_local_var, a subclassed model under mixed_float16 with LossScaleOptimizer
  on finite shards; each below a loss an untrained model cannot reach (tests/mpi/model_matrix.py).

Job epochs in ``fit`` are checked in test_dropin.py (Horovod's Keras example, every mode) and the Job Clock's rule
alone in test_job_clock.py.
"""
from conftest import assert_ok, mpi_env, run_mpi


def _run(script):
    proc = run_mpi(4, script, timeout=600, env=mpi_env(HETSYNC_TIMEOUT=60))
    assert_ok(proc, 4)
    assert "stall" not in proc.stdout.lower(), proc.stdout[-6000:]
    return proc


def test_horovod_tf2_loop_in_every_mode_with_a_slow_rank_uneven_shards_and_stops():
    """Horovod's TF2 loop under hetsync.job_steps in every mode (tests/mpi/custom_loops.py): step counts per mode,
    one model after finish(), and every mode's final loss within 2.5x allreduce's in the same job and under 1.0."""
    _run("tests/mpi/custom_loops.py")


def test_every_rank_leaves_a_100000_step_epoch_soon_after_the_last_stop():
    proc = _run("tests/mpi/long_epoch.py")
    assert proc.stdout.count("every rank left after") >= 10, proc.stdout[-4000:]


def test_real_models_and_optimizers_in_every_mode():
    _run("tests/mpi/model_matrix.py")
