"""ESync's State Server state machine (hetsync/coordinator/state_server/state_machine.py) with hypothesis.

A discrete-event simulation runs p workers of fixed capabilities (seconds per local step) through Algorithm 1:
query; NOT-READY -> one local step; READY -> wait for the aggregation (all live workers ready), reset.  Checked:
every round ends; the slowest worker is never told NOT-READY once it finished a step of the round; a worker's
blocking time in the aggregation is below its own capability + epsilon (so below the fastest's for the fastest:
§4.1's claim); a worker c times faster than the slowest takes about c local steps per round; away and finished
workers are never waited for; with Algorithm 1's RUN-BATCH-DATA-TEST (capabilities reported by a k = 0 query
before round 0) round 0 is already right; no worker's absolute clock enters a decision.
"""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsync.coordinator.state_server import NOT_READY, READY, StateServer

EPS = 0.005


def simulate(caps, rounds, eps=EPS, away=(), batch_test=False):
    """Runs ``rounds`` aggregations; returns (server, per-round local steps, per-round waits).  A worker reports the
    capability it measured: 0 before its first step, unless ``batch_test``: then every worker first reports its
    capability with a k = 0 query (Algorithm 1 lines 3 and 8; then a barrier)."""
    p = len(caps)
    server = StateServer(p, epsilon=eps)
    for r in away:
        server.away(r)
    live = [r for r in range(p) if r not in away]
    now, steps, waits = 0.0, [], []
    t_e = {r: 0.0 for r in live}
    measured = {r: caps[r] if batch_test else 0.0 for r in live}
    if batch_test:
        for r in live:
            assert server.query(r, 0, caps[r], 0.0, 0.0) == NOT_READY
    for rnd in range(rounds):
        k = {r: 0 for r in live}
        ready_at = {}
        # each live worker: query, step while NOT-READY; events in time order
        pending = {r: now for r in live}  # next query time
        while len(ready_at) < len(live):
            r = min((t, r) for r, t in pending.items() if r not in ready_at)[1]
            t = pending[r]
            answer = server.query(r, k[r], measured[r], t - t_e[r], t)
            slow = server.slowest()
            if r == slow.rank and k[r] >= 1:
                assert answer == READY, f"the slowest worker {r} was told NOT-READY after a step (round {rnd})"
            if answer == READY:
                ready_at[r] = t
            else:
                k[r] += 1
                t_e[r] = t + caps[r]
                measured[r] = caps[r]
                pending[r] = t_e[r]
            assert sum(k.values()) < 10_000, "round never ends"
        agg = max(ready_at.values())
        for r in live:
            waits.append((r, agg - ready_at[r]))
            server.reset(r, rnd + 1, agg)
            t_e[r] = agg
        steps.append(dict(k))
        now = agg
    return server, steps, waits


@settings(max_examples=80, deadline=None)
@given(caps=st.lists(st.floats(0.01, 0.5), min_size=1, max_size=8), rounds=st.integers(1, 6))
def test_rounds_end_slowest_never_held_and_blocking_is_short(caps, rounds):
    server, steps, waits = simulate(caps, rounds, batch_test=True)
    assert server.metrics()["rounds"] == [rounds] * len(caps)
    for r, wait in waits:
        assert wait < caps[r] + EPS + 1e-9, f"worker {r} (c={caps[r]}) blocked {wait} s in the aggregation"
    slowest = max(range(len(caps)), key=lambda r: (caps[r], -r))
    assert all(s[slowest] == 1 for s in steps), steps  # from round 0 on: the batch test measured everyone


@pytest.mark.parametrize("ratio", [1, 2, 5])
def test_a_worker_c_times_faster_takes_about_c_steps(ratio):
    caps = [0.02 / ratio, 0.02 / ratio, 0.02 / ratio, 0.02]
    _, steps, _ = simulate(caps, 5, eps=1e-4, batch_test=True)  # epsilon small against the steps, as §4.1 means
    for s in steps:
        assert s[3] == 1
        assert all(ratio - 1 <= s[r] <= math.ceil(ratio) for r in range(3)), (ratio, s)


def test_away_and_finished_workers_are_not_waited_for():
    caps = [0.01, 0.01, 0.05, 0.2]
    server, steps, _ = simulate(caps, 3, away=(3,), batch_test=True)  # the slow 3 is away: 2 is the slowest now
    assert server.slowest().rank == 2
    assert all(s[2] == 1 for s in steps) and all(s[0] >= 4 for s in steps)
    server.finish(2)
    assert server.slowest().rank in (0, 1)
    with pytest.raises(ValueError, match="worker 2 has finished"):
        server.query(2, 1, 0.05, 0.0, 1.0)


