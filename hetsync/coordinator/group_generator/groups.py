"""What a group is: the public :class:`Group` every member receives, :class:`WaitInfo` diagnostics, and the
generator's private record :class:`_G` with its life-cycle states.

Kept apart from the machinery so that every module of the package (lock vector, protocol, generators) and the
simulation share one definition, with no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Group", "WaitInfo", "PENDING", "ACTIVE", "COMPLETED", "FAILED", "DROPPED"]

PENDING, ACTIVE, COMPLETED, FAILED, DROPPED = "pending", "active", "completed", "failed", "dropped"


@dataclass(frozen=True)
class Group:
    """A group as handed to a worker: identical for every member (§4: consistent group information)."""

    group_id: int
    members: tuple[int, ...]  # sorted world ranks
    phase: str = "random"

    @property
    def is_singleton(self) -> bool:
        """A one-member group: no synchronization this time; no ack needed."""
        return len(self.members) == 1

    def __len__(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class WaitInfo:
    """Why a worker waits: its group, the members still busy, and the workers whose action is awaited."""

    worker: int
    group_id: int
    members: tuple[int, ...]
    waiting_since: float
    busy: tuple[int, ...]  # members of the group locked by / queued behind other groups
    awaiting: tuple[int, ...]  # workers that must still receive/ack the running groups blocking it
    blocking_groups: tuple[int, ...]

    def describe(self) -> str:
        return (
            f"worker {self.worker} waits for group {self.group_id} {list(self.members)}: members {list(self.busy)} "
            f"are busy in group(s) {list(self.blocking_groups)}, awaiting worker(s) {list(self.awaiting)}"
        )


@dataclass(eq=False)
class _G:
    gid: int
    members: list[int]
    creator: Optional[int]
    phase: str
    created_at: float
    state: str = PENDING
    activated_at: Optional[float] = None
    first_handout: Optional[float] = None
    received: dict = field(default_factory=dict)  # worker -> (time, members tuple as handed)
    acked: set = field(default_factory=set)
    excused: set = field(default_factory=set)  # members that went away before receiving it: count as acked
    culprits: tuple = ()

    def participants(self) -> list[int]:
        """The members that take part: all but the excused ones (they are not locked and not waited for)."""
        return [m for m in self.members if m not in self.excused]

    def done(self) -> bool:
        """Every member acked it or is excused from it."""
        return len(self.acked) + len(self.excused) >= len(self.members)

    def public(self) -> Group:
        return Group(self.gid, tuple(self.members), self.phase)
