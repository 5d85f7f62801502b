"""§5 smart Group Generator: §5.1 Group Buffer + Global Division, with §5.2 Inter-Intra synchronization
(:mod:`.inter_intra`) and the §5.3 slowdown filter (:mod:`.slowdown_filter`) mixed in.
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, Sequence

from .inter_intra import _InterIntra
from .protocol import _BaseGroupGenerator
from .slowdown_filter import _SlowdownFilter

__all__ = ["SmartGroupGenerator"]


class SmartGroupGenerator(_InterIntra, _SlowdownFilter, _BaseGroupGenerator):
    """§5 smart GG: Group Buffer + Global Division + Inter-Intra synchronization + slowdown filter.

    Parameters
    ----------
    node_of:
        ``node_of[rank]`` is the node (host) of each worker (any hashable); ``None``: all on one node.
    c_thres:
        §5.3 ``C_thres``: a GD started by ``i`` only takes idle workers ``w`` with ``c_i - c_w < c_thres``
        (``None`` disables the filter).
    exclude_laggards:
        Extension of §5.3 (default on; ``False`` is the paper's rule exactly): a worker lagging the *fastest* live
        worker by ``c_thres`` requests or more (``c_max - c_w >= c_thres``) is not drafted by anybody else, even
        by an initiator that lags too, and gets no Intra group.  Without it, fast workers that happened to be
        blocked by a slow worker early on lag as well, keep drafting the slow worker (their counters stay within
        ``c_thres`` of its own) and form a slow island with it; with Inter-Intra this costs the slow worker's
        node-mates ~15% of their throughput in the tests' simulation.  A lagging worker still synchronizes
        whenever it initiates a GD, with the idle fast workers.  Measured (simulation, 8 workers, one 5x slower,
        10 seeds): the fast workers' iteration time is 0.7% (one node) and 2.4% (two nodes) lower with it; the
        one-host Keras benchmark cannot tell them apart (README "Ripples: paper rules and ours"), so it stays on.
    inter_intra:
        §5.2: with more than one node, each GD inserts two rounds of groups into the buffers: an *Inter* round
        (one head worker per node, heads randomly grouped across nodes; the other workers randomly grouped
        with local workers only) and an *Intra* round (all divided workers of a node in one group).

    Choices where the paper is vague (see docs/group_generator.md): GD cuts the shuffled idle workers into groups
    of exactly ``group_size`` (a single left-over worker joins the last group, so no idle worker is left out);
    the head worker of a node rotates over the node's local ranks (the next idle local rank after the previous
    head), spreading the inter-node traffic like the static schedule of Fig 10; a worker whose counter lags the
    fastest (live, or with ``exclude_laggards=False`` divided) worker by ``c_thres`` or more gets no Intra group,
    since the Intra group runs one iteration later and would make the whole node wait for one slow iteration
    (§5.3's argument only covers the first round); one-member groups are not created except for the requester
    when nobody else is idle (a singleton: no synchronization this time).
    """

    mode = "smart"

    def __init__(
        self,
        size: int,
        group_size: int = 3,
        node_of: Optional[Sequence[Hashable]] = None,
        c_thres: Optional[int] = 5,
        seed: Optional[int] = None,
        inter_intra: bool = True,
        ack_timeout: Optional[float] = 300.0,
        clock: Optional[Callable[[], float]] = None,
        exclude_laggards: bool = True,
    ):
        super().__init__(size, group_size=group_size, seed=seed, ack_timeout=ack_timeout, clock=clock)
        if node_of is None:
            node_of = [0] * self.size
        node_of = list(node_of)
        if len(node_of) != self.size:
            raise ValueError(f"node_of has {len(node_of)} entries, expected {self.size}")
        if c_thres is not None and c_thres <= 0:
            raise ValueError("c_thres must be > 0 or None")
        self.c_thres = c_thres
        self.inter_intra = bool(inter_intra)
        self.exclude_laggards = bool(exclude_laggards)
        self._place_nodes(node_of)

    # -- §5.1 Global Division
    def _generate(self, requester: int, now: float) -> None:
        self._divisions += 1
        c_max = self._fastest()
        idle = [requester] + [
            u for u in range(self.size) if u != requester and self._is_idle(u) and self._passes(requester, u, c_max)
        ]
        if self.inter_intra and self.num_nodes > 1:
            rounds = self._inter_intra_division(idle, requester)
        else:
            rounds = [[(grp, "gd") for grp in self._partition(idle, requester)]]
        made_for_requester = False
        for rnd in rounds:
            for members, phase in rnd:
                if len(members) < 2:
                    continue
                self._new_group(members, requester if requester in members else None, phase, now)
                made_for_requester |= requester in members
        if not made_for_requester:
            self._new_group([requester], requester, "solo", now)

    def _is_idle(self, u: int) -> bool:
        """Idle in the sense of §5.1's GD: live, not away, empty Group Buffer, not in a running group."""
        return (
            self._departed[u] is None
            and not self._away[u]
            and not self._queue[u]
            and self._lock[u] is None
            and self._holding[u] is None
            and self._waiting[u] is None
        )

    def _partition(self, workers: Sequence[int], first: Optional[int] = None) -> list[list[int]]:
        """Random partition into chunks of ``group_size`` (``first``, if given, lands in the first chunk).

        A single left-over worker takes one worker from the previous chunk, so the last two groups are smaller
        rather than one larger: with 4 idle workers and groups of 3 that gives 2 + 2, not one group of all four (a
        whole-job average at every division, which would tie every worker to the slowest one).  With groups of 2
        it joins the last pair instead.
        """
        pool = [u for u in workers if u != first]
        self._rng.shuffle(pool)
        if first is not None and first in workers:
            pool.insert(0, first)
        chunks = [pool[i : i + self.group_size] for i in range(0, len(pool), self.group_size)]
        if len(chunks) >= 2 and len(chunks[-1]) == 1:
            if len(chunks[-2]) > 2:
                chunks[-1].insert(0, chunks[-2].pop())
            else:
                chunks[-2].extend(chunks.pop())
        return chunks
