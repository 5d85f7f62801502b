"""§5.2 (Fig 12) Inter-Intra synchronization: node layout, head-worker rotation and the two rounds of a Global
Division when the workers span several nodes.

A mixin of :class:`~.smart_gg.SmartGroupGenerator` (it uses its ``_partition`` and the §5.3 filter of
:mod:`.slowdown_filter` for the Intra round).  The head rotation survives :meth:`resume`.
"""

from __future__ import annotations

from typing import Hashable, Sequence

__all__ = []


class _InterIntra:
    """Needs ``size``, ``_partition()`` and the slowdown filter's ``_intra_reference()`` / ``_keeps_up()``."""

    def _place_nodes(self, node_of: Sequence[Hashable]) -> None:
        """Number the nodes in order of first appearance; list each node's local ranks; start each rotation."""
        ids: dict = {}
        self.node_of = [ids.setdefault(n, len(ids)) for n in node_of]
        self.num_nodes = len(ids)
        self.local_ranks: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for r, n in enumerate(self.node_of):
            self.local_ranks[n].append(r)
        self._head_next = [0] * self.num_nodes  # rotation pointer into local_ranks[node]

    def _pick_head(self, node: int, idle_here: set[int]) -> int:
        """Rotate the head worker over the node's local ranks: the first idle one at/after the pointer."""
        ranks = self.local_ranks[node]
        start = self._head_next[node]
        for k in range(len(ranks)):
            idx = (start + k) % len(ranks)
            if ranks[idx] in idle_here:
                self._head_next[node] = (idx + 1) % len(ranks)
                return ranks[idx]
        raise AssertionError("no idle worker on node")  # pragma: no cover

    def _inter_intra_division(self, idle: list[int], requester: int) -> list[list[tuple[list[int], str]]]:
        """§5.2 (Fig 12): two GD rounds over the same idle workers: Inter (heads across nodes + local groups of
        the non-heads), then Intra (all divided workers of each node)."""
        by_node: dict[int, list[int]] = {}
        for u in idle:
            by_node.setdefault(self.node_of[u], []).append(u)
        first_round: list[tuple[list[int], str]] = []
        if len(by_node) >= 2:
            heads = {n: self._pick_head(n, set(ws)) for n, ws in sorted(by_node.items())}
            for grp in self._partition(sorted(heads.values()), requester if requester in heads.values() else None):
                first_round.append((grp, "inter"))
            for n, ws in sorted(by_node.items()):
                rest = [u for u in ws if u != heads[n]]
                for grp in self._partition(rest, requester if requester in rest else None):
                    first_round.append((grp, "local"))
        else:  # only one node has idle workers: no inter-node round is possible
            for ws in by_node.values():
                for grp in self._partition(ws, requester if requester in ws else None):
                    first_round.append((grp, "local"))
        second_round: list[tuple[list[int], str]] = []
        c_max = self._intra_reference(idle)  # §5.3: a lagging worker gets no Intra group (see slowdown_filter)
        for n, ws in sorted(by_node.items()):
            members = [u for u in ws if self._keeps_up(u, c_max)]
            if len(members) >= 2:
                second_round.append((sorted(members), "intra"))
        return [first_round, second_round]
