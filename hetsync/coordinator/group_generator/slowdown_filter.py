"""§5.3 (Fig 13) slowdown filter on the per-worker request counters ``c_w`` and ``C_thres`` (+ ``exclude_laggards``).

A mixin of :class:`~.smart_gg.SmartGroupGenerator`: the rules that keep a slow worker from being drafted by fast
initiators (Global Division) and from a node's Intra group (§5.2), in one place.  The counters themselves are kept
by the protocol (``_counter``, incremented per request; they survive :meth:`resume`).
"""

from __future__ import annotations

__all__ = []


class _SlowdownFilter:
    """Needs ``c_thres``, ``exclude_laggards``, ``_counter`` and ``_live_workers()`` of the generator."""

    def _fastest(self) -> int:
        """``c_max``: the largest request counter of the live workers (0 if none)."""
        return max((self._counter[u] for u in self._live_workers()), default=0)

    def _passes(self, initiator: int, u: int, c_max: int) -> bool:
        """§5.3 slowdown filter ``c_i - c_w < C_thres`` (+ the ``exclude_laggards`` extension)."""
        if self.c_thres is None:
            return True
        c = self._counter
        if c[initiator] - c[u] >= self.c_thres:
            return False
        return not (self.exclude_laggards and c_max - c[u] >= self.c_thres)

    def _intra_reference(self, idle: list[int]) -> int:
        """The counter an Intra member must keep up with: the fastest live worker's (``exclude_laggards``), else
        the fastest divided worker's."""
        return self._fastest() if self.exclude_laggards else max(self._counter[u] for u in idle)

    def _keeps_up(self, u: int, c_max: int) -> bool:
        """Not lagging ``c_max`` by ``c_thres`` requests or more (always true with the filter off).

        Used for the Intra round: it runs one iteration after the Inter round, so a lagging member would make its
        whole node wait for one slow iteration (§5.3's argument that drafted fast workers do not suffer covers only
        the first round)."""
        return self.c_thres is None or c_max - self._counter[u] < self.c_thres
