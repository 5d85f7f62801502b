"""``sync="eager-solo"`` and ``sync="eager-majority"``: eager-SGD (eager-SGD §5, Algorithm 5 and Fig 7).

Each step averages the gradients with a *partial* allreduce instead of Horovod's (ops_partial.partial_allreduce, §4):
the ranks whose gradients are ready contribute them, the others contribute passively from their engine's progress
thread what their send buffer holds (gradients of earlier steps that no round took yet, or nothing).  A rank that
arrives after a round ran gets that round's average at once and its own gradients wait in the send buffer for the
next round, accumulated with any later ones (Fig 7: stale gradients are carried, each exactly once).
  - solo (§4.1): the first rank to arrive starts the round: nobody waits; best under light imbalance.
  - majority (§4.2): only the rank a seeded RNG designates for the round starts it: on average half of the ranks
    contribute fresh gradients; better accuracy under severe imbalance.
What a step applies (option ``late``):
  - "accumulate" (default): the sum of every round since this rank's previous step, each round's sum divided by
    the number of ranks P.  Every gradient of every rank is then applied exactly once, with weight 1/P, by every
    rank -- synchronous SGD's total, only stale -- so under plain SGD the models stay identical.  Our choice: with
    8 processes on a shared machine the fast ranks arrive milliseconds apart, solo splits them into several rounds
    per step, and a rank that only saw the latest one lost the others' gradients (hyperplane: final loss 0.80
    against allreduce's 0.011 after 150 steps, README).
  - "latest": the latest round's result only, averaged over its contributors (ADS: "a correct average of a subset
    of the proposed updates", §5.1); rounds a rank missed are lost to its model.
  - "algorithm5" (the paper's rule exactly, §5 Algorithm 5 line 6: G <- 1/P * partial_allreduce(G_local)): the
    latest round's sum divided by the world size P, passive ranks counting as null contributions.  Under solo,
    where a round often holds one rank's gradient, that gradient is applied at 1/P of "latest"'s weight.
Models may still drift (Adam's nonlinear update, "latest"); the staleness bound τ of §5.1 is kept by full-model
averages with Horovod: at every epoch end (every hetsync mode does this, hetsync/training/) and every
``model_sync_every`` batches within an epoch.

Options:
  model_sync_every: batches between mid-epoch model averages (default 200; None: epoch ends only).  A
    ``hetsync.callbacks.ConsensusCallback`` callback, if the user adds one, overrides it.
  seed: majority's shared seed for the initiator sequence (ops_partial.majority_initiator).  Default 0.
  late: "accumulate" (default), "latest" or "algorithm5", above.
  timeout: seconds before a round that cannot run fails (a rank's engine gone; majority: its designated rank never
    came and is not away).  Default: hetsync.init's.
Horovod kwargs: as every mode (base.py); ``compression=hvd.Compression.fp16`` sends float32 gradients as float16.
"""
import itertools

import tensorflow as tf

from hetsync import _runtime, ops, ops_partial
from hetsync.algorithms import register
from hetsync.algorithms._wrap import apply_locally, wrap_post_update
from hetsync.algorithms.base import SyncAlgorithm
from hetsync.algorithms.options import Option, TIMEOUT

DEFAULT_MODEL_SYNC_EVERY = 200
_WRAPS = itertools.count()  # collective names: the n-th wrapped optimizer of the process (same order on all ranks)


