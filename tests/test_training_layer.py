"""The training layer (hetsync/training/) as users meet it, in one multi-process job (six scripts in turn):

* front doors: plain ``model.fit`` of a hetsync model refused, ``hetsync.keras.fit`` beside a plain Horovod model
  (tests/mpi/front_doors.py); a bare custom loop in every mode: trains (allreduce, od-sgd) or is refused on every
  rank at its first step (tests/mpi/bare_loops.py);
* custom loops: Horovod's TF2 example step (its first-step broadcast inside the tf.function) under
  ``hetsync.job_steps``, with a slow rank, uneven shards and per-rank stops (tests/mpi/custom_loops.py);
* prompt ends: per-rank time budgets inside one 100,000-step epoch, every mode and auto (tests/mpi/long_epoch.py);
  the epoch-end stop vote, not held at a fit's last epoch, and the one initial broadcast (tests/mpi/stop_votes.py);
* real models and optimizers, one fit per mode (tests/mpi/model_matrix.py's quick variant): under mixed_float16 a
  subclassed model with Conv2D, BatchNorm, Dropout and an Embedding (sparse gradients), a legacy SGD with momentum
  inside a LossScaleOptimizer rebuilt by get_config/from_config, Horovod's register_local_var, finite shards; below
  a loss an untrained model cannot reach.  `make test-full` adds the two separate fits per mode of the long variant
  (a new optimizer, Adam, under loss scaling among them) in a job of its own.

Job epochs in ``fit`` are checked in test_dropin.py (Horovod's Keras example, every mode) and the Job Clock's rule
alone in test_job_clock.py.
"""
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_passed, mpi_env, run_together

from hetsync.algorithms import available_modes
from hetsync.training import initial_state, options


@pytest.fixture(scope="module")
def job():
    """The six scripts one after another in one 4-rank job (tests/mpi/together.py).  The custom loops run last:
    after them, a later script's fit hangs past its agreed stop (a known fault of a second hetsync.init() in one
    process after job_steps with per-rank stops, docs/limitations.md)."""
    runs = [["front-doors", "tests/mpi/front_doors.py"], ["bare-loops", "tests/mpi/bare_loops.py"],
            ["long-epoch", "tests/mpi/long_epoch.py"],
            ["model-matrix", "tests/mpi/model_matrix.py", "quick"], ["stop-votes", "tests/mpi/stop_votes.py"],
            ["custom-loops", "tests/mpi/custom_loops.py"]]
    proc = run_together(4, runs, timeout=1200, env=mpi_env(HETSYNC_TIMEOUT=60))
    assert "stall" not in proc.stdout.lower(), proc.stdout[-6000:]
    return proc


def test_plain_fit_of_a_hetsync_model_is_refused_and_a_plain_horovod_model_trains_beside_it(job):
    """Plain model.fit of a hetsync model: a ValueError naming hetsync.keras.fit on every rank, before and after a
    hetsync.keras.fit that trains it; a Horovod model in the same process trains with its own model.fit, and
    nothing of Keras is replaced (tests/mpi/front_doors.py)."""
    assert_passed(job, "front-doors", 4)


def test_a_bare_custom_loop_trains_in_the_lockstep_modes_and_is_refused_in_every_other(job):
    """Horovod's TF2 step over the dataset itself, without hetsync.job_steps (tests/mpi/bare_loops.py): allreduce
    and od-sgd (warm-up) allreduce each step's gradients in apply_gradients -- the same model on every rank after
    every step, the loss down -- and every other mode raises on every rank at the first step, naming the door."""
    assert_passed(job, "bare-loops", 4)
    assert job.stdout.count("bare-loops: bare loop in ") == 11, job.stdout[-4000:]


def test_horovod_tf2_loop_in_every_mode_with_a_slow_rank_uneven_shards_and_stops(job):
    """Horovod's TF2 loop under hetsync.job_steps in every mode (tests/mpi/custom_loops.py): step counts per mode,
    one model after finish(), and every mode's final loss within 2.5x allreduce's in the same job and under 1.0."""
    assert_passed(job, "custom-loops", 4)


def test_every_rank_leaves_a_100000_step_epoch_soon_after_the_last_stop(job):
    assert_passed(job, "long-epoch", 4)
    assert job.stdout.count("every rank left after") >= 10, job.stdout[-4000:]


def test_no_stop_vote_at_a_fits_last_epoch_and_one_initial_broadcast(job):
    """The epoch-end stop vote ends a fit where every rank wants to stop, and is not held at the fit's last epoch
    (every rank leaves there anyway; a rank that wants to stop there changes nothing); the initial broadcast sends
    the weights and the optimizer's int64 step count in one collective, and they arrive (tests/mpi/stop_votes.py)."""
    assert_passed(job, "stop-votes", 4)
    assert job.stdout.count("fit1=(1, 1) fit2=(3, 2)") == 4, job.stdout[-4000:]