def test_first_step_and_previous_round_rules():
    s = StateServer(2, epsilon=0.0)
    assert s.query(0, 0, 0.1, 0.0, 0.0) == NOT_READY      # k == 0: at least one step per round
    assert s.query(1, 0, 0.5, 0.0, 0.0) == NOT_READY
    assert s.query(1, 1, 0.5, 0.0, 0.5) == READY          # the slowest, after its step
    assert s.query(0, 1, 0.1, 0.0, 0.1) == READY          # the slowest is ready
    s.reset(0, 1, 0.6)
    assert s.query(0, 1, 0.1, 0.0, 0.7) == NOT_READY      # the slowest (1) has not reset yet: previous round
    s.reset(1, 1, 0.6)
    assert s.query(0, 2, 0.1, 0.0, 0.8) == NOT_READY      # rest_time 0.5 - 0.2 = 0.3 > 0.1: another step
    assert s.query(0, 3, 0.1, 0.0, 1.0) == READY          # rest_time 0.1: a step would end after the slowest


def test_batch_data_test_decides_round_zero():
    """Algorithm 1 line 3: with every capability reported before round 0, round 0 already has the slowest take one
    step and a worker 5x faster about 5.  Without it (capabilities 0) round 0 ends after one step everywhere --
    the departure the tests used to skip."""
    caps = [0.01, 0.01, 0.01, 0.05]
    _, steps, _ = simulate(caps, 1, eps=1e-4, batch_test=True)
    assert steps[0][3] == 1 and all(4 <= steps[0][r] <= 5 for r in range(3)), steps
    _, steps, _ = simulate(caps, 1, eps=1e-4)
    assert all(steps[0][r] == 1 for r in range(3)), steps


def test_t_e_is_placed_on_the_servers_clock():
    """The worker's t_e arrives as ``since_finish`` and becomes ``now - since_finish``: rest_time never mixes a
    worker's clock with the server's (§4.1's Algorithm 2 line 8, one clock)."""
    s = StateServer(2, epsilon=0.0)
    s.query(1, 0, 0.5, 0.0, 100.0)
    s.query(0, 0, 0.1, 0.0, 100.0)
    s.query(1, 1, 0.5, 0.25, 100.5)
    assert s.records[1].t_e == 100.25
    s.reset(1, 1, 101.0, 0.125)
    assert s.records[1].t_e == 100.875
    with pytest.raises(ValueError, match="since_finish must be >= 0"):
        s.query(0, 1, 0.1, -1.0, 101.0)


@pytest.mark.parametrize("call, needle", [
    (lambda s: s.query(5, 0, 0.1, 0.0, 0.0), "worker 5 out of range"),
    (lambda s: s.reset(0, 0, 0.0), "already in round 0"),
    (lambda s: s.arrive(7, 0, 0.0), "worker 7 out of range"),
    (lambda s: StateServer(0), "size must be >= 1"),
    (lambda s: StateServer(2, epsilon=-1), "epsilon must be >= 0"),
])
def test_bad_input(call, needle):
    with pytest.raises(ValueError, match=needle):
        call(StateServer(2))


