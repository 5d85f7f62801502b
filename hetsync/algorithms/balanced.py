"""``sync="balanced"``: synchronous SGD in which each worker's share of the global batch follows its speed.

Not one of the five papers: load-balanced batching (LB-BSP, SoCC'20; LBB, 2024; OmniLearn, 2025), the answer to a
persistent straggler that keeps synchronous SGD -- no staleness, no model divergence -- and the baseline every
asynchronous mode must beat.

**One Keras step is one synchronous update** (hetsync/training/ calls :meth:`Balanced.run_step`):

1. rank r computes ``n_r`` samples of the global batch as micro-batches of at most its batch size ``B_r`` (the
   user's; memory never grows): its batches are cut and joined (the rest of a cut batch starts the next update), and
   each micro-batch runs the user's ``train_step`` (loss, metrics, BatchNorm) with the optimizer *accumulating*
   ``m x gradient`` (m = the micro-batch's samples) instead of applying it;
2. one Horovod allreduce of the plan's numbers (the update's samples, every rank's throughput, batch size and
   whether it trains), then one grouped Horovod allreduce (Sum, the user's ``compression``) of the accumulated sums
   divided by the update's samples: the gradient of the *union batch*, exactly what synchronous SGD on those samples
   computes (weighting by samples makes a mean-reduced loss of the union; a regularization loss counts once);
3. one update of the user's optimizer on every rank (``iterations`` + 1, Keras' LR schedules as with Horovod);
4. every ``replan_every`` updates (and at once when a rank stops or comes back) every rank computes the next plan
   from the same sums (balanced_plan.py): shares proportional to measured throughput, within ``min_share`` /
   ``max_share`` of the rank's batch, adopted only when one moves by more than ``hysteresis``.

**The global batch is Horovod's** (``sum_r B_r`` per update, times ``backward_passes_per_step``) and so is the
learning rate: only who computes which samples changes, so the number of updates per epoch, the LR schedule and the
generalization of the user's Horovod script stay what they were (README "sync='balanced'").  The first update is
Horovod's split (one batch each): shares follow from the second plan on.

Horovod's keyword arguments: ``op`` Average (default) or Sum (the union gradient times the workers, as Horovod's
Sum of means), ``compression`` (what the gradient allreduce sends), ``backward_passes_per_step`` = N (the global
batch is N x Horovod's and the gradient N x the union mean unless ``average_aggregated_gradients``, as Horovod's
sum of N passes), ``name``, ``sparse_as_dense`` (sums are dense anyway), ``process_set`` (global only).

Idle ranks (stopped early, hetsync/training/) take 0 samples and keep joining the allreduces with nothing, so the
others' updates complete; their share goes to the others at the next update.  Keras ``Model.fit`` only: a custom
loop's step takes the user's batch whole, so it cannot be given a share of one (a clear error says so).
"""
import itertools
import logging
import statistics
import time

import tensorflow as tf

from hetsync import marks
from hetsync.algorithms import balanced_plan, horovod_kwargs, register
from hetsync.algorithms._synchronous import loss_scale_parts
from hetsync.algorithms._wrap import apply_locally, build_slots, update_result
from hetsync.algorithms.balanced_feed import MicroBatchFeed, samples_of
from hetsync.algorithms.base import SyncAlgorithm
from hetsync.algorithms.options import Option

log = logging.getLogger("hetsync.balanced")
FIELDS = 3  # per rank in the update's allreduce: throughput (samples / s of compute), trains, batch size
_WRAPS = itertools.count()


