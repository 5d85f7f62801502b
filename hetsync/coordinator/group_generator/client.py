"""Worker-side client of the Ripples Group Generator service (§4.1 protocol, §6.2 gRPC).

Per training step (Fig 7)::

    g = client.request_group(iteration=step)     # blocks until the group is ready
    if not g.is_singleton:
        p_reduce(g.members)                       # collective among g.members (sorted world ranks)
    client.ack(g)                                 # releases the locks once every member acked

After the last step::

    for g in client.finish():                    # groups already started by other members
        p_reduce(g.members); client.ack(g)

When the worker leaves its training step for something that may block (a global collective, validation), its
runtime calls ``client.away()`` and registers the returned groups with the engine as excluded; the next
``request_group`` brings the worker back.

:meth:`GroupGeneratorClient.sync_step` and :meth:`GroupGeneratorClient.finish_and_drain` do exactly this.

With ripples-random's paper rule (``group_buffer=False``, §4.1) a step's request may first be answered with groups
that other workers' requests drafted this worker into (phase ``"drafted"``): P-Reduce is a collective, so the
worker runs and acks each of them and asks again until it gets the group made for its own request.
:meth:`GroupGeneratorClient.request_own_group` runs that loop (``sync_step`` uses it); with the Group Buffer (the
default) or the smart GG no group is ever drafted and it is a plain :meth:`~GroupGeneratorClient.request_group`.

The client measures its own RPC latencies (:meth:`GroupGeneratorClient.latency_stats`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional, Sequence, Union

import grpc

from .. import _proto
from .._client import channel
from .errors import GGError, GroupFailed, InvalidArgument, ProtocolViolation, WorkerEvicted
from .groups import Group
from .random_gg import DRAFTED
from .service import MD_AWAITING, MD_EVICTED, MD_GROUP, MD_MEMBERS, MD_WORKERS

pb2, pb2_grpc = _proto.load("group_generator")

__all__ = [
    "GroupGeneratorClient",
    "GroupInfo",
    "connect_for_job",
    "AccessDenied",
    "WaitTimeout",
    "Unavailable",
]

GroupInfo = Group  # what request_group returns: group_id, members (sorted tuple of ranks), phase, is_singleton

_LATENCY_KEEP = 200_000  # samples kept per kind


class AccessDenied(GGError):
    """Wrong or missing job secret (gRPC PERMISSION_DENIED)."""


class WaitTimeout(GGError):
    """The group did not become ready in time (gRPC DEADLINE_EXCEEDED).  Calling ``request_group`` again resumes
    the same wait.  ``busy``: members of the group busy in other groups; ``awaiting``: the workers that must still
    receive/ack the groups blocking it."""

    def __init__(self, message: str, group_id: int = 0, members=(), busy=(), awaiting=()):
        super().__init__(message)
        self.group_id = group_id
        self.members = tuple(members)
        self.busy = tuple(busy)
        self.awaiting = tuple(awaiting)


class Unavailable(GGError):
    """The Group Generator cannot be reached or is shutting down."""


def _ints(text: Optional[str]) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x) if text else ()


def _translate(err: grpc.RpcError, worker: int = -1) -> GGError:
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    md = {}
    try:
        md = {k: v for k, v in (err.trailing_metadata() or ())}
    except Exception:  # pragma: no cover
        pass
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return AccessDenied(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(details)
    if code == grpc.StatusCode.ABORTED and MD_WORKERS in md:
        return GroupFailed(int(md.get(MD_GROUP, 0)), _ints(md.get(MD_MEMBERS)), _ints(md.get(MD_WORKERS)))
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if MD_EVICTED in md:
            exc = WorkerEvicted(worker, int(md[MD_EVICTED]))
            exc.args = (details,)
            return exc
        return ProtocolViolation(details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return WaitTimeout(
            details,
            int(md.get(MD_GROUP, 0) or 0),
            _ints(md.get(MD_MEMBERS)),
            _ints(md.get(MD_WORKERS)),
            _ints(md.get(MD_AWAITING)),
        )
    return Unavailable(f"{code}: {details}")


def _to_group(msg) -> Group:
    return Group(int(msg.group_id), tuple(int(m) for m in msg.members), msg.phase or "random")


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    idx = min(len(sorted_xs) - 1, max(0, int(round(q / 100.0 * (len(sorted_xs) - 1)))))
    return sorted_xs[idx]


class GroupGeneratorClient:
    """Client of one worker (``worker`` = its world rank).

    ``timeout``: how long :meth:`request_group` may wait for its group (the server answers ``WaitTimeout`` naming
    the blocking workers); other RPCs use ``rpc_timeout``.  ``connect_timeout``: how long the constructor waits
    for the server to be reachable.  Not meant to be shared between threads of different workers.
    """

    def __init__(
        self,
        address: str,
        secret: str,
        worker: int,
        timeout: float = 300.0,
        rpc_timeout: float = 30.0,
        connect_timeout: Optional[float] = 30.0,
    ):
        self.address = address
        self.worker = int(worker)
        self.timeout = float(timeout)
        self.rpc_timeout = float(rpc_timeout)
        self._secret = secret or ""
        self._channel = channel(address)
        self._stub = pb2_grpc.GroupGeneratorStub(self._channel)
        self._last_group_id = 0
        self._held: Optional[Group] = None
        self._lat: dict[str, list[float]] = {
            "request": [], "request_overhead": [], "ack": [], "finish": [], "away": []
        }
        self._lat_lock = threading.Lock()
        if connect_timeout is not None:
            try:
                grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
            except grpc.FutureTimeoutError as exc:
                self._channel.close()
                raise Unavailable(f"group generator at {address} not reachable within {connect_timeout}s") from exc

    # ------------------------------------------------------------------ RPCs
    def request_group(self, iteration: int = -1, timeout: Optional[float] = None) -> Group:
        """Block until this worker's next group is ready and return it (``group_id``, sorted ``members``).

        A singleton (``members == (worker,)``) means "skip synchronization this step".  Raises
        :class:`WaitTimeout` (call again to keep waiting), :class:`GroupFailed` (once, after a group this worker
        held failed; call again to go on), :class:`WorkerEvicted`, :class:`ProtocolViolation` (e.g. previous group
        not acked), :class:`AccessDenied`, :class:`InvalidArgument`, :class:`Unavailable`.
        """
        wait = self.timeout if timeout is None else float(timeout)
        req = pb2.GroupRequest(
            secret=self._secret,
            worker=self.worker,
            iteration=int(iteration) if iteration is not None else -1,
            wait_s=wait,
            last_group_id=self._last_group_id,
        )
        t0 = time.perf_counter()
        try:
            reply = self._stub.RequestGroup(req, timeout=wait + 5.0)
        except grpc.RpcError as err:
            raise _translate(err, self.worker) from None
        dt = time.perf_counter() - t0
        self._record("request", dt)
        self._record("request_overhead", max(0.0, dt - reply.server_wait_s))
        group = _to_group(reply)
        self._last_group_id = group.group_id
        self._held = None if group.is_singleton else group
        return group

    def ack(self, group: Union[Group, int]) -> bool:
        """Acknowledge the end of this worker's P-Reduce of ``group`` (a :class:`Group` or a group id).

        Singletons need no ack (no RPC is sent).  Returns ``True`` if this ack completed the group.
        """
        if isinstance(group, Group):
            if group.is_singleton:
                return True
            gid = group.group_id
        else:
            gid = int(group)
        t0 = time.perf_counter()
        try:
            reply = self._stub.Ack(
                pb2.AckRequest(secret=self._secret, worker=self.worker, group_id=gid), timeout=self.rpc_timeout
            )
        except grpc.RpcError as err:
            raise _translate(err, self.worker) from None
        self._record("ack", time.perf_counter() - t0)
        if self._held is not None and self._held.group_id == gid:
            self._held = None
        return bool(reply.group_completed)

    def finish(self) -> list[Group]:
        """Tell the GG this worker is done.  Returns the groups it must still run (P-Reduce + :meth:`ack`), because
        other members already started them; usually empty.  Implicitly acks a held group.  Idempotent."""
        t0 = time.perf_counter()
        try:
            reply = self._stub.Finish(
                pb2.FinishRequest(secret=self._secret, worker=self.worker), timeout=self.rpc_timeout
            )
        except grpc.RpcError as err:
            raise _translate(err, self.worker) from None
        self._record("finish", time.perf_counter() - t0)
        self._held = None
        groups = [_to_group(g) for g in reply.obligations]
        if groups:
            self._last_group_id = groups[-1].group_id
        return groups

    def away(self) -> list[Group]:
        """Tell the GG this worker left its training step, so that nobody waits for it (may be called from a
        background thread while the worker is elsewhere; never blocks on other workers).

        Returns the groups containing this worker that it had not received yet: they now count as acked by it
        and it will never receive them; register their ids with the engine as excluded (their members, who may
        still receive them, see the unchanged member list).  Until the next :meth:`request_group` the worker is
        put into no new group.  Idempotent: ``[]`` while already away.  Do not call it while a
        :meth:`request_group` of this worker is in flight: that request would be abandoned.
        """
        t0 = time.perf_counter()
        try:
            reply = self._stub.Away(pb2.AwayRequest(secret=self._secret, worker=self.worker), timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            raise _translate(err, self.worker) from None
        self._record("away", time.perf_counter() - t0)
        return [_to_group(g) for g in reply.excluded]

    def metrics(self) -> dict:
        """Server-side counters (same keys as the state machine's ``metrics()``)."""
        try:
            m = self._stub.GetMetrics(pb2.MetricsRequest(secret=self._secret), timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            raise _translate(err, self.worker) from None
        ws = sorted(m.workers, key=lambda x: x.worker)
        return {
            "mode": m.mode,
            "size": m.size,
            "groups_formed": m.groups_formed,
            "groups_completed": m.groups_completed,
            "groups_failed": m.groups_failed,
            "singletons": m.singletons,
            "conflicts": m.conflicts,
            "global_divisions": m.global_divisions,
            "away_events": m.away_events,
            "pending_groups": m.pending_groups,
            "active_groups": m.active_groups,
            "requests": [w.requests for w in ws],
            "syncs": [w.syncs for w in ws],
            "waits": [w.waits for w in ws],
            "pending_time_s": [w.pending_time_s for w in ws],
            "max_pending_s": [w.max_pending_s for w in ws],
            "last_iteration": [w.last_iteration for w in ws],
            "state": [w.state for w in ws],
        }

    def shutdown_server(self) -> None:
        """Ask the server to stop (any worker holding the secret may)."""
        try:
            self._stub.Shutdown(pb2.ShutdownRequest(secret=self._secret), timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            raise _translate(err, self.worker) from None

    # ------------------------------------------------------------------ conveniences
    def request_own_group(
        self,
        run_drafted: Callable[[Group], None],
        iteration: int = -1,
        timeout: Optional[float] = None,
        abandoned_retries: int = 0,
    ) -> Group:
        """Request this step's group, first running the groups other workers drafted this worker into.

        Every group answered with phase ``"drafted"`` (ripples-random with ``group_buffer=False``: §4.1 makes a
        fresh group per request, and the groups of other requests that contain this worker are collectives it
        must take part in) is passed to ``run_drafted`` (its P-Reduce) and acked, and the GG is asked again (a
        continuation, not a new request).  Returns the first group that is not drafted: the one made for this
        worker's own request (or, with a Group Buffer, simply the next one); the caller runs and acks it.

        ``abandoned_retries``: how many times a request abandoned by this worker's own :meth:`away` report
        (:class:`ProtocolViolation` "went away while waiting": a background watcher's stale report) is asked again;
        the worker is in its step, and a request brings it back.  Other errors are raised as by
        :meth:`request_group`.
        """
        group = self._request_retrying(iteration, timeout, abandoned_retries)
        while group.phase == DRAFTED:
            run_drafted(group)
            self.ack(group)
            group = self._request_retrying(iteration, timeout, abandoned_retries)
        return group

    def _request_retrying(self, iteration: int, timeout: Optional[float], abandoned_retries: int) -> Group:
        for attempt in range(int(abandoned_retries) + 1):
            try:
                return self.request_group(iteration, timeout)
            except ProtocolViolation as exc:
                if "went away while waiting" not in str(exc) or attempt == abandoned_retries:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def sync_step(self, p_reduce: Callable[[Group], None], iteration: int = -1) -> Group:
        """One synchronization of Fig 7 (steps 3-4): request, ``p_reduce(group)`` unless singleton, ack.

        Drafted groups (ripples-random without a Group Buffer) are run through ``p_reduce`` first (see
        :meth:`request_own_group`); the group returned is this worker's own.
        """
        group = self.request_own_group(p_reduce, iteration)
        if not group.is_singleton:
            p_reduce(group)
            self.ack(group)
        return group

    def finish_and_drain(self, p_reduce: Callable[[Group], None]) -> list[Group]:
        """:meth:`finish`, then run and ack every returned obligation."""
        groups = self.finish()
        for g in groups:
            if not g.is_singleton:
                p_reduce(g)
                self.ack(g)
        return groups

    # ------------------------------------------------------------------ latency
    def _record(self, kind: str, dt: float) -> None:
        with self._lat_lock:
            xs = self._lat[kind]
            xs.append(dt)
            if len(xs) > _LATENCY_KEEP:
                del xs[: len(xs) - _LATENCY_KEEP]

    def latencies(self, kind: str = "request") -> list[float]:
        with self._lat_lock:
            return list(self._lat[kind])

    def latency_stats(self) -> dict:
        """``{kind: {"n", "p50", "p99", "mean", "max"}}`` in seconds for kinds ``request`` (wall time of
        RequestGroup, waiting included), ``request_overhead`` (wall time minus the time the server held the call
        waiting for the group: the pure RPC + decision cost), ``ack``, ``finish`` and ``away``."""
        out = {}
        with self._lat_lock:
            items = {k: sorted(v) for k, v in self._lat.items()}
        for kind, xs in items.items():
            out[kind] = {
                "n": len(xs),
                "p50": _percentile(xs, 50),
                "p99": _percentile(xs, 99),
                "mean": (sum(xs) / len(xs)) if xs else float("nan"),
                "max": xs[-1] if xs else float("nan"),
            }
        return out

    def reset(self) -> None:
        """Forget the last group: the server installed a fresh generator (see ``GGServer.install``)."""
        self._last_group_id = 0
        self._held = None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "GroupGeneratorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect_for_job(address: str, secret: str, worker: int, timeout: float = 300.0, **kwargs) -> GroupGeneratorClient:
    """Every rank's helper, after rank 0 broadcast ``(address, secret)`` from :func:`server.start_for_job`."""
    return GroupGeneratorClient(address, secret, worker, timeout=timeout, **kwargs)