def test_real_models_and_optimizers_in_every_mode(job):
    """tests/mpi/model_matrix.py's quick variant: one fit per mode of a model and optimizer that carry mixed
    precision, BatchNormalization, an Embedding, a legacy optimizer under loss scaling, from_config and a
    worker-local variable together (the two separate fits of every mode: test_real_models_two_fits_per_mode)."""
    assert_passed(job, "model-matrix", 4)
    assert job.stdout.count("local var ok (one fit)") == len(available_modes()), job.stdout[-4000:]


@pytest.mark.full
def test_horovods_resume_recipe_with_hetsync_load_model_on_4_ranks():
    """`make test-full`: Horovod's resume recipe (rank 0 loads the last full-model checkpoint, the others build;
    ``fit(initial_epoch=...)``) with ``hetsync.load_model`` on 4 ranks, in one process per rank across both runs:
    the loaded optimizer is a hetsync optimizer of the mode holding exactly the weights, ``iterations`` and slots
    Keras' own loading gives, every rank begins from them and goes on from the saved step count to one model, and
    the resumed epoch lowers the held-out loss (tests/mpi/resume_recipe.py; docs/resume.md).  `make test` checks the
    same in every mode, across a killed job and its restart, on 2 ranks (tests/test_resume.py)."""
    proc = run_together(4, [["resume", "tests/mpi/resume_recipe.py"]], timeout=600, env=mpi_env(HETSYNC_TIMEOUT=60))
    assert_passed(proc, "resume", 4)
    assert proc.stdout.count("saved at step") == 4 * 4, proc.stdout[-4000:]


@pytest.mark.full
def test_real_models_two_fits_per_mode():
    """`make test-full`: tests/mpi/model_matrix.py's two fits per mode (a new Keras optimizer under loss scaling
    with BatchNormalization on finite shards; an Embedding with a legacy optimizer under loss scaling and a
    worker-local variable), in a job of their own."""
    proc = run_together(4, [["model-matrix-full", "tests/mpi/model_matrix.py"]], timeout=900,
                        env=mpi_env(HETSYNC_TIMEOUT=60))
    assert_passed(proc, "model-matrix-full", 4)


def test_fits_agreement_reads_each_part_by_name_whatever_its_width(monkeypatch):
    """fit's one gather carries parts of different widths (the broadcast's shapes: 3, switching: 2); each is read
    back by name, per rank, so a part that joins or widens moves no other part's columns."""
    sent = []
    monkeypatch.setattr(options, "gather",
                        lambda what, values: sent.append(values) or [values, [v + 10 for v in values]])
    agreed = options.gather_parts("fit", {"steps": 5, "shapes": [1, 20, 40], "root": 0, "switching": (1, 3)})
    assert sent == [[5, 1, 20, 40, 0, 1, 3]]
    assert agreed == {"steps": [5, 15], "shapes": [[1, 20, 40], [11, 30, 50]], "root": [0, 10],
                      "switching": [[1, 3], [11, 13]]}


def test_the_initial_broadcasts_byte_view_gives_back_every_dtype_and_shape():
    """The fit's initial broadcast sends the model's and the optimizer's values as one tensor of bytes: each comes
    back bit for bit, with its dtype and shape (a scalar step count, an empty variable, NaN's payload), and the
    parts of the concatenation split where each value ends."""
    values = [tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5), tf.constant(1000, tf.int64),
              tf.constant([np.nan, -0.0, 1e-40], tf.float32), tf.zeros([0, 4], tf.float32),
              tf.constant([-3, 7], tf.int8), tf.constant([[1.5]], tf.float16), tf.constant([255, 0], tf.uint8)]
    parts = [initial_state._as(v, tf.uint8) for v in values]
    assert all(p.dtype == tf.uint8 for p in parts)
    flat = tf.concat(parts, 0)
    assert flat.shape[0] == sum(v.shape.num_elements() * v.dtype.size for v in values)
    for value, part in zip(values, tf.split(flat, [p.shape[0] for p in parts])):
        back = initial_state._back(part, value)
        assert back.dtype == value.dtype and back.shape == value.shape
        view = tf.uint8 if value.dtype.size == 1 else {2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[value.dtype.size]
        np.testing.assert_array_equal(tf.bitcast(back, view).numpy(), tf.bitcast(value, view).numpy())
    assert tf.bool not in initial_state.BYTE_VIEWS  # no byte view: a broadcast of its own