class EagerSGD(SyncAlgorithm):
    """Shared by both modes; ``MODE`` is the partial collective ("solo" or "majority")."""

    MODE = None
    EXCHANGES_GRADIENTS = True  # the partial allreduce of each step's gradients
    _calls = None  # train steps that reached the exchange (a tf.Variable: wrap makes it)
    OPTIONS = {
        "model_sync_every": Option(DEFAULT_MODEL_SYNC_EVERY, "int", minimum=1, none=True,
                                   doc="batches between mid-epoch model averages (None: epoch ends only)",
                                   paper="eager-SGD §5.1"),
        "model_sync_epochs": Option(1, "int", minimum=1,
                                    doc="epoch ends between model averages (§5: the paper's is about 10)",
                                    paper="eager-SGD §5"),
        "seed": Option(0, "int", minimum=0,
                       doc="shared seed of the initiator sequence (eager-majority; eager-solo does not use it)",
                       paper="eager-SGD §4.2"),
        "timeout": TIMEOUT,
        "late": Option("accumulate", choices=("accumulate", "latest", "algorithm5"),
                       doc="what a step applies: every round since the last (1/P each), the newest round over its "
                           "contributors, or the newest round times 1/P (Algorithm 5 line 6)",
                       paper="eager-SGD §5 (Algorithm 5)", paper_rule="algorithm5"),
    }
    HOROVOD_REASONS = {
        "device_dense": "it places Horovod's gradient allreduce ops on a device; sync={mode!r} exchanges gradients "
                        "with the partial allreduce in hetsync's engine (MPI, host memory)",
        "device_sparse": "it places Horovod's sparse gradient allgather ops on a device; sync={mode!r} makes "
                         "gradients dense and exchanges them with the partial allreduce in hetsync's engine",
        "gradient_predivide_factor": "the partial allreduce of sync={mode!r} sums the contributions and divides "
                                     "once (by the contributors, or by the world size with late='accumulate')",
        "op": "the partial allreduce of sync={mode!r} averages (op=Average, Horovod's default): over the "
              "contributors, or every contribution with weight 1/P with late='accumulate'",
        "num_groups": "it batches gradient allreduces into fusion groups; sync={mode!r} sends all gradients in one "
                      "partial allreduce per step (one per dtype)",
        "groups": "it batches gradient allreduces into fusion groups; sync={mode!r} sends all gradients in one "
                  "partial allreduce per step (one per dtype)",
        "scale_local_gradients": "it scales the gradients of variables registered with register_local_var; "
                                 "sync={mode!r} exchanges every gradient through the partial allreduce",
    }

    @property
    def consensus_every(self):
        """hetsync/training/: mid-epoch model averages every this many batches (None: epoch ends only)."""
        return self.options["model_sync_every"]

    @property
    def consensus_epochs(self):
        """hetsync/training/: average the models at every this-many-th epoch end (§5's periodic model sync: "every
        tens of epochs", 10 in its ResNet-50 run; the other epoch ends are sync points without an average)."""
        return self.options["model_sync_epochs"]

    def wrap(self, optimizer):
        _runtime.require_init(f"sync={self.name!r}")
        import horovod.tensorflow as hvd

        self.collective = f"eager-{next(_WRAPS)}"
        self._size = hvd.size()
        self._exchanged = {}  # wire dtype name -> the variables its partial allreduce carries, in order
        with tf.init_scope():
            self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_eager_calls")
            self._included = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_eager_included")
            self._nap_sum = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_eager_nap_sum")
            self._last_nap = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_eager_last_nap")
        return wrap_post_update(optimizer, self)

    def drain(self, optimizer, variables):
        """A live switch leaves eager-SGD, every rank having finished its last step: what each partial allreduce
        holds for this rank but has not returned (round results since its last call, its own deposit that no round
        took: ops_partial.partial_drain) is applied here as one local update of the user's optimizer.  The switch's average
        then shares it, so every gradient is applied exactly once (with late="accumulate"; weight 1/P per rank, as
        a round's result) and nothing waits in the engine for a later return to this mode."""
        done = super().drain(optimizer, variables)
        drained = []
        for wire, exchanged in sorted(self._exchanged.items()):
            dtype = tf.float64 if wire == "float64" else tf.float32
            sums = ops_partial.partial_drain(f"{self.collective}.{wire}", [tf.zeros(v.shape, dtype) for v in exchanged])
            drained += [(tf.cast(s, v.dtype), v) for s, v in zip(sums, exchanged)]
        if drained and any(bool(tf.reduce_any(s != 0)) for s, _ in drained):
            apply_locally(optimizer, drained)
            done["drained"] = len(drained)
        return done

    def before_update(self, grads, variables):
        """The gradient exchange of one step: one partial allreduce per dtype (float32 for half precisions)."""
        out = [None] * len(grads)
        groups = {}
        for i, g in enumerate(grads):
            wire = tf.float64 if g.dtype == tf.float64 else tf.float32
            groups.setdefault(wire, []).append(i)
        previous = []
        for wire in sorted(groups, key=lambda d: d.name):  # the same order on every rank
            idx = groups[wire]
            self._exchanged[wire.name] = [variables[i] for i in idx]  # what a switch drains (at trace time)
            late = self.options["late"]
            with tf.control_dependencies(previous):
                res = ops_partial.partial_allreduce([tf.cast(grads[i], wire) for i in idx], mode=self.MODE,
                                            name=f"{self.collective}.{wire.name}", seed=self.options["seed"],
                                            timeout=self.options["timeout"], compression=self.compression,
                                            late="latest" if late == "algorithm5" else late)
            # Algorithm 5, line 6: G <- 1/P * partial_allreduce(G_local) (passive ranks add nothing): the engine's
            # latest round is averaged over its NAP contributors, so it is scaled by NAP / P
            scale = tf.cast(res.nap, wire) / float(self._size) if late == "algorithm5" else None
            for i, t in zip(idx, res.tensors):
                out[i] = tf.cast(t if scale is None else t * scale, grads[i].dtype)
            previous = list(res.tensors)
        self._count(res)
        return out

    def _count(self, res):
        self._calls.assign_add(1)
        self._included.assign_add(tf.cast(res.included, tf.int64))
        self._nap_sum.assign_add(res.nap)
        self._last_nap.assign(res.nap)

    def metrics(self):
        """Per-rank counters: calls, calls whose gradients made their round (included) or came late (missed),
        mean NAP of the returned rounds, rounds this rank's engine ran, mean staleness (rounds) of its
        contributions."""
        stats = ops.engine_stats()
        calls = int(self._calls.numpy()) if self._calls is not None else 0
        contributed = stats["partial_contributed"]
        return {
            "calls": calls,
            "included": int(self._included.numpy()) if calls else 0,
            "missed": calls - (int(self._included.numpy()) if calls else 0),
            "mean_nap": float(self._nap_sum.numpy()) / calls if calls else 0.0,
            "rounds": stats["partial_rounds"],
            "mean_staleness": stats["partial_staleness_sum"] / contributed if contributed else 0.0,
        }


@register
class EagerSolo(EagerSGD):
    name = "eager-solo"
    MODE = "solo"


@register
class EagerMajority(EagerSGD):
    name = "eager-majority"
    MODE = "majority"