@register
class Balanced(SyncAlgorithm):
    name = "balanced"
    STEPPING = "rounds"
    OPTIONS = {
        "replan_every": Option(10, "int", minimum=1, doc="updates between two plans of the shares"),
        "min_share": Option(0.05, "number", minimum=0, above=True, maximum=1,
                            doc="fewest samples per update, as a fraction of the rank's Horovod share"),
        "max_share": Option(4.0, "number", minimum=1,
                            doc="most samples per update, as a multiple of the rank's Horovod share"),
        "hysteresis": Option(0.1, "number", minimum=0, doc="a plan is adopted when a share moves by more than this"),
        "window": Option(3, "int", minimum=1, doc="updates whose median throughput a plan uses"),
        "micro_batch": Option(None, "int", minimum=1, none=True,
                              doc="most samples per micro-batch (None: the rank's batch size: memory never grows)"),
    }
    HOROVOD_APPLIED = horovod_kwargs.APPLIED_BY_WRAPPER | {"op"}
    KERAS_TRAIN_STEP = False
    NO_CUSTOM_LOOPS = ("sync='balanced' gives each worker a share of the global batch that follows its speed by "
                       "cutting its batches into micro-batches: that needs Model.fit, where hetsync runs the train "
                       "step.  A custom loop's step takes the user's batch whole: train with Model.fit, or use "
                       "sync='esync' (its fast workers take more whole batches) in the loop")
    HOROVOD_REASONS = {
        "device_dense": "it places Horovod's gradient allreduce ops on a device; sync={mode!r} allreduces the "
                        "accumulated gradients from host memory",
        "device_sparse": "sync={mode!r} accumulates dense gradients: there is no sparse allgather",
        "gradient_predivide_factor": "sync={mode!r} divides the sample-weighted sum once, by the update's samples",
        "num_groups": "sync={mode!r} allreduces every gradient in one group per update",
        "groups": "sync={mode!r} allreduces every gradient in one group per update",
        "scale_local_gradients": "sync={mode!r} applies a register_local_var variable's accumulated gradient divided "
                                 "by the rank's own samples",
    }

    rank, size = 0, 1  # this rank and the job's size: wrap sets them
    plan = None

    def validate(self):
        import horovod.tensorflow as hvd

        op = self.horovod_kwargs.get("op")
        if op is not None and op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op={horovod_kwargs._describe('op', op)} is not supported by sync='balanced': its "
                             "update is the union batch's gradient (op=hvd.Average, Horovod's default) or that "
                             "times the workers (op=hvd.Sum)")

    # -- set-up -------------------------------------------------------------------------------------------------
    def wrap(self, optimizer):
        import horovod.tensorflow as hvd

        # mixed precision: the loss scaling stays around our optimizer, so it unscales (and skips a micro-batch
        # whose gradients overflowed: neither its gradient nor its samples are counted) before we accumulate
        optimizer, loss_scaled = loss_scale_parts(optimizer)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.scope = f"hetsync.balanced.{next(_WRAPS)}"
        passes = self.backward_passes_per_step
        factor = 1.0 if self.average_aggregated_gradients else float(passes)
        self.factor = factor * (self.size if self.horovod_kwargs.get("op") is hvd.Sum else 1.0)
        self.local_hooks, self.model = [], None
        self.feed = MicroBatchFeed(self.options["micro_batch"])
        self.plan = None                 # samples per update of every rank (None: Horovod's split, one batch each)
        self.batches = None              # every rank's Horovod share (batch size x passes), from the first update
        self.active = None
        self.history = []                # (update, plan) each time the plan changed
        self.rates = []                  # this rank's throughput (samples / compute s) of its recent updates
        self.updates = 0
        self._settled = self._warm = False  # a plan from measured speeds is in force; an update has run
        self._job_steps, self._round = 0, []
        self._micro_fn = self._update_fn = None
        self._sums = []                  # (variable, accumulator) in model order
        with tf.init_scope():
            self._micro_n = tf.Variable(0.0, trainable=False, name="hetsync_balanced_micro_samples")
            self._samples = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hetsync_balanced_samples")
        algorithm, base = self, optimizer.__class__

        def apply_gradients(opt, grads_and_vars, *args, **kwargs):
            return algorithm._accumulate(opt, list(grads_and_vars))

        cls = type(base.__name__, (base,), {"apply_gradients": apply_gradients, "__module__": base.__module__})
        wrapped = base.from_config.__func__(cls, optimizer.get_config())
        marks.record(wrapped, algorithm=self)
        self.optimizer = wrapped
        return loss_scaled(wrapped)

    def attach(self, model, local_hooks):
        """hetsync/training/, at each fit's start: the model and the callbacks that act per micro-batch."""
        self.model = model
        self.local_hooks = list(local_hooks)

    def begin_loop(self, model):
        raise ValueError(self.NO_CUSTOM_LOOPS)

    # -- the accumulation (graph code, inside the user's train_step) ---------------------------------------------
    def _ensure_sums(self, optimizer, grads_and_vars):
        """Accumulators for every trainable variable of the model (the same list on every rank, whatever this
        rank's gradients were), lifted out of any tf.function; the optimizer's slots built likewise."""
        if self._sums:
            return
        # the model's (sync="auto"'s pretrace traces Keras' step before the model is attached: the gradients' then)
        variables = (list(self.model.trainable_variables) if self.model is not None
                     else [v for g, v in grads_and_vars if g is not None])
        with tf.init_scope():
            self._sums = [(v, tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                          name="hetsync_balanced_sum")) for v in variables]
        build_slots(optimizer, variables)

    def _accumulate(self, optimizer, grads_and_vars):
        self._ensure_sums(optimizer, grads_and_vars)
        where = {v.ref(): s for v, s in self._sums}
        n = self._micro_n.read_value()
        with tf.name_scope(self.scope_name or "DistributedBalanced"):
            for grad, var in grads_and_vars:
                if grad is None or var.ref() not in where:
                    continue
                total = where[var.ref()]
                if isinstance(grad, tf.IndexedSlices):
                    total.scatter_add(tf.IndexedSlices(grad.values * tf.cast(n, grad.values.dtype), grad.indices,
                                                       grad.dense_shape))
                else:
                    total.assign_add(grad * tf.cast(n, grad.dtype))
            self._samples.assign_add(tf.cast(n, tf.float64))
        return update_result(optimizer, tf.identity(optimizer.iterations))

    def _micro_step(self, data):
        self._micro_n.assign(samples_of(data))
        return self.model.train_step(data)

    # -- one Keras step = one update ----------------------------------------------------------------------------
    def run_step(self, train_function, iterator):
        """This rank's micro-batches, then the update; returns Keras' logs after the last micro-batch."""
        self._build_micro(iterator)
        need = self._share()
        logs, computed, seconds, iterations = None, 0, 0.0, []
        pieces = itertools.chain.from_iterable(
            self.feed.micro_batches(iterator, None) for _ in range(self.backward_passes_per_step)) \
            if need is None else self.feed.micro_batches(iterator, need)
        for data, n in pieces:
            began = time.monotonic()
            for hook in self.local_hooks:
                hook.on_local_iteration_begin(work=n / self.feed.batch)
            logs = self._micro_fn(data)
            for hook in self.local_hooks:
                hook.on_local_iteration_end()
            took = time.monotonic() - began
            computed, seconds = computed + n, seconds + took
            iterations.append((took, n))
        if computed and self._warm:  # (the first update of a mode traces its functions: not a speed)
            self.rates = (self.rates + [computed / max(seconds, 1e-6)])[-int(self.options["window"]):]
        self._warm = True
        self._round = iterations
        self._finish(active=computed > 0)
        return logs  # (None, when nothing was computed: the training layer reports Keras' metrics as they stand)

    def idle_step(self, train_function, iterator):
        """A stopped rank computes nothing but joins the update's allreduces with nothing, so the others' complete
        (a model not built yet is built by one micro-batch first, its gradient dropped)."""
        if not self._sums:
            self._build_micro(iterator)
            for data, _ in self.feed.micro_batches(iterator, 1):
                self._micro_fn(data)
            for _, total in self._sums:
                total.assign(tf.zeros_like(total))
            self._samples.assign(0.0)
        self._round = []
        self._finish(active=False)
        return None  # the training layer reports Keras' metrics as they stand (RankState.metric_logs)

    def _build_micro(self, iterator):
        """The micro-batch step, traced once for any batch size (the dataset's element spec with the batch
        dimension left open, as Keras traces its own step), so a new share never retraces it."""
        if self._micro_fn is not None:
            return
        spec = getattr(iterator, "element_spec", None)
        if spec is None:
            self._micro_fn = tf.function(self._micro_step, reduce_retracing=True)
            return
        open_batch = tf.nest.map_structure(
            lambda s: tf.TensorSpec([None] + list(s.shape[1:]), s.dtype) if isinstance(s, tf.TensorSpec) else s, spec)
        self._micro_fn = tf.function(self._micro_step, input_signature=[open_batch])

    def _share(self):
        if self.plan is None:  # Horovod's split until every rank's batch size is known (the first update)
            return None
        return self.plan[self.rank]

    def _finish(self, active):
        """The update (collective), then the plan for the next ones."""
        if self._update_fn is None:
            self._update_fn = tf.function(self._update, autograph=False)
        batch = float(self.feed.batch or 0) * self.backward_passes_per_step
        rate = statistics.median(self.rates) if self.rates and active else 0.0
        mine = tf.constant([rate, 1.0 if active else 0.0, batch], tf.float32)
        summed = self._update_fn(mine).numpy()
        self.model._train_counter.assign_add(1)
        self.updates += 1
        self._replan(summed)

    def _replan(self, summed):
        size = self.size
        total = float(summed[0])
        rates, active, batches = ([float(x) for x in summed[1 + j * size:1 + (j + 1) * size]] for j in range(FIELDS))
        active = [x > 0 for x in active]
        self.batches = [b if b > 0 else old for b, old in zip(batches, self.batches or [0.0] * size)]
        # the job's batches in this update (Horovod's batches: with backward_passes_per_step = N an update is N of
        # each rank's, so an epoch of the job holds 1/N as many updates as Keras steps, the rest are skipped)
        known = sum(self.batches) / self.backward_passes_per_step
        self._job_steps = int(round(total * size / known)) if known > 0 else 0
        if self.plan is None:
            self.plan = [int(b) if a else 0 for b, a in zip(self.batches, active)]
            self.active = active
            self.history.append((self.updates, list(self.plan)))
            return
        # Until a plan from every rank's measured speed is in force, every update plans (so the job leaves
        # Horovod's split after its second update); then every replan_every updates, or at once when a rank
        # stops or comes back.
        due = not self._settled or active != self.active or self.updates % int(self.options["replan_every"]) == 0
        if due:
            measured = all(r > 0 for r, a in zip(rates, active) if a)
            new = balanced_plan.plan([max(b, 1.0) for b in self.batches], rates, active, self.plan,
                                     self.options["min_share"], self.options["max_share"],
                                     self.options["hysteresis"])
            if new != self.plan:
                log.debug("balanced: update %d: samples per update %s -> %s (throughputs %s)", self.updates,
                          self.plan, new, [round(r, 1) for r in rates])
                self.plan = new
                self.history.append((self.updates, list(new)))
            self.active = active
            self._settled = self._settled or measured

    def _update(self, mine):
        """Graph: the plan's numbers and the union-batch gradient in one grouped Horovod allreduce (two when the
        gradient is compressed: its sums are divided by the update's samples first, so fp16 sees a mean), then one
        optimizer update."""
        import horovod.tensorflow as hvd

        slot = tf.one_hot(self.rank, self.size, dtype=tf.float32)  # field j of rank r at 1 + j * size + r
        meta = tf.concat([tf.reshape(tf.cast(self._samples.read_value(), tf.float32), [1]),
                          tf.reshape(mine[:, None] * slot[None, :], [-1])], 0)
        shared = [(v, s) for v, s in self._sums if v.ref() not in self.local_vars]
        local = [(v, s) for v, s in self._sums if v.ref() in self.local_vars]
        sums = [s.read_value() for _, s in shared]
        if sums and self.compression is not hvd.Compression.none:
            summed = hvd.allreduce(meta, op=hvd.Sum, name=f"{self.scope}.plan")
            total = tf.maximum(summed[0], 1.0)
            reduced = hvd.grouped_allreduce([t / tf.cast(total, t.dtype) for t in sums], op=hvd.Sum,
                                            compression=self.compression, name=f"{self.scope}.gradients")
        else:
            out = hvd.grouped_allreduce([meta] + sums, op=hvd.Sum, name=f"{self.scope}.update")
            summed, total = out[0], tf.maximum(out[0][0], 1.0)
            reduced = [t / tf.cast(total, t.dtype) for t in out[1:]]
        grads = [r * tf.cast(self.factor, r.dtype) for r in reduced]
        own = tf.maximum(self._samples.read_value(), 1.0)
        grads += [s.read_value() / tf.cast(own, s.dtype) for _, s in local]
        variables = [v for v, _ in shared] + [v for v, _ in local]

        def update():
            apply_locally(self.optimizer, list(zip(grads, variables)))
            return tf.constant(True)

        applied = tf.cond(summed[0] > 0, update, lambda: tf.constant(False))
        with tf.control_dependencies([applied]):
            for _, s in self._sums:
                s.assign(tf.zeros_like(s))
            self._samples.assign(0.0)
        with tf.control_dependencies([applied]):
            return tf.identity(summed)

    # -- hooks of the training layer and of switches -------------------------------------------------------------
    def last_job_steps(self):
        """Batches of the job in the last update (its samples over the mean batch size): job epochs count them,
        so an epoch is the job's samples whichever ranks computed them, as many as Horovod's epoch."""
        return self._job_steps

    def last_round_timing(self):
        """(batch-equivalents, compute seconds) of the last update: the step clock's rate is per batch."""
        batch = float(self.feed.batch or 1)
        return sum(n for _, n in self._round) / batch, sum(t for t, _ in self._round)

    def last_round_iterations(self):
        """Compute seconds per batch of each micro-batch: sync="auto" sees a rank's speed, not its share (a slow
        rank's small share would otherwise look fast, and auto would leave the straggler class it is balancing)."""
        batch = float(self.feed.batch or 1)
        return [t * batch / n for t, n in self._round if n > 0]

    def drain(self, optimizer, variables):
        """Between two Keras steps nothing is accumulated (the update ends the step); a cut batch's rest is data,
        not a gradient, and is dropped with the mode."""
        self.feed.reset()
        return {"accumulated": 0}

    def activate(self):
        """Entered (first use, or a switch back): Horovod's split again until the next plan."""
        self.plan, self.active, self.rates = None, None, []
        self._settled = self._warm = False
        self.feed.reset()

    def pretrace(self, model, iterator):
        """The micro-batch step (for the data's spec, any batch size; its trace makes the accumulators) and the
        update, traced before a switch into the mode needs them."""
        self.model = model
        self._build_micro(iterator)
        if self._micro_fn.input_signature is None:
            return  # (data without an element spec: traced at the first update)
        self._micro_fn.get_concrete_function()
        if self._update_fn is None:  # (captures the accumulators: only once the micro-batch step made them)
            self._update_fn = tf.function(self._update, autograph=False)
        self._update_fn.get_concrete_function(tf.TensorSpec([FIELDS], tf.float32))

    def shares(self):
        """Each rank's samples per update over its Horovod share (1.0 = Horovod's split), as planned now."""
        if self.plan is None or not self.batches:
            return [1.0] * self.size
        return [p / b if b > 0 else 0.0 for p, b in zip(self.plan, self.batches)]

    def metrics(self):
        """For the heterogeneity report and TensorBoard (``share``: this rank's samples per update over its Horovod
        share, a scalar per rank) and benchmarks (``shares``: every rank's, as planned now)."""
        shares = self.shares()
        rank = self.rank
        return {"updates": self.updates, "plans": len(self.history), "share": round(shares[rank], 4),
                "samples_per_update": (self.plan or [0] * (rank + 1))[rank], "shares": [round(x, 3) for x in shares]}

