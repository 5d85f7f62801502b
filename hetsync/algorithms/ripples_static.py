"""``sync="ripples-static"``: Ripples with the decentralized, conflict-free static schedule (Ripples §3.2, §4.2).

Each step a worker updates its parameters with its own gradients (no gradient allreduce), then averages its
parameters with its group of that iteration using P-Reduce (Fig 7, steps 2-4).  The group comes from the rule-based
function S of hetsync.algorithms.schedule: no table to distribute, no RPC.  S is pure, so the training graph keeps
this worker's groups for one period (4 iterations) as a small constant and indexes it by the iteration counter.

Options:
  node_size: the machines for the schedule's inter/intra-node rules (§4.2 Fig 10's "local workers"): an int
    (blocks of that many ranks), a list of machine sizes ([4, 2, 2]: unequal machines), or None (default): the
    real placement, ranks grouped by the host each reported at hetsync.init() (machines of any size, ranks in any
    order).  Setting it emulates a multi-node layout.
  timeout: seconds a P-Reduce may wait for its group before failing with the missing ranks (default: init's).
"""
import numpy as np
import tensorflow as tf

from hetsync import _runtime, ops
from hetsync.algorithms import register
from hetsync.algorithms._wrap import wrap_post_update
from hetsync.algorithms.decentralized import DecentralizedAlgorithm
from hetsync.algorithms.hop_topology import machines_from_hosts
from hetsync.algorithms.options import Option, TIMEOUT
from hetsync.algorithms.schedule import Layout, PERIOD, period_groups

STATIC_STREAM = 1  # engine instance stream: (STATIC_STREAM, iteration) names the same P-Reduce on every member


@register
class RipplesStatic(DecentralizedAlgorithm):
    name = "ripples-static"
    EXCHANGES_PARAMETERS = True  # the scheduled P-Reduce after each local update
    OPTIONS = {"node_size": Option(None, ("int", "list"), minimum=1, none=True,
                                   doc="workers per machine, or a list of machine sizes (None: the real placement "
                                       "by host)", paper="Ripples §4.2 (Fig 10)"),
               "timeout": TIMEOUT}

    def preflight(self):
        """The node layout, the same on every rank: from node_size, else the hosts gathered at init (a bad
        node_size is a ValueError naming it, raised here, before a switch's collectives)."""
        import horovod.tensorflow as hvd

        node_size = self.options["node_size"]
        if node_size is None:
            node_size = machines_from_hosts(_runtime.hosts())
        try:
            self.layout = Layout(hvd.size(), node_size)
        except ValueError as exc:
            raise ValueError(f"sync='ripples-static': option node_size={node_size!r}: {exc}") from None

    def wrap(self, optimizer):
        import horovod.tensorflow as hvd

        _runtime.require_init("sync='ripples-static'")
        self.preflight()
        self.groups = period_groups(hvd.rank(), self.layout)
        width = max(len(g) for g in self.groups)
        table = np.full((PERIOD, width), -1, dtype=np.int32)
        for phase, group in enumerate(self.groups):
            table[phase, :len(group)] = group
        self._table = tf.constant(table)
        return wrap_post_update(optimizer, self)

    def group_for(self, iterations):
        """This worker's group (int32 vector) for the step whose update made ``iterations``."""
        phase = tf.math.floormod(tf.cast(iterations, tf.int64) - 1, PERIOD)
        row = tf.gather(self._table, phase)
        return tf.boolean_mask(row, row >= 0)

    def after_update(self, variables, iterations):
        instance = tf.stack([tf.constant(STATIC_STREAM, tf.int64), tf.cast(iterations, tf.int64)])
        averaged = ops.p_reduce([tf.convert_to_tensor(v) for v in variables], self.group_for(iterations),
                                timeout=self.options["timeout"], instance=instance, compression=self.compression)
        for var, value in zip(variables, averaged):
            var.assign(value)
