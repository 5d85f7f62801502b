"""End-to-end tests of the Group Generator gRPC service (real server on loopback, real clients, no mocks).

Ripples §6.2: the GG is a light-weight gRPC server; §4.1: request / P-Reduce / ack protocol.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
import time

import grpc
import pytest

from hetsync.coordinator import _proto
from hetsync.coordinator.group_generator.client import (
    AccessDenied,
    GroupGeneratorClient,
    Unavailable,
    WaitTimeout,
    connect_for_job,
)
from hetsync.coordinator.group_generator import DRAFTED, GroupFailed, InvalidArgument, ProtocolViolation, WorkerEvicted
from hetsync.coordinator.server import start_for_job, start_server

# The scripted tests below replay buffered hand-outs (a drafted worker's request returns the drafter's group):
# ripples-random's Group Buffer variant (§5.1); the §4.1 rule is covered by the request/ack loops.
BUFFERED = {"seed": 0, "group_buffer": True}

pb2, pb2_grpc = _proto.load("group_generator")


class Collective:
    """Stands in for the P-Reduce: every member blocks until all members of the group arrived (like a real
    all-reduce would), and each member records the group it saw."""

    def __init__(self, timeout=20.0):
        self.cv = threading.Condition()
        self.arrived = {}
        self.seen = {}  # gid -> {worker: members}
        self.timeout = timeout

    def __call__(self, worker, group):
        with self.cv:
            self.seen.setdefault(group.group_id, {})[worker] = group.members
            got = self.arrived.setdefault(group.group_id, set())
            got.add(worker)
            self.cv.notify_all()
            ok = self.cv.wait_for(lambda: len(self.arrived[group.group_id]) >= len(group.members), self.timeout)
            assert ok, f"P-Reduce of group {group.group_id} {group.members} timed out at worker {worker}"


def run_workers(address, secret, n, iterations, seed=0, checker=None):
    coll = Collective()
    stats, errors = {}, []

    def worker(w):
        rng = random.Random(seed * 100 + w)
        try:
            with GroupGeneratorClient(address, secret, w, timeout=20.0) as c:
                for it in range(iterations):
                    # §4.1 random GG: sync_step (request_own_group) first runs the groups other requests drafted
                    # this worker into, then its own
                    assert c.sync_step(lambda g: coll(w, g), iteration=it).phase != DRAFTED
                    time.sleep(rng.uniform(0.0, 0.003) * (3 if w == 0 else 1))  # "compute"; worker 0 slower
                c.finish_and_drain(lambda g: coll(w, g))
                stats[w] = c.latency_stats()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((w, exc))

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n)]
    stop = threading.Event()

    def monitor():
        # an invariant that breaks is reported to the test through ``errors`` (a bare raise would only end the thread)
        try:
            while not stop.is_set():
                checker()
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(("monitor", exc))

    mon = threading.Thread(target=monitor, daemon=True) if checker else None
    if mon:
        mon.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    if mon:
        mon.join()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return coll, stats


def summarize(stats, kind="request"):
    xs = sorted(x for s in stats.values() for x in [s[kind]["p50"]])
    p99 = max(s[kind]["p99"] for s in stats.values())
    return sorted(xs)[len(xs) // 2], p99


def check_consistent(coll, n):
    for gid, views in coll.seen.items():
        members = {tuple(m) for m in views.values()}
        assert len(members) == 1, f"group {gid} seen differently: {views}"
        (ms,) = members
        assert set(views) == set(ms), f"group {gid} {ms} run by {sorted(views)}"
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for views in coll.seen.values():
        ms = next(iter(views.values()))
        for m in ms[1:]:
            parent[find(m)] = find(ms[0])
    assert len({find(x) for x in range(n)}) == 1  # §3.3 connectivity over the run


@pytest.mark.parametrize(
    "mode,n,opts",
    [
        ("smart", 8, {"group_size": 3, "node_of": [0] * 4 + [1] * 4, "c_thres": 5}),
        ("random", 6, {"group_size": 3, "group_buffer": False}),  # §4.1: drafted groups, then the own one
    ],
)
def test_request_ack_loops_consistent_across_clients(mode, n, opts):
    server, address = start_server(n, mode, dict(opts, seed=3, request_wait_s=30.0))
    try:
        assert address.startswith("127.0.0.1:")
        coll, stats = run_workers(address, server.secret, n, iterations=40, checker=server.check_invariants)
        check_consistent(coll, n)
        server.check_invariants()
        with GroupGeneratorClient(address, server.secret, 0) as c:
            m = c.metrics()
        assert m["mode"] == mode and m["requests"] == [40] * n
        assert m["state"] == ["finished"] * n and m["groups_failed"] == 0
        assert m["active_groups"] == 0 and m["pending_groups"] == 0
        assert m["groups_completed"] > 0 and sum(m["syncs"]) >= 40 * n
        p50, p99 = summarize(stats, "request")
        o50, o99 = summarize(stats, "request_overhead")
        a50, a99 = summarize(stats, "ack")
        print(
            f"\n[{mode} n={n}] RequestGroup latency p50={p50 * 1e3:.2f}ms p99={p99 * 1e3:.2f}ms "
            f"(RPC overhead p50={o50 * 1e3:.2f}ms p99={o99 * 1e3:.2f}ms); Ack p50={a50 * 1e3:.2f}ms "
            f"p99={a99 * 1e3:.2f}ms; conflicts={m['conflicts']} groups={m['groups_formed']}"
        )
    finally:
        server.stop()


def test_single_client_latency():
    server, address = start_server(1, "smart", {"seed": 0})
    try:
        with GroupGeneratorClient(address, server.secret, 0) as c:
            for it in range(300):
                g = c.request_group(it)
                assert g.members == (0,)
            s = c.latency_stats()["request"]
        print(f"\n[1 client] RequestGroup latency p50={s['p50'] * 1e3:.3f}ms p99={s['p99'] * 1e3:.3f}ms n={s['n']}")
        assert s["n"] == 300 and s["p50"] < 0.05
    finally:
        server.stop()


def test_wrong_or_missing_secret_is_refused():
    server, address = start_server(2, "random", BUFFERED)
    try:
        bad = GroupGeneratorClient(address, "not-the-secret", 0)
        for call in (bad.request_group, lambda: bad.ack(1), bad.finish, bad.away, bad.metrics, bad.shutdown_server):
            with pytest.raises(AccessDenied):
                call()
        bad.close()
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
            stub = pb2_grpc.GroupGeneratorStub(ch)
            with pytest.raises(grpc.RpcError) as ei:
                stub.RequestGroup(pb2.GroupRequest(worker=0), timeout=5)  # no secret at all
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # nothing happened on the server
        assert server.metrics()["requests"] == [0, 0]
    finally:
        server.stop()


def test_malformed_requests_are_invalid_argument():
    server, address = start_server(3, "random", dict(BUFFERED, group_size=2))
    try:
        for w in (3, -1, 1000):
            with GroupGeneratorClient(address, server.secret, w) as c:
                with pytest.raises(InvalidArgument):
                    c.request_group()
                with pytest.raises(InvalidArgument):
                    c.finish()
                with pytest.raises(InvalidArgument):
                    c.away()
        with GroupGeneratorClient(address, server.secret, 0) as c:
            with pytest.raises(InvalidArgument):
                c.ack(987654)  # unknown group id
            g = c.request_group()
            outsider = next(w for w in range(3) if w not in g.members)
            with GroupGeneratorClient(address, server.secret, outsider) as o:
                with pytest.raises(InvalidArgument):
                    o.ack(g.group_id)  # not a member
            with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
                stub = pb2_grpc.GroupGeneratorStub(ch)
                # a retry whose previous reply was lost gets the same group again ...
                again = stub.RequestGroup(pb2.GroupRequest(secret=server.secret, worker=0), timeout=5)
                assert again.group_id == g.group_id and list(again.members) == list(g.members)
                # ... but asking for a new group while knowingly holding one is a protocol error
                with pytest.raises(grpc.RpcError) as ei:
                    stub.RequestGroup(
                        pb2.GroupRequest(secret=server.secret, worker=0, last_group_id=g.group_id), timeout=5
                    )
                assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(ProtocolViolation):
                c.request_group()
        server.check_invariants()
    finally:
        server.stop()


def test_wait_deadline_names_the_blocking_workers():
    server, address = start_server(3, "random", dict(BUFFERED, group_size=3, request_wait_s=30.0))
    try:
        c0, c1, c2 = (GroupGeneratorClient(address, server.secret, w, timeout=0.4) for w in range(3))
        g1 = c0.request_group()
        assert g1.members == (0, 1, 2)
        assert c1.request_group() == g1
        c0.ack(g1)
        c1.ack(g1)  # worker 2 has not even fetched group 1 yet
        t0 = time.perf_counter()
        with pytest.raises(WaitTimeout) as ei:
            c0.request_group()  # new group [0,1,2] must wait for worker 2
        assert time.perf_counter() - t0 > 0.35  # it did wait for its deadline (no upper bound: shared machine)
        assert ei.value.awaiting == (2,) and 2 in ei.value.busy
        assert "awaiting worker(s) [2]" in str(ei.value)
        assert c2.request_group() == g1
        done = threading.Event()
        result = {}

        def waiter():
            result["g"] = c0.request_group(timeout=10.0)  # resumes the same wait
            done.set()

        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.1)
        assert not done.is_set()
        assert c2.ack(g1) is True  # the last ack releases the locks and wakes the waiter
        th.join(5)
        assert done.is_set() and result["g"].members == (0, 1, 2) and result["g"].group_id != g1.group_id
        assert c0.metrics()["conflicts"] == 1
        for c in (c0, c1, c2):
            c.close()
    finally:
        server.stop()


def test_never_acking_worker_is_released_over_grpc():
    server, address = start_server(3, "random", dict(BUFFERED, group_size=3, ack_timeout=0.3))
    try:
        c0, c1, c2 = (GroupGeneratorClient(address, server.secret, w, timeout=5.0) for w in range(3))
        g = c0.request_group()
        assert c1.request_group() == g  # worker 2 never shows up: 0 and 1 would hang in their P-Reduce
        time.sleep(0.4)
        for c in (c0, c1):
            with pytest.raises(GroupFailed) as ei:
                c.request_group()
            assert ei.value.workers == (2,) and ei.value.group_id == g.group_id
        g2 = c0.request_group()
        assert g2.members == (0, 1)
        with pytest.raises(WorkerEvicted):
            c2.request_group()
        m = c0.metrics()
        assert m["groups_failed"] == 1 and m["state"][2] == "evicted"
        for c in (c0, c1, c2):
            c.close()
    finally:
        server.stop()


def test_start_for_job_shutdown_and_unreachable():
    server = start_for_job(2, node_of=["hostA", "hostA"], mode="smart", group_size=2)
    assert server.address.startswith("127.0.0.1:") and len(server.secret) >= 32
    c = connect_for_job(server.address, server.secret, 1, timeout=5.0)
    g = c.request_group()
    assert g.members == (0, 1)
    assert c.finish() == []  # implicit ack of the held group
    c.shutdown_server()
    assert server.wait_for_termination(5.0)
    c.close()
    with pytest.raises(Unavailable):
        GroupGeneratorClient(server.address, server.secret, 0, connect_timeout=0.5)


def test_generated_code_is_package_relative_one_proto_per_service():
    """Each service's modules come from its own .proto into its own folder, and the grpc module imports its pb2
    relative to its package (an absolute import would only work with the folder on sys.path)."""
    paths = _proto.ensure_generated()
    assert _proto.generated_files(relative=True) == [
        f"hetsync/coordinator/{service}/{service}{suffix}.py"
        for service in ("group_generator", "state_server", "switchboard", "job_clock")
        for suffix in ("_pb2", "_pb2_grpc")
    ]
    for pb2_path, grpc_path in zip(paths[::2], paths[1::2]):
        service = os.path.basename(os.path.dirname(grpc_path))
        assert os.path.exists(os.path.join(_proto.PROTO_DIR, f"{service}.proto"))
        assert f"from . import {service}_pb2 as" in open(grpc_path).read(), grpc_path
        assert os.path.exists(pb2_path)


def test_stale_generated_code_is_regenerated_in_a_process_that_has_imported_horovod(tmp_path):
    """A rank finds the generated modules missing or older than their .proto (a source checkout, a pulled .proto)
    after it has imported horovod.tensorflow.  protoc's compiler library loaded into such a process crashed it with
    a segmentation fault, so generation runs protoc in a child process.  Checked on a copy of the tree's protos, with
    every service regenerated."""
    coordinator = tmp_path / "hetsync" / "coordinator"
    for service in _proto.SERVICES:
        (coordinator / service).mkdir(parents=True)
    shutil.copy(_proto.__file__, coordinator / "_proto.py")
    shutil.copytree(_proto.PROTO_DIR, tmp_path / "protos")
    code = ("import sys; import horovod.tensorflow.keras; sys.path.insert(0, sys.argv[1]); import _proto; "
            "print(len(_proto.ensure_generated(force=True)))")
    done = subprocess.run([sys.executable, "-c", code, str(coordinator)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == str(2 * len(_proto.SERVICES))
    for service in _proto.SERVICES:
        grpc_text = (coordinator / service / f"{service}_pb2_grpc.py").read_text()
        assert f"from . import {service}_pb2 as" in grpc_text
        assert (coordinator / service / f"{service}_pb2.py").stat().st_size > 0
