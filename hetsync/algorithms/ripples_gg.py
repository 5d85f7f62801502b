"""``sync="ripples-random"`` and ``sync="ripples-smart"``: Ripples with the Group Generator (Ripples §4.1, §5, §6.2).

Each step a worker updates its parameters locally, asks the GG for its group, P-Reduces its parameters with that
group and acks (Fig 7 steps 2-4, Fig 8).  The GG (a gRPC service rank 0 started at ``hetsync.init()``) guarantees
that overlapping groups never run at the same time and that every member gets the same group in the same order,
which is exactly what the engine's P-Reduce needs.  Inside Keras' compiled train step the request and the ack are
``tf.py_function`` calls around the P-Reduce op (the paper's "client wrapped up as another TensorFlow Python
Operator", §6.2).

ripples-random (§4.1): a random group of ``group_size`` containing the requester, lock vector, pending queue.  By
default (``group_buffer=True``, our variant: §5.1's Group Buffer on random groups, measured faster) a request is
served with a group another worker's request drafted it into, if any: one P-Reduce per step.  ``group_buffer=False``
is §4.1's rule: every request gets a fresh group, and a worker first runs the groups others drafted it into.
ripples-smart (§5): Group Buffer + Global Division, Inter-Intra synchronization by node (``node_size``: an int or a
list of machine sizes, emulating a layout; default the real hosts), slowdown filter with ``c_thres``
(``exclude_laggards`` adds our extra rule).  See docs/group_generator.md for the choices.

Consensus rounds: before a round the worker tells the GG it stops (running the groups it still owes); after it
the GG takes every worker back (``resume``), keeping its state: the §5.3 request counters survive epochs
(hetsync/coordinator/services.py).

Away workers (README "Guarantees"): a P-Reduce is the engine instance (GG_STREAM, group id).  When the engine
counts this worker as away (it left its train step longer than ``away_after`` ago, e.g. blocked in a user's Horovod
collective), a watcher thread tells the GG (``Away``): the GG stops drafting it and excuses it from the groups it
has not received, and the engine is told to answer EXCLUDE for those group ids.  Its next request brings it back.
"""
import logging
import threading

import numpy as np
import tensorflow as tf

from hetsync import _runtime, ops
from hetsync.algorithms import register
from hetsync.algorithms._wrap import wrap_post_update
from hetsync.algorithms.decentralized import DecentralizedAlgorithm
from hetsync.algorithms.options import Option, TIMEOUT

log = logging.getLogger("hetsync.ripples")

GG_STREAM = 2  # engine instance stream: (GG_STREAM, group id) names the same P-Reduce on every member
_WATCH_PERIOD_S = 0.02


