"""Rank 0's coordinator server: one gRPC server (one port, one job secret) hosting every coordinator service --
the Ripples Group Generator (§6.2: "a light-weight Python program implemented by gRPC"), ESync's State Server, the
Switch Board and the Job Clock.  Each service lives in its own folder (state machine, servicer, client, and its
``protos/<service>.proto``); this module only owns what they share: the port, the secret, the thread pool and the
one lock (a condition variable) every servicer runs its state machine under.

Rank 0 calls :func:`start_for_job` during ``hetsync.init()`` and broadcasts ``(server.address, server.secret)``;
every rank then connects each service's client to that address
(:class:`~hetsync.coordinator.group_generator.client.GroupGeneratorClient` and the others).
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

from .group_generator import _BaseGroupGenerator, make_generator
from .group_generator import service as group_generator_service
from .job_clock import service as job_clock_service
from .state_server import service as state_server_service
from .switchboard import service as switchboard_service

__all__ = ["GGServer", "start_server", "start_for_job", "format_address"]

# server-level options (the rest go to the generator's constructor)
_SERVER_OPTIONS = ("request_wait_s", "max_workers", "secret", "clock")


def format_address(host: str, port: int) -> str:
    """``host:port`` with IPv6 literals bracketed."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class GGServer:
    """Rank 0's running coordinator server (the Group Generator and the services beside it).

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
        group_generator_service.add_to_server(self, self._server)
        # ESync's State Server shares the port and the secret; sync="esync" installs one (state_server.service.install).
        self.state_server = None
        state_server_service.add_to_server(self, self._server)
        # The Switch Board (live mode switches, sync="auto") and the Job Clock (job epochs, the agreed stop step).
        switchboard_service.add_to_server(self, self._server)
        job_clock_service.add_to_server(self, self._server)
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
    :class:`~hetsync.coordinator.group_generator.client.GroupGeneratorClient` on each.  Call ``server.stop()`` at shutdown.
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
