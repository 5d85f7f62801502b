"""The job's coordinator services: rank 0 hosts them, every rank finds them on its own (Ripples §6.2).

``hetsync.init()`` creates one ``JobServices`` per process.  Rank 0 starts the Group Generator's gRPC server (bound
to loopback when the whole job is on one host, else to this host's address) with a fresh per-job secret, and the
address and secret reach every rank through a Horovod broadcast.  The GG starts with the smart generator; a
``ripples-*`` optimizer installs the generator its mode and options ask for (``configure``, collective).  After a
consensus round the generator takes every worker back (``reset``: ``resume``), keeping its state (the §5.3 request
counters) from one epoch to the next.  At ``hetsync.shutdown()`` every worker tells the GG it finished (serving the
groups it still owes), and rank 0 stops the server once every worker has finished or the timeout has passed.
"""
import logging
import socket
import time

from hetsync.algorithms.hop_topology import machines
from hetsync.coordinator._proto import ensure_generated
from hetsync.coordinator.group_generator import make_generator
from hetsync.coordinator.group_generator.client import GroupGeneratorClient
from hetsync.coordinator.job_clock.client import JobClockClient
from hetsync.coordinator.server import start_for_job
from hetsync.coordinator.state_server import service as state_server_service
from hetsync.coordinator.state_server.client import StateServerClient
from hetsync.coordinator.switchboard.client import SwitchClient

log = logging.getLogger("hetsync.coordinator")


def _barrier(hvd, name):
    import tensorflow as tf

    hvd.allreduce(tf.constant(0.0), name=name)


