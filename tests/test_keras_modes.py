"""Multi-process Keras runs (real mpirun, real TensorFlow and Horovod): the sync modes end to end.

The 4-rank scripts run one after another in one job (conftest's ``keras_job``: tests/mpi/together.py, each script as
it would run alone; test_balanced.py's and test_switching.py's scripts among them); ESync's,
which ends with a rank hung until the others have named it, runs last.  OD-SGD's runs on 3 ranks with
Horovod's tensor fusion off, in a job of its own."""
import json
import os

import pytest

from conftest import assert_ok, assert_passed, mpi_env, run_mpi

@pytest.fixture(scope="module")
def job(keras_job):
    return keras_job


def test_allreduce_matches_horovod_and_ripples_static_wiring(job):
    assert_passed(job[0], "wiring", 4)


def test_ripples_static_reaches_target_and_uneven_workers_end_together(job):
    assert_passed(job[0], "ripples-static-train", 4)


def test_example_training_script_with_slowdown(job):
    """examples/train.py as a user runs it: ripples-static, one rank 3x slower, logs and summaries written."""
    assert_passed(job[0], "example-ripples-static", 4)
    tmp_path = job[1] / "example-ripples-static"
    summaries = [json.load(open(tmp_path / f"summary{r}.json")) for r in range(4)]
    assert len({s["weights_checksum"] for s in summaries}) == 1, "ranks ended with different models"
    assert all(os.path.getsize(tmp_path / f"rank{r}.csv") > 0 for r in range(4))
    # the slowed rank slept (factor - 1) x base_time per step: at least 60 x 0.02 s
    assert summaries[3]["train_time_s"] >= 60 * 0.02, summaries[3]


def test_ripples_random_group_generator_trains_with_a_slow_rank(job):
    """ripples-random with rank 3 10x slower reaches the target loss with one model on every rank, and every group
    its GG made was a random one (requester in it, group_size draftable members, the slow rank drafted into about
    2/3 of the fast ranks' groups, a fast rank that drew 30 groups drew each of its 3 possible ones).  No claim
    that the fast ranks keep progressing: random groups draft the slow rank, so they may be held back by it
    (tests/mpi/keras_gg_train.py)."""
    assert_passed(job[0], "gg-ripples-random", 4)


def test_ripples_smart_group_generator_keeps_fast_ranks_going(job):
    """ripples-smart with rank 3 10x slower on machines of unequal size: the target loss, one model on every rank,
    and the fast ranks keep progressing -- when rank 0 had done its 160 steps the slow rank had made fewer than
    half as many requests (tests/mpi/keras_gg_train.py)."""
    assert_passed(job[0], "gg-ripples-smart", 4)


def test_eager_algorithm5_weights_and_model_sync_every(job):
    """eager-SGD §5 Algorithm 5 line 6 (``late="algorithm5"``): one-hot gradients, plain SGD with lr 1, solo with a
    slow rank: every step's update times P is whole.  A round of one contribution is made, not waited for: at the
    first batch the other ranks wait in a Horovod broadcast while rank 1 runs its step alone (its solo round holds
    only its gradient), then arrive after that round ran; every rank's first step must apply it with NAP 1 and
    G = 1/P of the lone gradient, and under ``late="latest"`` (averaged over the contributors) G = the whole
    gradient -- shown in the same job.  ``model_sync_every=5`` with Adam: every rank holds the same model right
    after batches 5, 10, ..., and not at every batch between; ``model_sync_epochs=2``: at epoch ends 2 and 4 and
    after fit only (tests/mpi/eager_fidelity.py)."""
    assert_passed(job[0], "eager-fidelity", 4)


@pytest.mark.parametrize("mode", ["eager-solo", "eager-majority"])
def test_eager_sgd_reaches_target_with_random_slowdown(mode, job):
    """eager-SGD end to end in Keras: every rank is 4x slower at random steps (p = 1/4, Hop §7.3.1 protocol);
    the partial allreduce lets the others go on, and the job still reaches the loss target with one model."""
    assert_passed(job[0], f"example-{mode}", 4)
    tmp_path = job[1] / f"example-{mode}"
    summaries = [json.load(open(tmp_path / f"summary{r}.json")) for r in range(4)]
    assert len({s["weights_checksum"] for s in summaries}) == 1, "ranks ended with different models"
    # (allreduce reaches 0.86 on this run; it starts at 2.3)
    assert all(s["consensus_loss"] <= 1.0 for s in summaries), [s["consensus_loss"] for s in summaries]
    # job epochs: the job's 4 x 80 train steps, shared by speed (the fit's first is every rank's: at most 3 more)
    calls = [(s.get("algorithm") or {}).get("calls", 0) for s in summaries]
    assert 4 * 80 <= sum(calls) <= 4 * 80 + 3, calls
    metrics = summaries[0].get("algorithm") or {}
    assert 1 <= metrics.get("mean_nap", 0) <= 4, metrics


def test_hop_hybrid_with_a_slow_rank_trains_in_fit_and_bad_options_raise_everywhere(job):
    """sync='hop' (staleness + backup workers + skipping) in Keras' fit with rank 3 5x slower: one model, a loss
    target (allreduce reaches ~0.7 in the same 80 steps; the untrained loss is 2.3), the slow rank jumps; and
    options that need the world size raise ValueError on every rank."""
    assert_passed(job[0], "hop", 4)


def test_esync_local_steps_lockstep_numpy_aggregation_and_dead_rank(job):
    """ESync with rank 3 5x slower: ~5 local iterations per round on the fast ranks, 1 on the slow one, several on
    every fast rank already in round 0 (RUN-BATCH-DATA-TEST's k = 0 reports, nominal capabilities), the same model
    on every rank after every round, eqs. 6-8 against numpy, a loss target one step per round cannot reach; the
    blocking run then checks that a hung rank is named by the others' aggregation within its timeout
    (tests/mpi/keras_esync.py)."""
    assert_passed(job[0], "esync", 4)


def test_od_sgd_warmup_is_horovod_replays_numpy_overlaps_and_names_a_dead_rank():
    """OD-SGD on 3 ranks (tests/mpi/keras_od_sgd.py).  Horovod's tensor fusion is off: with fusion, Horovod's own
    3-rank reductions are not reproducible run to run, and the warm-up is compared with Horovod bit for bit."""
    proc = run_mpi(3, "tests/mpi/keras_od_sgd.py", timeout=300,
                   env=mpi_env(HOROVOD_FUSION_THRESHOLD="0"))
    assert_ok(proc, 3)
