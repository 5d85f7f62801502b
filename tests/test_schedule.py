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


machine_sizes = st.lists(st.integers(1, 9), min_size=1, max_size=6)


def _placement(sizes, data):
    """Machines of the given sizes holding a random permutation of the ranks (hosts in any rank order)."""
    ranks = data.draw(st.permutations(range(sum(sizes))))
    out, start = [], 0
    for s in sizes:
        out.append(sorted(ranks[start:start + s]))
        start += s
    return out


@settings(max_examples=80, deadline=None)
@given(sizes=machine_sizes, placed=st.booleans(), data=st.data())
def test_unequal_machines_are_conflict_free_and_connected(sizes, placed, data):
    """§4.2 for machines of unequal size, as a list of sizes or as the real placement (ranks grouped by host):
    every phase is a partition that every member computes alike, each intra-node phase is exactly one machine,
    and one period connects every worker (§3.3)."""
    size = sum(sizes)
    layout = Layout(size, _placement(sizes, data) if placed else sizes)
    machines = [layout.locals_of(n) for n in range(layout.nodes)]
    assert sorted(len(m) for m in machines) == sorted(sizes)
    for phase in range(PERIOD):
        groups = partition(phase, layout)
        assert sorted(r for g in groups for r in g) == list(range(size))
        for group in groups:
            for rank in group:
                assert static_group(rank, phase, layout) == group
    assert sorted(partition(1, layout)) == sorted(sorted(m) for m in machines)
    assert connected(size, [g for phase in range(PERIOD) for g in partition(phase, layout)])


def test_unequal_machine_sizes_follow_figure_10_per_machine():
    layout = Layout(8, [4, 2, 2])
    assert static_group(0, 0, layout) == [0, 4, 6]  # local 0 of every machine
    assert static_group(2, 0, layout) == [2, 3]
    assert static_group(5, 1, layout) == [4, 5]
    assert static_group(5, 2, layout) == [1, 5]  # local 1s on the ring: machines 0 and 1 (of 3)
    with pytest.raises(ValueError, match="summing to the world size"):
        Layout(8, [4, 2])


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