def test_grpc_service_on_loopback_with_the_job_secret():
    """The State Server over real gRPC, on the coordinator server rank 0 runs (same port and secret as the GG)."""
    import grpc
    import time as _time

    from hetsync.coordinator.state_server import service as state_service
    from hetsync.coordinator.state_server.client import StateServerClient
    from hetsync.coordinator.server import start_server

    server, address = start_server(2, mode="random")
    try:
        a = StateServerClient(address, server.secret, 0, timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            a.query(0, 0.1, 0.0)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "no ESync State Server" in e.value.details()
        state_service.install(server, 2, epsilon=0.0)
        b = StateServerClient(address, server.secret, 1, timeout=10)
        now = _time.monotonic()
        assert a.query(0, 0.01, now) is False
        assert b.query(1, 5.0, now) is True                 # the slowest, after a step
        assert a.query_async(1, 0.01, now).result().ready    # the slowest is ready (§4.2's non-blocking form)
        assert abs(server.state_server.records[1].t_e - now) < 0.5  # b's t_e, back on the server's clock
        a.reset(1, now)
        b.reset(1, now)
        a.away()
        assert a.metrics()["state"] == ["away", "live"] and a.metrics()["rounds"] == [1, 1]
        with pytest.raises(grpc.RpcError) as e:
            a.reset(1, now)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "already in round 1" in e.value.details()
        b.finish()
        with pytest.raises(grpc.RpcError) as e:
            b.query(1, 1.0, now)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        wrong = StateServerClient(address, "not-the-secret", 0, timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            wrong.query(0, 0.1, now)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        for c in (a, b, wrong):
            c.close()
    finally:
        server.stop(grace=0.2)


def test_roll_call_waits_for_live_workers_only():
    """arrive/missing: a worker is missing from round t's aggregation until it arrives there (or is past it);
    away and finished workers are never missing; a worker back from away joins the round the others are in."""
    s = StateServer(4)
    assert s.missing(0) == [0, 1, 2, 3]
    s.arrive(0, 0, 1.0)
    s.away(2)
    s.finish(3)
    assert s.missing(0) == [1]
    s.arrive(1, 0, 1.1)
    assert s.missing(0) == []
    s.reset(0, 1, 1.2)
    assert s.missing(1) == [0, 1]          # 1 has not reset yet: it is still at round 0
    s.arrive(2, 5, 1.3)                    # back from away, at the round the others reached meanwhile
    assert s.records[2].round == 5 and s.missing(5) == [0, 1]
    with pytest.raises(ValueError, match="already in round 5"):
        s.arrive(2, 4, 1.4)
    with pytest.raises(ValueError, match="has finished"):
        s.arrive(3, 5, 1.4)


def test_grpc_wait_names_the_worker_that_never_comes():
    """StateWait returns once every live worker arrived; a silent one is named in a DEADLINE_EXCEEDED error."""
    import threading
    import time as _time

    import grpc

    from hetsync.coordinator.state_server import service as state_service
    from hetsync.coordinator.state_server.client import StateServerClient
    from hetsync.coordinator.server import start_server

    server, address = start_server(3, mode="random")
    try:
        state_service.install(server, 3, epsilon=0.0)
        c = [StateServerClient(address, server.secret, r, timeout=10) for r in range(3)]
        done, done1 = [], []
        t = threading.Thread(target=lambda: done.append(c[0].wait(0, 30.0)))
        t.start()
        # the scenario, made rather than hoped for: 0 has arrived (its StateWait is on the server) before 2 goes
        # away and 1 comes; polled on the server's roll call, not slept for
        deadline = _time.monotonic() + 30
        while server.state_server.missing(0) != [1, 2]:
            assert _time.monotonic() < deadline, f"worker 0's wait never arrived: {server.state_server.missing(0)}"
            _time.sleep(0.01)
        t.join(0.5)
        assert t.is_alive() and not done                     # 1 and 2 are not there yet: 0 waits
        c[2].away()
        t1 = threading.Thread(target=lambda: done1.append(c[1].wait(0, 30.0)))
        t1.start()
        t.join(20)
        t1.join(20)
        assert done == [None] and done1 == [None]            # 1 came, 2 is away: nobody waits for it
        c[2].query(0, 0.1, _time.monotonic())                # 2 is live again, and never comes to round 1
        for r in (0, 1):
            c[r].reset(1, _time.monotonic())
        t0 = _time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            c[0].wait(1, 0.5)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # 1 reset but has not arrived at round 1 yet, 2 is silent: both are named, after the wait's own timeout
        assert "worker(s) 1 (last heard" in e.value.details() and ", 2 (last heard" in e.value.details()
        assert _time.monotonic() - t0 >= 0.45
        for x in c:
            x.close()
    finally:
        server.stop(0)


def test_grpc_decisions_do_not_depend_on_the_workers_clocks():
    """Workers on other hosts have unrelated clocks: a worker whose clock is 1000 s ahead (or behind) of the
    server's gets the same decisions as one on the server's clock.  Were its absolute t_e compared with the server's
    clock (Algorithm 2 line 8 taken literally), rest_time would be off by 1000 s: the fast worker would be told
    NOT-READY (or READY) regardless of the slowest's progress."""
    import time as _time

    from hetsync.coordinator.state_server import service as state_service
    from hetsync.coordinator.state_server.client import StateServerClient
    from hetsync.coordinator.server import start_server

    def decisions(offset):
        server, address = start_server(2, mode="random")
        try:
            state_service.install(server, 2, epsilon=0.0)
            clock = (lambda: _time.monotonic() + offset)
            fast = StateServerClient(address, server.secret, 0, timeout=10, clock=clock)
            slow = StateServerClient(address, server.secret, 1, timeout=10, clock=clock)
            got = [slow.query(0, 2.0, clock()), fast.query(0, 0.01, clock())]
            # the slowest (c = 2 s) just finished nothing yet this round: 2 s left, the fast one takes another step
            slow.reset(1, clock()), fast.reset(1, clock())
            got.append(fast.query(1, 0.01, clock()))
            # ... until its step would end after the slowest's: the slowest's step ended 1.995 s ago
            slow.query(1, 2.0, clock() - 1.995)
            slow.reset(2, clock() - 1.995)
            got.append(fast.query(1, 0.01, clock()))
            for c in (fast, slow):
                c.close()
            return got
        finally:
            server.stop(0)

    expected = [False, False, False, True]
    assert decisions(0.0) == expected
    assert decisions(1000.0) == expected and decisions(-1000.0) == expected
