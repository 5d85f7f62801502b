"""The Group Generator's gRPC servicer (Ripples §6.2: "a light-weight Python program implemented by gRPC"), hosted
by rank 0's coordinator server (:mod:`hetsync.coordinator.server`).

It wraps the server's state machine (:class:`~hetsync.coordinator.group_generator.RandomGroupGenerator` or
:class:`~hetsync.coordinator.group_generator.SmartGroupGenerator`) behind the server's single lock.  ``RequestGroup``
blocks on that condition variable until the worker's group is ready (Fig 8: a conflicting group waits in the
pending queue until the locks are released by the acks) or until a deadline, then fails with ``DEADLINE_EXCEEDED``
naming the workers it waits for.  Every request must carry the job secret (``PERMISSION_DENIED`` otherwise).  The
wire format is ``protos/group_generator.proto``; errors travel as status codes plus the trailing metadata below.
"""

from __future__ import annotations

import threading
from typing import Optional, Sequence

import grpc

from .. import _proto
from ..auth import require_secret
from .errors import GGError, GroupFailed, InvalidArgument, ProtocolViolation, WorkerEvicted

pb2, pb2_grpc = _proto.load("group_generator")

# Trailing metadata of the errors (read back by client.py)
MD_GROUP = "hetsync-group-id"
MD_MEMBERS = "hetsync-members"
MD_WORKERS = "hetsync-workers"  # GroupFailed: the evicted workers; wait timeout: busy members
MD_AWAITING = "hetsync-awaiting"  # wait timeout: workers whose receive/ack is awaited
MD_EVICTED = "hetsync-evicted"


def _csv(xs: Sequence[int]) -> str:
    return ",".join(str(int(x)) for x in xs)


def _group_pb(g, wait_s: float = 0.0):
    return pb2.Group(group_id=g.group_id, members=list(g.members), phase=g.phase, server_wait_s=wait_s)


class _Abort(Exception):
    def __init__(self, code, details: str, metadata=()):
        super().__init__(details)
        self.code, self.details, self.metadata = code, details, tuple(metadata)


def _map_error(exc: GGError) -> _Abort:
    if isinstance(exc, GroupFailed):
        return _Abort(
            grpc.StatusCode.ABORTED,
            str(exc),
            ((MD_GROUP, str(exc.group_id)), (MD_MEMBERS, _csv(exc.members)), (MD_WORKERS, _csv(exc.workers))),
        )
    if isinstance(exc, WorkerEvicted):
        return _Abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc), ((MD_EVICTED, str(exc.group_id)),))
    if isinstance(exc, ProtocolViolation):
        return _Abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, InvalidArgument):
        return _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    return _Abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")  # pragma: no cover


