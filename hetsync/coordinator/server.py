"""gRPC server of the Ripples Group Generator (§6.2: "a light-weight Python program implemented by gRPC").

The server wraps one state machine (:class:`~hetsync.coordinator.group_generator.RandomGroupGenerator` or
:class:`~hetsync.coordinator.group_generator.SmartGroupGenerator`) behind a single lock.  ``RequestGroup`` blocks
on a condition variable until the worker's group is ready (Fig 8: a conflicting group waits in the pending queue
until the locks are released by the acks) or until a deadline, then fails with ``DEADLINE_EXCEEDED`` naming the
workers it waits for.  Every request must carry the job secret (``PERMISSION_DENIED`` otherwise).

Rank 0 calls :func:`start_for_job` during ``hetsync.init()`` and broadcasts ``(server.address, server.secret)``;
every rank then builds a :class:`~hetsync.coordinator.client.GroupGeneratorClient`.
"""

from __future__ import annotations

import ipaddress
import secrets as _secrets
import socket
import threading
import time
from concurrent import futures
from typing import Optional, Sequence

import grpc

from hetsync import env as hetsync_env

from . import _proto
from .auth import require_secret
from .group_generator import (
    GGError,
    GroupFailed,
    InvalidArgument,
    ProtocolViolation,
    WorkerEvicted,
    _BaseGroupGenerator,
    make_generator,
)
from .job_service import JobServicer
from .state_service import StateServicer
from .switch_service import SwitchServicer

pb2, pb2_grpc = _proto.load()

__all__ = ["GGServer", "start_server", "start_for_job", "format_address"]

# server-level options (the rest go to the generator's constructor)
_SERVER_OPTIONS = ("request_wait_s", "max_workers", "secret", "clock")
MD_GROUP = "hetsync-group-id"
MD_MEMBERS = "hetsync-members"
MD_WORKERS = "hetsync-workers"  # GroupFailed: the evicted workers; wait timeout: busy members
MD_AWAITING = "hetsync-awaiting"  # wait timeout: workers whose receive/ack is awaited
MD_EVICTED = "hetsync-evicted"


def _csv(xs: Sequence[int]) -> str:
    return ",".join(str(int(x)) for x in xs)


def format_address(host: str, port: int) -> str:
    """``host:port`` with IPv6 literals bracketed."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


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
    def __init__(self, owner: "GGServer"):
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


class GGServer:
    """A running Group Generator service.

    Attributes: ``address`` (``host:port`` to give to the clients), ``secret`` (the job secret), ``generator``
    (the state machine; touch it only under ``lock``).  Use :func:`start_server` / :func:`start_for_job`.
    """

    def __init__(
        self,
        generator: _BaseGroupGenerator,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: Optional[str] = None,
        request_wait_s: float = 300.0,
        max_workers: Optional[int] = None,
        clock=time.monotonic,
    ):
        self.generator = generator
        self.secret = secret or _secrets.token_hex(16)
        self.request_wait_s = float(request_wait_s)
        self.clock = clock
        self.lock = threading.Condition()
        self._cv = self.lock
        self._stopping = False
        self._stopped = threading.Event()
        # One thread per blocked RequestGroup (at most one per worker) plus head-room for acks and metrics.
        max_workers = max_workers or (2 * generator.size + 8)
        self._executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hetsync-gg")
        self._server = grpc.server(
            self._executor,
            options=[("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=None,
        )
        pb2_grpc.add_GroupGeneratorServicer_to_server(_Servicer(self), self._server)
        # ESync's State Server shares the port and the secret; sync="esync" installs one (state_service.install).
        self.state_server = None
        pb2_grpc.add_StateServerServicer_to_server(StateServicer(self), self._server)
        # The Switch Board (live mode switches, sync="auto") too: switch_service.py.
        pb2_grpc.add_SwitchBoardServicer_to_server(SwitchServicer(self, generator.size), self._server)
        # The Job Clock (job epochs, the agreed stop step): job_service.py.
        pb2_grpc.add_JobClockServicer_to_server(JobServicer(self, generator.size), self._server)
        try:
            bound = self._server.add_insecure_port(format_address(host, port))
        except RuntimeError as exc:
            raise OSError(f"group generator could not bind {format_address(host, port)}: {exc}") from exc
        if not bound:
            raise OSError(f"group generator could not bind {format_address(host, port)}")
        self.host = host
        self.port = int(bound)
        self.address = format_address(host, self.port)

    def start(self) -> "GGServer":
        self._server.start()
        return self

    def stop(self, grace: Optional[float] = 1.0) -> None:
        """Stop serving; blocked requests fail with UNAVAILABLE.  Idempotent."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=True)  # its threads end now, not at interpreter exit
        self._stopped.set()

    def install(self, generator: _BaseGroupGenerator) -> None:
        """Replaces the state machine with a fresh one (a new training phase, e.g. after a consensus round).

        Only call it while no worker uses the service (between two global synchronization points); workers then
        call their client's ``reset()``.
        """
        with self._cv:
            if generator.size != self.generator.size:
                raise ValueError(f"new generator is for {generator.size} workers, the job has {self.generator.size}")
            self.generator = generator
            self._cv.notify_all()

    def wait_for_termination(self, timeout: Optional[float] = None) -> bool:
        return self._stopped.wait(timeout)

    def metrics(self) -> dict:
        with self._cv:
            return self.generator.metrics()

    def check_invariants(self) -> None:
        with self._cv:
            self.generator.check_invariants()

    def __enter__(self) -> "GGServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(
    size: int,
    mode: str = "smart",
    options: Optional[dict] = None,
    host: str = "127.0.0.1",
    port: int = 0,
):
    """Start a Group Generator for ``size`` workers; returns ``(server, address)``.

    ``mode``: ``"random"`` (§4.1) or ``"smart"`` (§5).  ``options``: generator options (``group_size``, ``seed``,
    ``ack_timeout``; smart: ``node_of``, ``c_thres``, ``inter_intra``) and server options (``secret``: default a
    fresh random token, read it from ``server.secret``; ``request_wait_s``: how long RequestGroup may block, default
    300; ``max_workers``).  Binds only ``host`` (default loopback); ``port=0`` picks a free port.
    """
    options = dict(options or {})
    srv_opts = {k: options.pop(k) for k in _SERVER_OPTIONS if k in options}
    clock = srv_opts.get("clock", time.monotonic)
    generator = make_generator(mode, size, clock=clock, **options)
    server = GGServer(generator, host=host, port=port, **srv_opts).start()
    return server, server.address