class JobServices:
    """Per-process handle on the job's coordinator services (rank 0 also owns the server)."""

    def __init__(self, hvd, timeout):
        ensure_generated()
        self.hvd, self.timeout = hvd, float(timeout)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.hosts = hvd.allgather_object(socket.gethostname(), name="hetsync.hosts")
        self.server, self._client, self.config = None, None, None
        self.owed_p_reduce = None  # set by the GG algorithm: runs a group this worker still owes
        self._stoppers = []        # callables run first at stop(): threads modes started (GG away watchers)
        self._channels = []        # State Server clients handed out (closed at stop)
        self._phase = 0
        self._totals = {}  # rank 0: counters of the generators replaced so far
        info = None
        if self.rank == 0:
            info = self._start_server()
        info = hvd.broadcast_object(info, root_rank=0, name="hetsync.gg.address")
        if isinstance(info, str):
            raise RuntimeError(f"rank 0 could not start the Group Generator: {info}")
        self.address, self.secret = info

    def _start_server(self):
        try:
            self.server = start_for_job(self.size, node_of=self.hosts, mode="smart", request_wait_s=self.timeout)
        except Exception as exc:  # reported on every rank through the broadcast
            return f"{type(exc).__name__}: {exc}"
        return self.server.address, self.server.secret

    def client(self):
        """This rank's GG client (connected on first use)."""
        if self._client is None:
            self._client = GroupGeneratorClient(self.address, self.secret, self.rank, timeout=self.timeout,
                                                connect_timeout=self.timeout)
        return self._client

    def configure(self, mode, options, worker_options=None):
        """Collective: every rank passes the same GG ``mode`` and ``options``; rank 0 installs that generator.

        ``worker_options`` (e.g. the wire compression) are not the generator's but must agree too.  Ranks that
        disagree get a ValueError on every rank naming them (a silent mix would deadlock or mismatch).  The same
        configuration as the generator in place (a live switch back to the mode) keeps that generator: see
        :meth:`reset`.
        """
        mine = repr((mode, sorted(options.items()), sorted((worker_options or {}).items())))
        everyone = self.hvd.allgather_object(mine, name="hetsync.gg.config")
        differ = [r for r, cfg in enumerate(everyone) if cfg != everyone[0]]
        if differ:
            raise ValueError(f"ranks {differ} configured the Group Generator differently from rank 0 "
                             f"(rank 0: {everyone[0]}; rank {differ[0]}: {everyone[differ[0]]})")
        generator_options = self._generator_options(mode, options)  # a bad node_size raises on every rank
        if self.config == (mode, dict(options)):
            self.reset()
            return
        self.config = (mode, dict(options))
        self._install(lambda: make_generator(mode, self.size, **generator_options))

    def reset(self):
        """Collective, at a sync point (after a consensus round): the generator takes every worker back
        (``resume``).  Its state survives: the §5.3 request counters, the §5.2 head rotation, its random stream."""
        if self.config is not None:
            self._install(None)

    def _generator_options(self, mode, options):
        """The generator's constructor options: ``node_size`` (an int or a list of machine sizes, Hop's
        ``machines``) becomes the smart generator's ``node_of``; None uses the real placement (``self.hosts``)."""
        options = dict(options)
        node_size = options.pop("node_size", None)
        if mode == "smart":
            try:
                blocks = machines(self.size, node_size) if node_size is not None else None
            except ValueError as exc:
                raise ValueError(f"sync='ripples-smart': option node_size={node_size!r}: {exc}") from None
            if blocks is None:
                options["node_of"] = self.hosts
            else:
                node = {r: n for n, block in enumerate(blocks) for r in block}
                options["node_of"] = [node[r] for r in range(self.size)]
        return options

    def _install(self, make):
        """Rank 0 installs ``make()`` (a new generator; its predecessor's counters go to the totals), or with
        ``make=None`` resumes the generator in place; then every rank's client forgets its last group."""
        self._phase += 1
        if self.rank == 0:
            generator = self.server.generator
            if make is not None:
                self._add_totals(self.server.metrics())
                generator = make()
            else:
                generator.resume()  # no worker calls the GG now: every rank is in the sync point
            self.server.install(generator)  # under the server's lock; wakes blocked calls
        _barrier(self.hvd, f"hetsync.gg.install.{self._phase}")
        if self._client is not None:
            self._client.reset()

    _COUNTERS = ("groups_formed", "groups_completed", "groups_failed", "singletons", "conflicts", "global_divisions")

    def _add_totals(self, metrics):
        for key in self._COUNTERS:
            self._totals[key] = self._totals.get(key, 0) + metrics.get(key, 0)

    def gg_totals(self):
        """GG counters since the job started (rank 0; other ranks see the current generator's)."""
        current = self.server.metrics() if self.server is not None else self.client().metrics()
        return {key: self._totals.get(key, 0) + current.get(key, 0) for key in self._COUNTERS}

    def install_state_server(self, epsilon):
        """Collective (sync="esync"): rank 0 installs a fresh ESync State Server on the coordinator server."""
        if self.rank == 0:
            state_server_service.install(self.server, self.size, epsilon)
        self._phase += 1
        _barrier(self.hvd, f"hetsync.state.install.{self._phase}")

    def state_client(self):
        """This rank's ESync State Server client (a new one per call)."""
        client = StateServerClient(self.address, self.secret, self.rank, timeout=self.timeout)
        self._channels.append(client)
        return client

    def on_stop(self, fn):
        """``fn()`` runs first at :meth:`stop` (a mode's thread that must end before the services do)."""
        self._stoppers.append(fn)

    def switch_client(self):
        """This rank's Switch Board client (connected on first use; live switches and sync="auto")."""
        if getattr(self, "_switch", None) is None:
            self._switch = SwitchClient(self.address, self.secret, self.rank, timeout=self.timeout)
        return self._switch

    def job_client(self):
        """This rank's Job Clock client (connected on first use; job epochs and the agreed stop step)."""
        if getattr(self, "_job", None) is None:
            self._job = JobClockClient(self.address, self.secret, self.rank, timeout=self.timeout)
        return self._job

    def stop(self, failed=False):
        """Stops every thread, channel and server hetsync started here.  Normally: tells the GG this worker is
        done (running the groups it still owes); rank 0 then waits until every worker is done, at most
        ``timeout`` seconds, and stops the server.  ``failed`` (an exception is ending this process): nothing is
        waited for -- the peers will not come -- and the server stops at once."""
        for fn in self._stoppers:
            fn()
        self._stoppers = []
        if self._client is not None and self.config is not None and not failed:
            try:
                if self.owed_p_reduce is not None:
                    self._client.finish_and_drain(self.owed_p_reduce)
                else:
                    self._client.finish()
            except Exception as exc:  # the job is ending: report, do not mask the real outcome
                # CANCELLED / UNAVAILABLE: rank 0 stopped the server because every rank had finished already (a
                # mode that left the Group Generator at a switch finished there): nothing was lost.
                gone = getattr(exc, "code", None) and exc.code().name in ("CANCELLED", "UNAVAILABLE")
                (log.debug if gone else log.warning)("rank %d could not finish with the Group Generator: %s",
                                                      self.rank, exc)
        if self.server is not None:
            if not failed:
                self._wait_all_finished()
            self.server.stop(grace=0 if failed else 1.0)
            self.server = None
        if self._client is not None:
            self._client.close()
            self._client = None
        for client in self._channels:
            client.close()
        self._channels = []
        for name in ("_job", "_switch"):
            client = getattr(self, name, None)
            if client is not None:
                client.close()
                setattr(self, name, None)

    def _wait_all_finished(self):
        if self.config is None:
            return
        deadline = time.monotonic() + self.timeout
        while True:
            states = self.server.metrics()["state"]
            # "away" workers (between steps, e.g. in a global collective) have not finished either
            left = [r for r, s in enumerate(states) if s not in ("finished", "evicted")]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if left:
            log.warning("stopping the Group Generator although ranks %s did not finish within %gs", left,
                        self.timeout)
