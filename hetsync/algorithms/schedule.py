"""Ripples' conflict-free static schedule: the rule-based function S(rank, local rank, iteration) of §4.2 (Fig 9, 10).

The schedule repeats every ``PERIOD = 4`` iterations.  A node's local ranks are its ranks in ascending order; nodes
come from :class:`Layout` (blocks of ``node_size``, a list of machine sizes, or the real placement by host), and
every rule below uses the node's own L, so machines of unequal size are scheduled conflict-free too (tested).  For
a node with L local workers, phase by phase:

====== ============================================================================================================
phase  groups
====== ============================================================================================================
0      local 0 of every node together (inter-node); local 1 alone; locals 2,3 / 4,5 / ... in pairs
1      all local workers of the node (intra-node)
2      local 0 with local L-1 (when L >= 3); local 1 with "its" worker on the opposite node of the ring (the local
       0 of a one-worker node stands in for local 1); locals 2,3 / 4,5 / ... of the rest in pairs
3      all local workers of the node (intra-node)
====== ============================================================================================================

A worker left without a partner does not synchronize in that phase (the paper's "No sync").  For L = 4 this is
exactly Fig 10.  Sizes the paper does not show are handled by the same rules: pairs are formed left to right and an
odd worker out skips; a node with fewer workers uses the rules with its own L; with an odd number of nodes the
ring pairs node i with node i + N//2 for i < N//2 and the last node skips the phase-2 inter-node step.

Connectivity (§3.3): phase 0 joins the local 0s of all nodes and phase 1 joins every node internally, so the union
of the groups of one period is a connected graph for every size and node size; tests check this and that every
phase is a partition (conflict-free: no worker in two groups at once).
"""
from dataclasses import dataclass

from hetsync.algorithms.hop_topology import machines

PERIOD = 4


@dataclass(frozen=True)
class Layout:
    """``size`` workers on machines given by ``node_size``, read by hop_topology.machines: an int (blocks of that
    many consecutive ranks, the last one may hold fewer), a list of machine sizes (``[4, 2, 2]``: consecutive
    blocks of unequal size) or a list of rank lists (the real placement, ranks grouped by host, any order)."""

    size: int
    node_size: object

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        blocks = tuple(tuple(m) for m in machines(self.size, self.node_size))
        object.__setattr__(self, "node_size", self.node_size if isinstance(self.node_size, int) else
                           tuple(m if isinstance(m, int) else tuple(m) for m in self.node_size))
        object.__setattr__(self, "_machines", blocks)

    @property
    def nodes(self):
        return len(self._machines)

    def locals_of(self, node):
        """World ranks of ``node`` in local-rank order."""
        return list(self._machines[node])


def _pairs(ranks):
    """Consecutive pairs of ``ranks``; an odd one out becomes a singleton (no sync)."""
    groups = [ranks[i:i + 2] for i in range(0, len(ranks) - 1, 2)]
    if len(ranks) % 2:
        groups.append([ranks[-1]])
    return groups


def _phase0(layout):
    groups = [[layout.locals_of(n)[0] for n in range(layout.nodes)]]
    for n in range(layout.nodes):
        local = layout.locals_of(n)
        if len(local) > 1:
            groups.append([local[1]])
        groups.extend(_pairs(local[2:]))
    return groups


def _intra(layout):
    return [layout.locals_of(n) for n in range(layout.nodes)]


def _phase2(layout):
    ring = []  # the worker of each node that takes the inter-node step: local 1, or local 0 on one-worker nodes
    groups = []
    for n in range(layout.nodes):
        local = layout.locals_of(n)
        if len(local) == 1:
            ring.append(local[0])
            continue
        ring.append(local[1])
        if len(local) >= 3:
            groups.append([local[0], local[-1]])
            groups.extend(_pairs(local[2:-1]))
        else:
            groups.append([local[0]])
    half = len(ring) // 2
    groups.extend([ring[i], ring[i + half]] for i in range(half))
    if len(ring) % 2:
        groups.append([ring[-1]])
    return groups


_PHASES = (_phase0, _intra, _phase2, _intra)


def partition(iteration, layout):
    """All groups of ``iteration``: a partition of range(layout.size), each group sorted."""
    return [sorted(g) for g in _PHASES[iteration % PERIOD](layout)]


def static_group(rank, iteration, layout):
    """S(rank, local rank, iteration): the sorted group ``rank`` P-Reduces with; ``[rank]`` means no sync."""
    if not 0 <= rank < layout.size:
        raise ValueError(f"rank {rank} out of range for {layout.size} workers")
    for group in partition(iteration, layout):
        if rank in group:
            return group
    raise AssertionError(f"rank {rank} missing from the schedule of iteration {iteration}")


def period_groups(rank, layout):
    """The ``PERIOD`` groups of ``rank``, one per phase (what the training graph indexes by iteration)."""
    return [static_group(rank, phase, layout) for phase in range(PERIOD)]