class _Servicer(pb2_grpc.GroupGeneratorServicer):
    def __init__(self, owner):
        self._o = owner

    # -- helpers
    def _auth(self, secret: str, context) -> None:
        require_secret(secret, self._o.secret, context)

    def _run(self, context, fn):
        """Run ``fn`` under the lock; translate GG errors to gRPC status codes; wake waiters on changes."""
        o = self._o
        err: Optional[_Abort] = None
        with o._cv:
            before = o.generator.version
            try:
                result = fn()
            except GGError as exc:
                err = _map_error(exc)
            except _Abort as exc:
                err = exc
            if o.generator.version != before:
                o._cv.notify_all()
        if err is not None:
            if err.metadata:
                context.set_trailing_metadata(err.metadata)
            context.abort(err.code, err.details)
        return result

    # -- RPCs
    def RequestGroup(self, request, context):
        self._auth(request.secret, context)
        o = self._o
        gen = o.generator
        start = o.clock()
        wait_s = request.wait_s if request.wait_s > 0 else o.request_wait_s
        remaining = context.time_remaining()
        if remaining is not None:  # answer with our own, more informative, deadline error before the client's
            wait_s = min(wait_s, max(0.0, remaining - 0.25))
        deadline = start + wait_s
        worker = request.worker
        iteration = request.iteration

        def body():
            group = gen.request(worker, o.clock(), iteration, request.last_group_id)
            while group is None:
                if o._stopping:
                    raise _Abort(grpc.StatusCode.UNAVAILABLE, "group generator is shutting down")
                now = o.clock()
                if now >= deadline:
                    info = gen.wait_info(worker)
                    if info is None:  # pragma: no cover - defensive
                        raise _Abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"worker {worker} waited {wait_s:.3f}s")
                    raise _Abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"waited {now - start:.3f}s; {info.describe()}; request again to keep waiting",
                        (
                            (MD_GROUP, str(info.group_id)),
                            (MD_MEMBERS, _csv(info.members)),
                            (MD_WORKERS, _csv(info.busy)),
                            (MD_AWAITING, _csv(info.awaiting)),
                        ),
                    )
                if not context.is_active():  # the client went away; its request stays outstanding
                    raise _Abort(grpc.StatusCode.CANCELLED, "client cancelled")
                timeout = min(deadline - now, 0.5)
                nd = gen.next_deadline()
                if nd is not None:
                    timeout = min(timeout, max(nd - now, 0.001))
                before = gen.version
                o._cv.wait(timeout)
                group = gen.poll(worker, o.clock())
                if gen.version != before:
                    o._cv.notify_all()
            return group

        group = self._run(context, body)
        return _group_pb(group, o.clock() - start)

    def Ack(self, request, context):
        self._auth(request.secret, context)
        o = self._o
        done = self._run(context, lambda: o.generator.ack(request.worker, request.group_id, o.clock()))
        return pb2.AckReply(group_completed=bool(done))

    def Finish(self, request, context):
        self._auth(request.secret, context)
        o = self._o
        groups = self._run(context, lambda: o.generator.finish(request.worker, o.clock()))
        return pb2.FinishReply(obligations=[_group_pb(g) for g in groups])

    def Away(self, request, context):
        self._auth(request.secret, context)
        o = self._o
        groups = self._run(context, lambda: o.generator.away(request.worker, o.clock()))
        return pb2.AwayReply(excluded=[_group_pb(g) for g in groups])

    def GetMetrics(self, request, context):
        self._auth(request.secret, context)
        m = self._run(context, self._o.generator.metrics)
        return metrics_to_pb(m)

    def Shutdown(self, request, context):
        self._auth(request.secret, context)
        threading.Thread(target=self._o.stop, kwargs={"grace": 0.5}, daemon=True).start()
        return pb2.ShutdownReply()


def metrics_to_pb(m: dict):
    workers = [
        pb2.WorkerMetrics(
            worker=w,
            requests=m["requests"][w],
            syncs=m["syncs"][w],
            waits=m["waits"][w],
            pending_time_s=m["pending_time_s"][w],
            max_pending_s=m["max_pending_s"][w],
            state=m["state"][w],
            last_iteration=m["last_iteration"][w],
        )
        for w in range(m["size"])
    ]
    return pb2.Metrics(
        mode=m["mode"],
        size=m["size"],
        groups_formed=m["groups_formed"],
        groups_completed=m["groups_completed"],
        groups_failed=m["groups_failed"],
        singletons=m["singletons"],
        conflicts=m["conflicts"],
        global_divisions=m["global_divisions"],
        away_events=m["away_events"],
        pending_groups=m["pending_groups"],
        active_groups=m["active_groups"],
        workers=workers,
    )


def add_to_server(owner, server: grpc.Server) -> None:
    """Serves the Group Generator of ``owner`` (a :class:`~hetsync.coordinator.server.GGServer`: ``generator``,
    ``secret``, ``clock``, ``request_wait_s``, its condition ``_cv``) on ``server``."""
    pb2_grpc.add_GroupGeneratorServicer_to_server(_Servicer(owner), server)
