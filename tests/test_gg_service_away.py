"""The Group Generator's Away RPC end to end (real server on loopback, real clients, no mocks): a worker inside a
global collective is excused, so the others' groups never wait for it (docs/group_generator.md, "Away workers").
The rest of the service: tests/test_gg_service.py."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from hetsync.coordinator import _proto
from hetsync.coordinator.group_generator.client import GroupGeneratorClient
from hetsync.coordinator.group_generator import ProtocolViolation
from hetsync.coordinator.server import start_server

BUFFERED = {"seed": 0, "group_buffer": True}  # as in test_gg_service.py: ripples-random's Group Buffer variant

pb2, pb2_grpc = _proto.load("group_generator")


def test_away_rpc_releases_a_blocked_worker():
    """The deadlock away() exists for: worker 2 went into a global collective without fetching group 1, so worker
    0's next group (which needs 2) would wait forever; Away(2) excuses 2 and worker 0 goes on."""
    server, address = start_server(3, "random", dict(BUFFERED, group_size=3, request_wait_s=30.0))
    try:
        c0, c1, c2 = (GroupGeneratorClient(address, server.secret, w, timeout=20.0) for w in range(3))
        g1 = c0.request_group()
        assert g1.members == (0, 1, 2) and c1.request_group() == g1
        c0.ack(g1)
        c1.ack(g1)
        done = threading.Event()
        result = {}

        def waiter():
            result["g"] = c0.request_group()  # [0,1,2] again: waits for worker 2, which holds the lock of g1
            done.set()

        th = threading.Thread(target=waiter)
        th.start()
        deadline = time.monotonic() + 10
        while server.metrics()["conflicts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not done.is_set()
        g2_id = g1.group_id + 1
        excluded = c1.away()  # does not block, although worker 0's request is blocked in the server
        assert [(g.group_id, g.members) for g in excluded] == [(g2_id, (0, 1, 2))]
        assert c1.away() == []  # idempotent
        time.sleep(0.1)
        assert not done.is_set()  # worker 2 still holds everybody up
        excluded = c2.away()
        assert [g.group_id for g in excluded] == [g1.group_id, g2_id]
        assert all(g.members == (0, 1, 2) for g in excluded)
        th.join(10)
        assert done.is_set() and result["g"].group_id == g2_id and result["g"].members == (0, 1, 2)
        assert c0.ack(result["g"]) is True  # 1 and 2 were excused: worker 0's ack completes it
        m = c0.metrics()
        assert m["away_events"] == 2 and m["state"] == ["live", "away", "away"]
        assert m["active_groups"] == 0 and m["pending_groups"] == 0
        assert c1.request_group().members == (0, 1)  # back; worker 2, still away, is not drafted
        assert c0.metrics()["state"] == ["live", "live", "away"]
        server.check_invariants()
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
            stub = pb2_grpc.GroupGeneratorStub(ch)
            for req, code in (
                (pb2.AwayRequest(worker=0), grpc.StatusCode.PERMISSION_DENIED),
                (pb2.AwayRequest(secret="wrong", worker=0), grpc.StatusCode.PERMISSION_DENIED),
                (pb2.AwayRequest(secret=server.secret, worker=3), grpc.StatusCode.INVALID_ARGUMENT),
                (pb2.AwayRequest(secret=server.secret, worker=-1), grpc.StatusCode.INVALID_ARGUMENT),
            ):
                with pytest.raises(grpc.RpcError) as ei:
                    stub.Away(req, timeout=5)
                assert ei.value.code() == code
        assert c0.metrics()["away_events"] == 2  # refused calls changed nothing
        for c in (c0, c1, c2):
            c.close()
    finally:
        server.stop()


def test_away_while_own_request_is_blocked_abandons_it():
    """Away while the same worker is inside RequestGroup (the runtime's away watcher can race a step's request,
    see the next test): the blocked request is abandoned (its group is excused) and fails with
    FAILED_PRECONDITION instead of hanging."""
    server, address = start_server(2, "random", dict(BUFFERED, group_size=2, request_wait_s=30.0))
    try:
        c0, c1 = (GroupGeneratorClient(address, server.secret, w, timeout=20.0) for w in range(2))
        g1 = c0.request_group()
        c0.ack(g1)  # worker 1 never fetched g1: worker 0's next group [0,1] waits for it
        errors = []

        def waiter():
            try:
                c0.request_group()
            except ProtocolViolation as exc:
                errors.append(exc)

        th = threading.Thread(target=waiter)
        th.start()
        deadline = time.monotonic() + 10
        while server.metrics()["conflicts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [g.group_id for g in c0.away()] == [g1.group_id + 1]
        th.join(10)
        assert not th.is_alive() and len(errors) == 1 and "went away while waiting" in str(errors[0])
        server.check_invariants()
        for c in (c0, c1):
            c.close()
    finally:
        server.stop()


def test_ripples_request_asks_again_after_a_stale_away_report():
    """The race behind the test above, as the runtime meets it: the away watcher read "away" just before the
    worker's step began and its report abandons the step's request.  ripples-random's request asks again (the
    worker is in its step) instead of failing the step, and gets its group once the partner comes."""
    from types import SimpleNamespace

    from hetsync.algorithms.ripples_gg import RipplesRandom

    server, address = start_server(2, "random", dict(BUFFERED, group_size=2, request_wait_s=30.0))
    try:
        c0, c1 = (GroupGeneratorClient(address, server.secret, w, timeout=20.0) for w in range(2))
        g1 = c0.request_group()
        c0.ack(g1)
        algo = RipplesRandom.__new__(RipplesRandom)  # only its request logic, with a real client
        algo.client, algo.services = c0, SimpleNamespace(rank=0)
        got = []
        th = threading.Thread(target=lambda: got.append(algo._request(5)))
        th.start()
        deadline = time.monotonic() + 10
        while server.metrics()["conflicts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        c0.away()  # the stale report: abandons the blocked request; _request asks again
        assert c1.request_group().group_id == g1.group_id  # worker 1 runs the group it owed
        c1.ack(g1)
        for _ in range(3):  # worker 1 runs the groups it still holds until it meets worker 0's new request
            g = c1.request_group()
            th.join(2)
            if not th.is_alive():
                break
            c1.ack(g)
        assert not th.is_alive() and len(got) == 1, got
        assert int(got[0][0]) == g.group_id and list(got[0][1]) == [0, 1]
        for c in (c0, c1):
            c.close()
    finally:
        server.stop()