def _routable_host() -> str:
    """A non-loopback IPv4 address of this host, for multi-node jobs (override: HETSYNC_GG_HOST)."""
    env = hetsync_env.get("HETSYNC_GG_HOST")
    if env:
        return env
    candidates = []
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            candidates.append(info[4][0])
    except OSError:
        pass
    for c in candidates:
        if not ipaddress.ip_address(c).is_loopback:
            return c
    raise OSError(
        "could not find a non-loopback address for the group generator; pass host= or set HETSYNC_GG_HOST"
    )


def start_for_job(
    size: int,
    node_of: Optional[Sequence] = None,
    mode: str = "smart",
    host: Optional[str] = None,
    port: int = 0,
    **options,
) -> GGServer:
    """Rank 0's helper: start the GG for a job of ``size`` ranks and return the server.

    ``node_of[rank]`` is the node of each rank (e.g. gathered host names); it drives Inter-Intra synchronization.
    ``host=None`` binds 127.0.0.1 when every rank is on one node, otherwise this host's non-loopback address
    (or ``$HETSYNC_GG_HOST``).  Broadcast ``(server.address, server.secret)`` to all ranks and build a
    :class:`~hetsync.coordinator.client.GroupGeneratorClient` on each.  Call ``server.stop()`` at shutdown.
    """
    if host is None:
        single_node = node_of is None or len(set(node_of)) <= 1
        host = "127.0.0.1" if single_node else _routable_host()
    if mode == "smart" and node_of is not None:
        options["node_of"] = list(node_of)
    server, _ = start_server(size, mode, options, host=host, port=port)
    return server


def main(argv: Optional[Sequence[str]] = None) -> None:  # pragma: no cover - manual use
    """``python -m hetsync.coordinator.server --size 8 --mode smart --nodes 0,0,0,0,1,1,1,1``: run a standalone
    GG (prints ``address`` and ``secret``; the secret can also be given with ``--secret`` or $HETSYNC_GG_SECRET)."""
    import argparse

    ap = argparse.ArgumentParser(description="Ripples Group Generator (gRPC)")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--mode", choices=["random", "smart"], default="smart")
    ap.add_argument("--group-size", type=int, default=3)
    ap.add_argument("--nodes", default="", help="comma-separated node id of each rank")
    ap.add_argument("--c-thres", type=int, default=5, help="slowdown filter threshold; 0 disables it")
    ap.add_argument("--no-inter-intra", action="store_true")
    ap.add_argument("--ack-timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)

    ap.add_argument("--secret", default=hetsync_env.get("HETSYNC_GG_SECRET"))
    args = ap.parse_args(argv)
    opts: dict = {"group_size": args.group_size, "seed": args.seed, "ack_timeout": args.ack_timeout}
    if args.secret:
        opts["secret"] = args.secret
    if args.mode == "smart":
        opts["c_thres"] = args.c_thres or None
        opts["inter_intra"] = not args.no_inter_intra
        if args.nodes:
            opts["node_of"] = args.nodes.split(",")
    server, address = start_server(args.size, args.mode, opts, host=args.host, port=args.port)
    print(f"address={address}", flush=True)
    print(f"secret={server.secret}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
