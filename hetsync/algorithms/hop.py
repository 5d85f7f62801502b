"""``sync="hop"``: Hop, heterogeneity-aware decentralized training with update and token queues (Hop §3-§6).

Every worker keeps its own parameters and, each iteration k, runs the parallel computation graph of §3.2 (Fig 7)
inside Keras' compiled train step:
  Send x_k to its out-neighbours (the engine's progress thread sends while the step computes) -> Compute the
  gradients on x_k -> Recv(k) from its in-neighbours -> Reduce (eq. 1; eq. 2 with staleness) -> Apply the gradients
  -> enter k + 1: take a token from each out-neighbour, grant one to each in-neighbour (§4.2) -> Send x_{k+1}.
The queues live in the C++ engine (tf_ops/engine/hop*.h; hetsync/ops_hop.py).

Options (the issue's names are the public API):
  topology: "ring", "ring-based" (default), "double-ring", "node-allreduce-ring", or a list of in-neighbour lists
    (hop_topology.py).  The spectral gap of W (eq. 1) is logged on rank 0 at start.
  max_ig: token queue size, the bound on how far a worker runs ahead of an out-neighbour (§4.2).  Default 4.
  backup_workers: N (§4.3): a worker needs |N_in| - N updates per iteration and takes any others already there.
  staleness: s (§4.4): each in-neighbour's newest update no older than s iterations, averaged by eq. (2).
  stale_reduce (with staleness): "received" (§4.4's N_in^(k)(j)): Reduce only the satisfactory updates received
    since the previous Reduce; "newest": every in-neighbour's newest satisfactory update, again each iteration until
    a newer one arrives.  See the README for which is the default and why.
  skip, skip_trigger: J, G (§5): a worker more than G iterations behind all its out-neighbours (read from its
    token counts) jumps up to J iterations, after a Recv(k-1) + Reduce, taking the tokens the jump needs.  Needs
    backup_workers or staleness (with neither, no worker can fall more than one iteration behind an out-neighbour,
    Theorem 1, so it would never jump).  skip_trigger defaults to max_ig // 2.
  node_size, node_links: machines for "node-allreduce-ring" (default: the job's real placement, ranks grouped by
    host, machines of any size) and which workers join neighbouring machines (Fig 21 (b) "gateway", (c) "distinct").
  timeout: seconds a Recv or a token wait may block before it fails naming the neighbours (default: init's).
Defaults give standard decentralized training (D-PSGD on the parallel graph), the paper's baseline.

Like every decentralized mode, workers withdraw from the queues for each global consensus average (epoch ends,
hetsync/training/) and every session then restarts the queues at iteration 0 from the common model.  A worker that stops
early withdraws; its neighbours stop waiting for it (docs/engine.md, "Hop's queues").
"""
import itertools
import logging

import tensorflow as tf

from hetsync import _runtime, ops_hop
from hetsync.algorithms import hop_topology as topo, register
from hetsync.algorithms._wrap import wrap_post_update
from hetsync.algorithms.decentralized import DecentralizedAlgorithm
from hetsync.algorithms.options import Option, TIMEOUT

log = logging.getLogger("hetsync.hop")
_WRAPS = itertools.count()  # queue set names: the n-th wrapped optimizer of the process (same order on all ranks)


