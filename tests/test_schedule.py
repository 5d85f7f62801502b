"""Ripples' static schedule S (§4.2): conflict-free partitions, a connected union graph (§3.3), Fig 10's rules."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import connected
from hetsync.algorithms.schedule import PERIOD, Layout, partition, period_groups, static_group


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 40), node_size=st.integers(1, 12), iteration=st.integers(0, 10_000))
def test_every_phase_is_a_partition_and_consistent(size, node_size, iteration):
    layout = Layout(size, node_size)
    groups = partition(iteration, layout)
    members = sorted(r for g in groups for r in g)
    assert members == list(range(size)), "each worker in exactly one group (conflict-free)"
    for group in groups:
        for rank in group:
            assert static_group(rank, iteration, layout) == group, "every member computes the same group"


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 40), node_size=st.integers(1, 12))
def test_union_of_one_period_is_connected(size, node_size):
    layout = Layout(size, node_size)
    groups = [g for phase in range(PERIOD) for g in partition(phase, layout)]
    assert connected(size, groups)


def test_matches_figure_10_for_16_workers_on_4_nodes():
    layout = Layout(16, 4)
    # Phase 0: local 0s of all nodes together, local 1 alone, locals 2-3 paired.
    assert static_group(0, 0, layout) == [0, 4, 8, 12]
    assert static_group(5, 0, layout) == [5]
    assert static_group(6, 0, layout) == [6, 7]
    # Phases 1 and 3: whole node.
    assert static_group(9, 1, layout) == [8, 9, 10, 11]
    assert static_group(9, 3, layout) == [8, 9, 10, 11]
    # Phase 2: local 0 with local 3, local 1 with local 1 on the opposite node, local 2 alone (Fig 9 row 4k+2).
    assert static_group(4, 2, layout) == [4, 7]
    assert static_group(1, 2, layout) == [1, 9]
    assert static_group(13, 2, layout) == [5, 13]
    assert static_group(2, 2, layout) == [2]
    # Periodic.
    assert static_group(6, 4 * 7, layout) == static_group(6, 0, layout)


def test_period_groups_and_bad_input():
    layout = Layout(4, 2)
    assert period_groups(0, layout) == [[0, 2], [0, 1], [0], [0, 1]]
    with pytest.raises(ValueError, match="out of range"):
        static_group(4, 0, layout)
    with pytest.raises(ValueError, match="size"):
        Layout(0, 1)
    with pytest.raises(ValueError, match="node_size"):
        Layout(4, 0)
