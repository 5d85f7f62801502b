"""sync="balanced" (README "sync='balanced'"): its plan (pure, with hypothesis) and the mode end to end on 4 real
ranks (tests/mpi/balanced_job.py: the numpy replay of union-batch SGD, shares following a speed change, a stopped
rank's share handed over, the shares in the heterogeneity report)."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_passed

from hetsync.algorithms import balanced_plan
from hetsync.algorithms.balanced_plan import bounds, plan

sizes = st.integers(2, 9)


@st.composite
def jobs(draw):
    n = draw(sizes)
    batches = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    rates = draw(st.lists(st.floats(0.5, 500.0), min_size=n, max_size=n))
    active = draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(any))
    min_share = draw(st.sampled_from([0.01, 0.05, 0.25, 1.0]))
    max_share = draw(st.sampled_from([1.0, 1.5, 4.0, 100.0]))
    return batches, rates, active, min_share, max_share


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_the_plan_keeps_horovods_global_batch_within_the_bounds(job):
    """Whole samples; a stopped rank takes none; every training rank takes between its bounds; the global batch is
    Horovod's whenever the bounds allow it, else as close as they allow."""
    batches, rates, active, lo, hi = job
    current = [b if a else 0 for b, a in zip(batches, active)]
    new = plan(batches, rates, active, current, lo, hi, hysteresis=0.0)
    assert all(isinstance(n, int) for n in new)
    limits = [bounds(b, lo, hi) for b in batches]
    for n, a, (least, most) in zip(new, active, limits):
        assert (least <= n <= most) if a else n == 0
    most = sum(limits[r][1] for r, a in enumerate(active) if a)
    least = sum(limits[r][0] for r, a in enumerate(active) if a)
    assert sum(new) == min(max(sum(batches), least), most), (new, batches, active)


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_a_faster_rank_never_gets_a_smaller_share(job):
    """Shares follow throughput: of two training ranks with the same batch, the faster takes at least as much."""
    batches, rates, active, lo, hi = job
    batches = [32] * len(batches)
    new = plan(batches, rates, active, batches, lo, hi, hysteresis=0.0)
    for a in range(len(new)):
        for b in range(len(new)):
            if active[a] and active[b] and rates[a] > rates[b] * 1.01:
                assert new[a] >= new[b], (new, rates)


def test_one_rank_five_times_slower_gets_a_fifth_of_a_fast_ranks_share():
    """4 ranks, batch 32, rank 3 at a fifth of the others' throughput: 40, 40, 40, 8 (the 4.0x limit's split)."""
    assert plan([32] * 4, [5.0, 5.0, 5.0, 1.0], [True] * 4, [32] * 4, 0.05, 4.0, 0.1) == [40, 40, 40, 8]
    # speeds 1:2:3:5 -> 128 samples in proportion, whole samples summing to 128
    assert plan([32] * 4, [1.0, 2.0, 3.0, 5.0], [True] * 4, [32] * 4, 0.05, 4.0, 0.1) == [12, 23, 35, 58]


def test_hysteresis_keeps_the_plan_until_a_share_moves_by_more_than_it():
    now = [40, 40, 40, 8]
    assert plan([32] * 4, [5.0, 5.2, 4.9, 1.05], [True] * 4, now, 0.05, 4.0, 0.1) == now
    assert plan([32] * 4, [5.0, 5.0, 5.0, 2.0], [True] * 4, now, 0.05, 4.0, 0.1) != now
    # a rank that stops is a new plan at once, whatever the hysteresis
    assert plan([32] * 4, [5.0, 5.0, 5.0, 1.0], [True, False, True, True], now, 0.05, 4.0, 0.9)[1] == 0
    # a rank not measured yet keeps the plan in force
    assert plan([32] * 4, [5.0, 0.0, 5.0, 1.0], [True] * 4, now, 0.05, 4.0, 0.0) == now


def test_min_and_max_share_bound_the_plan():
    new = plan([32] * 4, [100.0, 1.0, 1.0, 1.0], [True] * 4, [32] * 4, 0.5, 1.5, 0.0)
    assert new[0] == 48 and all(n >= 16 for n in new) and sum(new) == 128, new
    assert balanced_plan.bounds(32, 0.01, 4.0) == (1, 128)


def test_balanced_job_replays_union_batch_sgd_follows_speed_and_reports_shares(keras_job):
    """4 ranks: the final model equals a numpy replay of synchronous SGD on the union of the samples every rank
    computed (from the recorded plans); shares move to the newly slow rank within replan_every + window updates;
    a rank that stops hands its share over at the next update; the heterogeneity report (and TensorBoard), placed
    on rank 0 only, records every rank's share over time, and TensorBoard shows the mode by name."""
    import tensorflow as tf

    proc, base = keras_job  # (one job with test_keras_modes.py's scripts: conftest.keras_job)
    assert_passed(proc, "balanced", 4)
    tmp_path = base / "balanced"
    for rank in range(4):  # rank 0 wrote every rank's records, taken on that rank
        rows = [json.loads(line) for line in open(tmp_path / "hetsync" / f"rank{rank}.jsonl") if line.strip()]
        assert rows and all(r["rank"] == rank and r["mode"] == "balanced" for r in rows if r["kind"] == "rate")
        assert len([r for r in rows if r["kind"] == "rate"]) >= 5, (rank, len(rows))
    tags = set()
    for event in (tmp_path / "hetsync" / "rank2").iterdir():
        for e in tf.compat.v1.train.summary_iterator(str(event)):
            tags |= {v.tag for v in e.summary.value}
    assert {"hetsync/mode", "hetsync/mode/balanced", "hetsync/rate"} <= tags, tags
    records = [json.loads(line) for line in open(tmp_path / "hetsync" / "rank3.jsonl") if line.strip()]
    shares = [r["metrics"]["share"] for r in records if r["kind"] == "rate" and "share" in r["metrics"]]
    # 5x slower in phase 1 (a fifth of a fast rank's share), as fast as ranks 1 and 2 in phase 2
    assert shares and min(shares) < 0.5 and shares[-1] > 2 * min(shares), shares
    assert any(p.name.startswith("events") for p in (tmp_path / "hetsync" / "rank3").iterdir())


@pytest.mark.parametrize("kwargs, error", [
    ({"op": "adasum"}, "op=Adasum is not supported by sync='balanced'"),
    ({"min_share": 0}, "option min_share=0"),
    ({"max_share": 0.5}, "option max_share=0.5"),
])
def test_bad_options_name_what_is_wrong(kwargs, error):
    import horovod.tensorflow as hvd

    from hetsync.algorithms import create

    if kwargs.get("op") == "adasum":
        kwargs = {"op": hvd.Adasum}
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        create("balanced", **kwargs)
