"""The Group Generator tests' helpers: ``ScriptedGG`` (scripted "random" choices, to replay the paper's figures)
and the property tests' driver (tests/test_group_generator_properties.py, _away.py): arbitrary
interleavings of requests, acks, finishes and expiries, with the generator's own invariants and the atomicity and
consistency of the groups it hands out checked from outside after every event."""
import random

from hypothesis import strategies as st

from hetsync.coordinator.group_generator import (
    GroupFailed,
    InvalidArgument,
    ProtocolViolation,
    RandomGroupGenerator,
    SmartGroupGenerator,
    WorkerEvicted,
    _BaseGroupGenerator,
)


class ScriptedGG(_BaseGroupGenerator):
    """Random GG whose 'random' choices are scripted, to replay the paper's figures exactly."""

    mode = "scripted"

    def __init__(self, size, script, **kw):
        super().__init__(size, **kw)
        self.script = list(script)

    def _generate(self, requester, now):
        members = self.script.pop(0)
        assert requester in members
        self._new_group(members, requester, "random", now)


class Driver:
    """Drives a generator with arbitrary interleavings and checks, after every event, the generator's own
    invariants plus externally observed atomicity and consistency."""

    def __init__(self, gg):
        self.gg = gg
        self.now = 0.0
        self.handed = {}  # gid -> members as first handed out
        self.open = {}  # gid -> members of groups handed out and not yet completed
        self.events = 0

    def _completed(self, gid):
        return gid not in self.gg._groups

    def _taking_part(self, gid, members):
        """The members that run the group's P-Reduce (AwayDriver: not those that were away before receiving it)."""
        return set(members)

    def observe(self, w, g):
        assert g is not None and w in g.members
        assert self.handed.setdefault(g.group_id, g.members) == g.members, "inconsistent group"
        for gid in [x for x in self.open if self._completed(x)]:
            del self.open[gid]
        for gid, members in self.open.items():
            if gid != g.group_id:
                overlap = self._taking_part(gid, members) & self._taking_part(g.group_id, g.members)
                assert not overlap, f"atomicity: {overlap} in groups {gid} and {g.group_id}"
        if not g.is_singleton:
            self.open[g.group_id] = g.members

    def step(self, w, kind):
        gg = self.gg
        state = gg.worker_state(w)
        self.events += 1
        try:
            if kind == 3:
                for g in gg.finish(w, self.now):
                    self.observe(w, g)
            elif kind == 4:
                self.now += 1.0
                gg.expire(self.now)
            elif kind == 5:
                gid = random.Random(self.events).randint(1, gg._next_gid + 2)
                try:
                    gg.ack(w, gid, self.now)
                except (InvalidArgument, ProtocolViolation):
                    pass
            elif state in ("idle", "waiting") or kind == 2:
                g = gg.request(w, self.now) if state != "waiting" or kind == 2 else gg.poll(w, self.now)
                if g is not None:
                    self.observe(w, g)
            elif gg.held_group(w) is not None:
                gg.ack(w, gg.held_group(w), self.now)
        except GroupFailed as exc:
            assert w not in exc.workers
        except WorkerEvicted:
            assert state == "evicted"
        except ProtocolViolation:
            assert kind == 2 or state == "finished", (kind, state)
        gg.check_invariants()

    def act(self, w):
        """What a well-behaved worker does next; returns False if it has nothing to do."""
        gg = self.gg
        state = gg.worker_state(w)
        if gg.held_group(w) is not None:
            gg.ack(w, gg.held_group(w), self.now)
        elif state in ("idle", "waiting"):
            try:
                g = gg.request(w, self.now)
            except GroupFailed:
                return True
            if g is not None:
                self.observe(w, g)
        else:
            return False
        gg.check_invariants()
        return True


configs = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["random", "smart"]),
        "size": st.integers(2, 9),
        "group_size": st.integers(2, 4),
        "nodes": st.integers(1, 3),
        "c_thres": st.sampled_from([None, 1, 2, 4]),
        "inter_intra": st.booleans(),
        "ack_timeout": st.sampled_from([None, 3.0, 50.0]),
        "seed": st.integers(0, 2**16),
    }
)
ops = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 12)), min_size=1, max_size=120)


def generator_for(cfg):
    n = cfg["size"]
    if cfg["mode"] == "random":
        return RandomGroupGenerator(n, cfg["group_size"], seed=cfg["seed"], ack_timeout=cfg["ack_timeout"],
                                    group_buffer=cfg["seed"] % 2 == 0)  # §5.1 GB variant and §4.1's rule
    return SmartGroupGenerator(
        n,
        cfg["group_size"],
        node_of=[i % cfg["nodes"] for i in range(n)],
        c_thres=cfg["c_thres"],
        seed=cfg["seed"],
        inter_intra=cfg["inter_intra"],
        ack_timeout=cfg["ack_timeout"],
    )


def drain(gg, d, workers, rounds):
    """Lets ``workers`` run their held/waiting groups and finish (running obligations) until nothing moves."""
    for _ in range(rounds):
        progressed = False
        for w in workers:
            st_ = gg.worker_state(w)
            if gg.held_group(w) is not None or st_ == "waiting":
                progressed |= d.act(w)
            elif st_ == "idle":
                for g in gg.finish(w, d.now):
                    d.observe(w, g)
                progressed = True
            gg.check_invariants()
        if not progressed:
            break
