"""sync="hop": its options and topologies, without MPI (hetsync/algorithms/hop.py, hop_topology.py).

Bad input raises ValueError naming the option; the named graphs have the shape Hop §7 describes; eq. (1) weights,
spectral gaps and Table 1's bounds are what the formulas say.
"""
import numpy as np
import pytest

from hetsync import algorithms
from hetsync.algorithms import hop_topology as topo


def hop(**options):
    return algorithms.create("hop", **options)


def test_hop_is_registered():
    assert "hop" in algorithms.available_modes()


@pytest.mark.parametrize("options, needle", [
    (dict(topology="torus"), "option topology='torus' (str) is invalid: expected a list or 'ring'"),
    (dict(max_ig=0), "option max_ig=0 (int) is invalid: expected an int >= 1"),
    (dict(backup_workers=-1), "option backup_workers=-1 (int) is invalid: expected an int >= 0"),
    (dict(staleness=-2), "option staleness=-2 (int) is invalid: expected an int >= 0 or None"),
    (dict(skip=2), "skip needs backup_workers >= 1 or staleness"),
    (dict(skip_trigger=3), "skip_trigger is set but skip is not"),
    (dict(node_links=2), "option node_links=2 (int) is invalid: expected 'gateway' or 'distinct' or 1 or 'all'"),
    (dict(timeout=0), "option timeout=0 (int) is invalid: expected a number > 0 or None"),
    (dict(topology=7), "option topology=7 (int) is invalid"),
    (dict(max_igg=3), "unknown option(s) ['max_igg']"),
])
def test_bad_options_are_value_errors(options, needle):
    with pytest.raises(ValueError) as e:
        hop(**options)
    assert needle in str(e.value)


@pytest.mark.parametrize("options, size, needle", [
    (dict(backup_workers=2, topology="ring"), 8, "backup_workers=2 must be < |N_in|"),
    (dict(topology=[[1], [0], [3], [2]]), 4, "not strongly connected"),
    (dict(topology=[[1], [0]]), 3, "list of 3 in-neighbour lists"),
    (dict(topology=[[1], [5], [0]]), 3, "outside [0, 3)"),
    (dict(topology="double-ring"), 6 + 1, "even number of workers"),
    (dict(topology="node-allreduce-ring", node_size=[3, 3]), 8, "summing to the world size 8"),
])
def test_errors_that_need_the_world_size(options, size, needle):
    algo = hop(**options)
    with pytest.raises(ValueError) as e:
        algo.graph(size, [list(range(size))])
    assert needle in str(e.value)


def test_defaults_are_standard_decentralized_training():
    algo = hop()
    assert algo.options["topology"] == "ring-based" and algo.options["max_ig"] == 4
    assert algo.options["backup_workers"] == 0 and algo.options["staleness"] is None and algo.options["skip"] is None
    assert hop(backup_workers=1, skip=10).trigger == 2 and hop(backup_workers=1, skip=3, skip_trigger=0).trigger == 0


def symmetric(in_lists):
    return all(i in in_lists[j] for i, ins in enumerate(in_lists) for j in ins)


def test_named_topologies():
    ring = topo.build("ring", 8)
    assert ring[0] == [1, 7] and symmetric(ring)
    rb = topo.build("ring-based", 8)
    assert rb[0] == [1, 4, 7] and symmetric(rb) and all(len(x) == 3 for x in rb)
    rb7 = topo.build("ring-based", 7)
    assert symmetric(rb7) and rb7[0] == [1, 3, 4, 6]
    dr = topo.build("double-ring", 8)
    assert symmetric(dr) and 4 in dr[0] and all(len(x) == 4 for x in dr)
    one = topo.build("node-allreduce-ring", 8, [3, 3, 2])
    assert one[0] == [1, 2, 7] and one[3] == [2, 4, 5] and symmetric(one)
    every = topo.build("node-allreduce-ring", 8, [3, 3, 2], "all")
    assert {3, 6} <= set(every[0]) and symmetric(every)
    assert topo.build("node-allreduce-ring", 4, 4) == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]


def test_weights_spectral_gap_and_bounds():
    rb = topo.build("ring-based", 8)
    w = topo.weights(rb)
    assert np.allclose(w.sum(axis=0), 1) and np.allclose(w[[0, 1, 4, 7], 0], 0.25)
    assert topo.spectral_gap(rb, "eq1") == pytest.approx(0.5)   # circulant: 1 - max|(1 + 2cos + cos(pi m)) / 4|
    assert topo.spectral_gap(topo.build("ring", 8)) < topo.spectral_gap(rb)
    d = topo.distances(topo.build("ring", 6))
    assert d[0, 3] == 3 and d[0, 1] == 1
    assert topo.gap_bound(d, 0, 3, max_ig=2) == 3                  # min(len(3 -> 0), 2 * len(0 -> 3))
    assert topo.gap_bound(d, 0, 1, max_ig=2) == 1
    assert topo.gap_bound(d, 0, 1, max_ig=2, staleness=3) == 2     # min(4 * 1, 2 * 1)
    assert topo.gap_bound(d, 0, 3, max_ig=2, backup=1) == 6        # tokens only (Table 1, backup workers)


def test_fig21_spectral_gaps_under_the_papers_w():
    """Hop §7.3.6, Fig 21: 8 workers on machines of 4, 2 and 2.  Under the paper's W (A / degree, no self-loops,
    the two largest eigenvalues) the three graphs have exactly the gaps the paper prints; eq. (1)'s W (self-loops,
    by modulus) gives others, so a test of the wrong matrix or of the wrong link layout fails here."""
    machines = [4, 2, 2]
    ring_based = topo.build("ring-based", 8)
    gateway = topo.build("node-allreduce-ring", 8, machines, "gateway")
    distinct = topo.build("node-allreduce-ring", 8, machines, "distinct")
    assert topo.spectral_gap(ring_based) == pytest.approx(0.6667, abs=5e-5)
    assert topo.spectral_gap(gateway) == pytest.approx(0.2682, abs=5e-5)
    assert topo.spectral_gap(distinct) == pytest.approx(0.2688, abs=5e-5)
    assert topo.spectral_gap(ring_based, "eq1") == pytest.approx(0.5)
    assert gateway[0] == [1, 2, 3, 4, 6] and gateway[4] == [0, 5, 6]   # (b): worker 0, 4 and 6 carry every link
    assert distinct[3] == [0, 1, 2, 4] and distinct[0] == [1, 2, 3, 7]  # (c): each link its own workers
    assert topo.build("node-allreduce-ring", 8, machines, 1) == distinct
    with pytest.raises(ValueError, match="matrix must be"):
        topo.spectral_gap(ring_based, "laplacian")


def test_machines_from_the_real_placement():
    """Machines of unequal size, and ranks of one host not consecutive (a placement horovodrun can produce)."""
    hosts = ["a", "b", "a", "c", "a", "b", "a", "c"]
    machines = topo.machines_from_hosts(hosts)
    assert machines == [[0, 2, 4, 6], [1, 5], [3, 7]]
    in_lists = hop(topology="node-allreduce-ring", node_links="gateway").graph(8, machines)
    assert set(in_lists[0]) == {2, 4, 6, 1, 3} and in_lists[5] == [1]
    assert topo.spectral_gap(in_lists) == pytest.approx(0.2682, abs=5e-5)  # Fig 21 (b), relabelled
    assert hop(topology="node-allreduce-ring", node_size=[4, 2, 2], node_links="distinct").graph(8, machines)[0] == [
        1, 2, 3, 7]
    with pytest.raises(ValueError, match="exactly once"):
        topo.machines(8, [[0, 1, 2], [3, 4]])
