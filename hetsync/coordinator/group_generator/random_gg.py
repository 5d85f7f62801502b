"""§4.1 random Group Generator, with §5.1's Group Buffer as an option (``group_buffer``, ours, the default).

Without the Group Buffer a worker drafted into other workers' groups receives them with phase :data:`DRAFTED` and
must run them before the group generated for its own request (see
:meth:`hetsync.coordinator.group_generator.client.GroupGeneratorClient.request_own_group`).
"""

from __future__ import annotations

from typing import Optional

from .groups import Group, _G
from .protocol import _BaseGroupGenerator

__all__ = ["DRAFTED", "RandomGroupGenerator"]

DRAFTED = "drafted"  # phase of a group handed to a member it was not generated for (random GG, no Group Buffer)


class RandomGroupGenerator(_BaseGroupGenerator):
    """§4.1 random GG: a uniformly random group of ``group_size`` live workers containing the requester (clipped
    to the live workers), whatever their state, except away workers (nobody must wait for them: fewer others give
    a smaller group, none a singleton); groups that conflict with locked workers wait in the FIFO pending group
    queue until the locks are released.

    ``group_buffer=False`` (the paper's §4.1 rule, not the default): *every* synchronization request gets a fresh
    random group,
    even from a worker that other workers already drafted into their groups.  P-Reduce is a collective, so a
    drafted worker must still run those groups (Fig 8 ⑤ "GG notifies the workers"): in this pull model its next
    request hands them out first, oldest first, marked with phase ``"drafted"``; the worker runs and acks each and
    asks again (a *continuation*: no new request, no new group) until it receives the group generated for its own
    request.  A worker thus runs about ``group_size`` P-Reduces per step, which is the cost §5.1 removes.

    ``group_buffer=True`` (default; §5.1's Group Buffer applied to random groups, our variant): a request is served
    from the worker's buffer when it is not empty, and only a worker with an empty buffer gets a new random group:
    one P-Reduce per step.  It measured 1.8x faster to the target loss (README "Ripples: paper rules and ours").
    """

    mode = "random"

    def __init__(self, size: int, group_size: int = 3, group_buffer: bool = True, **kw):
        super().__init__(size, group_size=group_size, **kw)
        self.group_buffer = bool(group_buffer)
        self._own: list[Optional[int]] = [None] * self.size  # gid generated for the worker's last request
        self._mid_step = [False] * self.size  # the worker's last hand-out was a drafted group: its step goes on

    def _generate(self, requester: int, now: float) -> None:
        others = [u for u in self._draftable() if u != requester]
        k = min(self.group_size - 1, len(others))
        chosen = self._rng.sample(others, k) if k else []
        self._own[requester] = self._new_group([requester] + chosen, requester, "random", now).gid

    def _needs_group(self, w: int) -> bool:
        return not self.group_buffer or not self._queue[w]

    def _continues(self, w: int) -> bool:
        return not self.group_buffer and self._own[w] in self._queue[w]

    def _counts_request(self, w: int) -> bool:
        """A request after a drafted group is the same step's, also when its own group was dropped meanwhile (its
        other members finished): it makes a new own group but is not a new request."""
        return not self._mid_step[w]

    def _public_for(self, g: _G, w: int) -> Group:
        drafted = not (self.group_buffer or g.gid == self._own[w] or len(g.members) == 1)
        self._mid_step[w] = drafted
        return Group(g.gid, tuple(g.members), DRAFTED) if drafted else g.public()