class GroupGeneratorAlgorithm(DecentralizedAlgorithm):
    GG_MODE = None
    EXCHANGES_PARAMETERS = True  # the P-Reduce after each local update
    GG_OPTIONS = ()  # options passed to the generator; the others are worker-side

    def wrap(self, optimizer):
        _runtime.require_init(f"sync={self.name!r}")
        self.services = _runtime.services()
        gen_options = {k: self.options[k] for k in self.GG_OPTIONS}
        if gen_options.get("ack_timeout") is None:
            gen_options["ack_timeout"] = _runtime.timeout()
        wire = "fp16" if "fp16" in getattr(self.compression, "__name__", "").lower() else "none"
        self._gen_options, self._wire = gen_options, wire
        self.client = self.services.client()
        self._variables = None
        self._watcher, self._stop_hooked = None, False
        self.away_reports = 0  # over the job, across switches
        return wrap_post_update(optimizer, self)

    # -- away watcher -------------------------------------------------------------------------------------------
    def _start_watcher(self):
        """When the mode is entered (activate): the watcher runs while the mode is in force only (a pretraced mode
        not in force, or one a live switch left, watches nothing)."""
        if self._watcher is not None:
            return
        self._paused = threading.Event()  # set during consensus rounds: the worker left the GG on purpose
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="hetsync-gg-away", daemon=True)
        self._watcher.start()
        if not self._stop_hooked:
            self.services.on_stop(self.stop_watcher)
            self._stop_hooked = True

    def stop_watcher(self):
        """A live switch out of the mode (deactivate) or hetsync.shutdown(): the watcher thread ends (joined), before
        the coordinator services stop."""
        if self._watcher is not None:
            self._stop.set()
            self._watcher.join(timeout=2 * _WATCH_PERIOD_S + 1.0)
            self._watcher = None

    def deactivate(self):
        """A live switch leaves the mode: its away watcher ends (it polled the engine 50 times a second for a mode
        no longer in force); a switch back starts it again (activate)."""
        self.stop_watcher()

    def _watch(self):
        """Tells the GG when the engine counts this worker as away (see the module docstring)."""
        reported = False
        while not self._stop.wait(_WATCH_PERIOD_S):
            try:
                away = ops.engine_away()
                if not away or self._paused.is_set():
                    reported = reported and away
                    continue
                if reported:
                    continue
                excused = self.client.away()
                ops.exclude(GG_STREAM, [g.group_id for g in excused])
                self.away_reports += 1
                reported = True
            except Exception as exc:  # the job may be ending (GG stopped): report once, stop watching
                if not self._stop.is_set():
                    log.warning("rank %d: away watcher stopped: %s", self.services.rank, exc)
                return

    # -- inside the training step -------------------------------------------------------------------------------
    def _request(self, iterations):
        if int(iterations) <= 1:
            # The first step stays local: Horovod's BroadcastGlobalVariablesCallback runs a global collective at
            # the end of the first batch, and a group formed now would wait on workers already inside it.
            return np.int64(0), np.asarray([self.services.rank], dtype=np.int32)
        # ripples-random, §4.1 without a Group Buffer: groups other workers' requests drafted this one into come
        # first; they are collectives, so the client runs each through _p_reduce_group (eagerly: this is the
        # py_function's Python) and asks again, until the group generated for this worker's own request.
        # abandoned_retries: the away watcher may read a stale "away" just before this step began, and its report
        # reach the GG while this request waits: the GG abandons the request; this worker is in its step, so it
        # asks again (a request brings it back).
        group = self.client.request_own_group(self._p_reduce_group, iteration=int(iterations), abandoned_retries=2)
        return np.int64(group.group_id), np.asarray(group.members, dtype=np.int32)

    def _ack(self, group_id, members):
        if len(members) > 1:
            self.client.ack(int(group_id))
        return np.int32(0)

    def after_update(self, variables, iterations):
        self._variables = variables
        group_id, members = tf.py_function(self._request, [iterations], [tf.int64, tf.int32], name="gg_request")
        members.set_shape([None])
        # Singletons (no sync) use the engine's implicit key: group id 0 is not an instance.
        instance = tf.where(tf.size(members) > 1, tf.stack([tf.constant(GG_STREAM, tf.int64), group_id]),
                            tf.zeros([2], tf.int64))
        with tf.control_dependencies([members]):  # read after the request: drafted groups may have averaged them
            values = [tf.identity(v) for v in variables]
        averaged = ops.p_reduce(values, members, timeout=self.options["timeout"], instance=instance,
                                compression=self.compression)
        with tf.control_dependencies(averaged):
            acked = tf.py_function(self._ack, [group_id, members], tf.int32, name="gg_ack")
        with tf.control_dependencies([acked]):
            for var, value in zip(variables, averaged):
                var.assign(value)

    # -- outside the training step (eager) ----------------------------------------------------------------------
    def _p_reduce_group(self, group):
        """Runs a group this worker still owes the GG (eagerly, with its current parameters)."""
        if self._variables is None:
            raise RuntimeError(f"rank owes group {list(group.members)} but has not trained a step yet")
        averaged = ops.p_reduce([tf.convert_to_tensor(v) for v in self._variables], list(group.members),
                                timeout=self.options["timeout"], instance=(GG_STREAM, group.group_id),
                                compression=self.compression)
        for var, value in zip(self._variables, averaged):
            var.assign(value)

    def activate(self):
        """The mode is entered (first use, or a live switch back): the Group Generator serves this mode's
        configuration (another mode may have installed its own meanwhile); the away watcher runs."""
        self.services.configure(self.GG_MODE, self._gen_options, worker_options={"compression": self._wire})
        self.services.owed_p_reduce = self._p_reduce_group
        self._start_watcher()

    def _leave_gg(self):
        self.client.finish_and_drain(self._p_reduce_group)

    def on_consensus_begin(self):
        self._paused.set()
        self._leave_gg()
        super().on_consensus_begin()

    def on_consensus_end(self, finished):
        self.services.reset()
        ops.rejoin()
        if finished:
            self._leave_gg()
            ops.withdraw()
        else:
            self._paused.clear()

    def metrics(self):
        """GG counters (rank 0 sums them over the job) and this worker's request/ack latency."""
        out = {f"gg_{k}": v for k, v in self.services.gg_totals().items()}
        out["gg_away_reports"] = self.away_reports
        for kind, stats in self.client.latency_stats().items():
            if kind in ("request", "request_overhead"):
                out[f"gg_{kind}_p50_ms"] = round(1e3 * stats["p50"], 3)
                out[f"gg_{kind}_p99_ms"] = round(1e3 * stats["p99"], 3)
        return out


_COMMON = {
    "group_size": Option(3, "int", minimum=2, doc="workers per P-Reduce group", paper="Ripples §4.1"),
    "seed": Option(0, "int", minimum=0, doc="the Group Generator's random seed"),
    "ack_timeout": Option(None, "number", minimum=0, above=True, none=True,
                          doc="seconds the Group Generator waits for a member's acknowledgement (None: "
                              "hetsync.init's timeout)"),
    "timeout": TIMEOUT,
}


@register
class RipplesRandom(GroupGeneratorAlgorithm):
    name = "ripples-random"
    GG_MODE = "random"
    OPTIONS = dict(_COMMON,
                   group_buffer=Option(True, "bool",
                                       doc="ours: serve a drafted group instead of a new one (§5.1's Group Buffer;"
                                           " False: §4.1's rule, a fresh group per request)",
                                       paper="Ripples §5.1, §4.1", paper_rule=False))
    GG_OPTIONS = ("group_size", "seed", "ack_timeout", "group_buffer")


@register
class RipplesSmart(GroupGeneratorAlgorithm):
    name = "ripples-smart"
    GG_MODE = "smart"
    OPTIONS = dict(_COMMON,
                   c_thres=Option(5, "int", minimum=1, none=True, doc="conflict threshold (§5.3; None: off)",
                                  paper="Ripples §5.3"),
                   inter_intra=Option(True, "bool", doc="Inter-Intra synchronization (§5.2)", paper="Ripples §5.2"),
                   exclude_laggards=Option(True, "bool",
                                           doc="ours: also leave out workers c_thres behind the fastest (False: "
                                               "§5.3's filter c_i - c_w < C_thres only)", paper="Ripples §5.3",
                                           paper_rule=False),
                   node_size=Option(None, ("int", "list"), minimum=1, none=True,
                                    doc="workers per machine, or a list of machine sizes, for Inter-Intra (None: "
                                        "the real placement by host)", paper="Ripples §5.2"))
    GG_OPTIONS = ("group_size", "seed", "ack_timeout", "c_thres", "inter_intra", "exclude_laggards", "node_size")

