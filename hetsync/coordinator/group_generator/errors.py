"""Errors of the Group Generator, one class per gRPC status the server maps them to.

They live apart from the state machines so that the client (which re-raises them from gRPC statuses) and the
server (which maps them to statuses) share one vocabulary without importing the generators.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["GGError", "InvalidArgument", "ProtocolViolation", "WorkerEvicted", "GroupFailed", "InvariantViolation"]


class GGError(Exception):
    """Base class of the errors of the Group Generator."""


class InvalidArgument(GGError, ValueError):
    """Malformed request: worker out of range, unknown group id, ack by a non-member (gRPC INVALID_ARGUMENT)."""


class ProtocolViolation(GGError):
    """Well-formed but not allowed now, e.g. a request while holding an un-acked group (FAILED_PRECONDITION)."""


class WorkerEvicted(ProtocolViolation):
    """The worker did not ack a group within ``ack_timeout`` and was removed from the job (FAILED_PRECONDITION)."""

    def __init__(self, worker: int, group_id: int):
        super().__init__(f"worker {worker} was evicted: it did not acknowledge group {group_id} in time")
        self.worker = worker
        self.group_id = group_id


class GroupFailed(GGError):
    """A group the worker held failed: ``workers`` never acked it within ``ack_timeout`` (gRPC ABORTED).

    Raised once, by the next request of each member that held the group without acking it; the request after
    that proceeds normally (without the evicted workers).
    """

    def __init__(self, group_id: int, members: Sequence[int], workers: Sequence[int]):
        self.group_id = int(group_id)
        self.members = tuple(members)
        self.workers = tuple(sorted(workers))
        super().__init__(
            f"group {self.group_id} {list(self.members)} failed: worker(s) {list(self.workers)} did not "
            f"acknowledge it within the ack timeout and were evicted"
        )


class InvariantViolation(AssertionError):
    """Raised by :meth:`check_invariants`."""