@register
class Hop(DecentralizedAlgorithm):
    name = "hop"
    EXCHANGES_GRADIENTS = EXCHANGES_PARAMETERS = True  # the update queues before, the averaging after
    OPTIONS = {
        "topology": Option("ring-based", "list", choices=topo.NAMED,
                           doc="a named graph or a list of in-neighbour lists",
                           paper="Hop §3.1, §7 (Fig 11, Fig 21)"),
        "max_ig": Option(4, "int", minimum=1, doc="token queue size: the most iterations ahead of a neighbour",
                         paper="Hop §4.2"),
        "backup_workers": Option(0, "int", minimum=0, doc="updates per iteration a worker may go without (§4.3)",
                                 paper="Hop §4.3"),
        "staleness": Option(None, "int", minimum=0, none=True, doc="bounded staleness s (§4.4; None: off)",
                            paper="Hop §4.4"),
        "stale_reduce": Option("received", choices=("received", "newest"),
                               doc="with staleness: Reduce only updates received since the last Reduce (§4.4) "
                                   "or every neighbour's newest", paper="Hop §4.4 (eq. 2)"),
        "skip": Option(None, "int", minimum=1, none=True, doc="most iterations one jump skips (§5; None: off)",
                       paper="Hop §5"),
        "skip_trigger": Option(None, "int", minimum=0, none=True,
                               doc="iterations behind every out-neighbour that trigger a jump (None: max_ig // 2)",
                               paper="Hop §5"),
        "node_size": Option(None, ("int", "list"), minimum=1, none=True,
                            doc="workers per machine, or a list of machine sizes (None: the real placement by host)",
                            paper="Hop §7.3.6 (Fig 21)"),
        "node_links": Option("gateway", choices=topo.LINKS,
                             doc="workers joining neighbouring machines: Fig 21 (b) 'gateway', (c) 'distinct' "
                                 "(1 is its older name), or 'all' (ours)", paper="Hop §7.3.6 (Fig 21)"),
        "timeout": TIMEOUT,
    }

    def validate(self):
        o = self.options
        if o["skip"] is not None and not o["backup_workers"] and o["staleness"] is None:
            raise ValueError("skip needs backup_workers >= 1 or staleness: in standard decentralized training a "
                             "worker is never more than one iteration behind an out-neighbour (Hop Theorem 1), so "
                             "it would never jump")
        if o["skip_trigger"] is not None and o["skip"] is None:
            raise ValueError("skip_trigger is set but skip is not: set skip=<max iterations per jump>")
        if _horovod_ready():
            self.graph()  # errors that need the world size: at construction, on every rank

    @property
    def trigger(self):
        g = self.options["skip_trigger"]
        return self.options["max_ig"] // 2 if g is None else g

    def graph(self, size=None, machines=None):
        """in_lists for this job (every rank computes the same), after the checks that need the world size
        (default: Horovod's size; machines from ``node_size``, else the real placement gathered at init)."""
        if size is None:
            import horovod.tensorflow as hvd

            size = hvd.size()
        node_size = self.options["node_size"] or machines or _placement(size)
        in_lists = topo.build(self.options["topology"], size, node_size, self.options["node_links"])
        backup = self.options["backup_workers"]
        short = [i for i, ins in enumerate(in_lists) if ins and backup >= len(ins)]
        if short:
            degree = min(len(in_lists[i]) for i in short)
            raise ValueError(f"backup_workers={backup} must be < |N_in| (Hop §4.3): ranks {short} have only {degree} "
                             f"in-neighbours in topology {self._topology_name()}")
        return in_lists

    def _topology_name(self):
        t = self.options["topology"]
        return repr(t) if isinstance(t, str) else "(user adjacency)"

    def wrap(self, optimizer):
        import horovod.tensorflow as hvd

        _runtime.require_init("sync='hop'")
        self.in_lists = self.graph()
        self.out_lists = topo.out_lists(self.in_lists)
        self.rank = hvd.rank()
        self.spectral_gap = topo.spectral_gap(self.in_lists)
        log.log(logging.INFO if self.rank == 0 else logging.DEBUG, "hop: topology %s: %s", self._topology_name(),
                topo.describe(self.in_lists))
        self.queue = f"hop-{next(_WRAPS)}"
        ops_hop.hop_configure(self.queue, self.in_lists[self.rank], self.out_lists[self.rank],
                              self.options["max_ig"], self.options["backup_workers"], self.options["staleness"],
                              self.compression, self.options["stale_reduce"])
        with tf.init_scope():
            self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_hop_steps")
            self._updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_hop_updates")
            self._waited_us = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_hop_waited_us")
            self._first_send = tf.Variable(True, trainable=False, name="hetsync_hop_first_send")
        return wrap_post_update(optimizer, self)

    # -- the step --------------------------------------------------------------------------------------------
    def _recv_assign(self, variables, offset):
        """Recv(k + offset) + Reduce, written into the variables; returns the info vector."""
        averaged, info = ops_hop.hop_recv([v.read_value() for v in variables], self.queue, offset,
                                          self.options["timeout"])
        assigns = [v.assign(tf.cast(a, v.dtype)) for v, a in zip(variables, averaged)]
        with tf.control_dependencies(assigns):
            return tf.identity(info)

    def before_update(self, grads, variables):
        """Send (only at a session's first step: after_update sends every later x_k), Recv(k), Reduce."""
        def send():
            sent = ops_hop.hop_send([v.read_value() for v in variables], self.queue, self.compression)
            with tf.control_dependencies([sent]):
                return tf.identity(self._first_send.assign(False))

        sent = tf.cond(self._first_send, send, lambda: tf.constant(False))
        with tf.control_dependencies([sent]):
            info = self._recv_assign(variables, 0)
        counted = [self._steps.assign_add(1), self._updates.assign_add(info[1]), self._waited_us.assign_add(info[5])]
        with tf.control_dependencies(counted):
            return [tf.identity(g) for g in grads]

    def after_update(self, variables, iterations):
        """Enter the next iteration (a jump first if §5 says so), then Send the new parameters."""
        steps = tf.constant(1, tf.int64)
        if self.options["skip"] is not None:
            jump = ops_hop.hop_jump(self.queue, self.options["skip"], self.trigger)

            def renew():  # §5: Recv(k' - 1) + Reduce before jumping to k'
                with tf.control_dependencies([self._recv_assign(variables, jump)]):
                    return tf.identity(jump)

            steps = 1 + tf.cond(jump > 0, renew, lambda: tf.constant(0, tf.int64))
        entered = ops_hop.hop_advance(self.queue, steps, self.options["timeout"])
        with tf.control_dependencies([entered]):
            ops_hop.hop_send([v.read_value() for v in variables], self.queue, self.compression)

    def on_consensus_end(self, finished):
        """A new session (rejoin) restarts the queues at iteration 0: its first step sends x_0 again."""
        super().on_consensus_end(finished)
        self._first_send.assign(True)

    # -- reports ---------------------------------------------------------------------------------------------
    def metrics(self):
        """Per-worker: iteration, lag behind the slowest out-neighbour, queue depth (now and max), dropped stale
        updates, skips and skipped iterations, sends made/skipped (§6.2), mean updates reduced per step, seconds
        waited in Recv, and per neighbour its token count and iteration gap (its iteration - ours)."""
        report = ops_hop.hop_query(self.queue, self.options["skip"] or 0, self.trigger)
        s = report.stats
        steps = int(self._steps.numpy())
        out = {k: s[k] for k in ("iteration", "lag", "queue_size", "max_queue", "dropped", "skips", "skipped_iters",
                                 "sends", "sends_skipped")}
        out["steps"] = steps
        out["mean_updates"] = int(self._updates.numpy()) / steps if steps else 0.0
        out["recv_wait_s"] = int(self._waited_us.numpy()) * 1e-6
        for n in report.neighbours:
            if n["out"]:
                out[f"tokens_from_{n['peer']}"] = n["tokens"]
            if n["known_iteration"] >= 0:
                out[f"gap_to_{n['peer']}"] = n["known_iteration"] - s["iteration"]
        return out


def _placement(size):
    """Machines from the hosts every rank reported at hetsync.init(); one machine before init (checks only)."""
    if _runtime.is_initialized():
        return topo.machines_from_hosts(_runtime.hosts())
    return size


def _horovod_ready():
    try:
        import horovod.tensorflow as hvd

        return hvd.is_initialized()
    except (ImportError, ValueError, AttributeError):
        return False
