"""``sync="od-sgd"``: OD-SGD, one-step-delay SGD -- the gradient allreduce of step t runs while step t+1 computes
(OD-SGD §3 Algorithms 1-2, mapped from the parameter server to allreduce; §3.3 local updaters; §4.6 warm-up).

Every worker holds the global weights W (identical on every worker) and computes on a local copy L (the model's
variables).  Three stages, by ``optimizer.iterations`` (which counts global updates):

* **warm-up** (``iterations < warmup_steps``; §4.6 shows it is needed): plain synchronous SGD -- exactly
  ``horovod.tensorflow.keras.DistributedOptimizer`` (its gradient allreduce, then the user's optimizer), bit for
  bit; Horovod's keyword arguments reach it unchanged.
* **switching** (Algorithm 2 lines 8-13): at the first training step the model is W (identical after the warm-up)
  and no allreduce is outstanding, so W_t is the model itself.
* **training**, at step t, in the compiled train step, after the gradient g_t was computed on L_t:
  1. wait for the allreduce of g_{t-1} (started at step t-1: it ran while g_t was computed) and apply the
     *global updater* -- the user's optimizer, its slots and learning-rate schedule -- to W_{t-1} with
     mean(g_{t-1}), giving W_t, on every worker (the model variables hold W while it runs, so the optimizer's
     state stays keyed to them);
  2. start the non-blocking allreduce of g_t (ops.allreduce_start: the engine's progress thread moves it);
  3. the *local updater* sets the model to L_{t+1} = local(W_t, g_t, L_t):
     ``"sgd"``: W_t - η g_t; ``"dc-asgd-c"`` (eq. 4): W_t - η (g_t + λ g_t⊙g_t⊙(W_t - L_t));
     ``"dc-asgd-a"`` (eq. 5-6): W_t - η (g_t + λ/sqrt(MeanSquare_t + 1e-7) ⊙ g_t⊙g_t⊙(W_t - L_t)),
     MeanSquare_t = m·MeanSquare_{t-1} + (1-m)·g_t².  η = ``local_lr`` (default: the optimizer's current
     learning rate), λ = ``dc_lambda`` (default: the value OD-SGD §4.3 uses for that updater, 0.04 for
     DC-ASGD-c and 0.95 for DC-ASGD-a), m = ``mean_square_decay``.
     ``"optimizer"`` (ours): the user's optimizer's own step from W_t with g_t, its state (slots, iterations) read
     and left as it was.  The local updater is there to put L_{t+1} where W_{t+1} will be, so that g_{t+1} is
     computed near it.  The paper's updaters take an SGD step, which is where an SGD global updater goes; an
     Adam step goes elsewhere (per coordinate about lr, whatever the gradient's size), and with the benchmark's
     Adam at 8 ranks the one-step delay then lost accuracy after the warm-up (docs/modes/od-sgd.md).

Choices where the paper is silent (README, "OD-SGD"):

* At every sync point (epoch ends, the end of fit; hetsync/training/) the outstanding allreduce is completed and the model
  set to W (``flush``), so validation, rank 0's checkpoint and the next epoch see the global model.
* An idle worker (stopped early) keeps stepping with a zero gradient and weight 0: the mean is over the workers that
  trained (a count travels with the gradients), as ``allreduce``'s idle steps do it through Horovod.
* A worker that never starts its allreduce (dead, hung) is named by the others after ``timeout`` seconds (the
  engine's header phase, docs/engine.md); in the warm-up, Horovod's own stall check applies.
"""
import tensorflow as tf

from hetsync import _runtime, marks, ops
from hetsync.algorithms import horovod_kwargs, register
from hetsync.algorithms._synchronous import IdleContribution, ReducedOnce, horovod_optimizer, loss_scale_parts
from hetsync.algorithms._wrap import apply_locally, build_slots, optimizer_variables, update_result
from hetsync.algorithms.base import SyncAlgorithm
from hetsync.algorithms.options import Option, TIMEOUT

LOCAL_UPDATERS = ("sgd", "dc-asgd-c", "dc-asgd-a", "optimizer")
PAPER_DC_LAMBDA = {"dc-asgd-c": 0.04, "dc-asgd-a": 0.95}  # §4.3 (CIFAR-10): each updater's recommended λ


@register
class ODSGD(IdleContribution, SyncAlgorithm):
    name = "od-sgd"
    STEPPING = "lockstep"
    BARE_LOOP = True  # lockstep: every step allreduces (Horovod in the warm-up, one step late after it)
    OPTIONS = {
        "warmup_steps": Option(100, "int", minimum=0, doc="steps of plain allreduce before the one-step delay",
                               paper="OD-SGD §4.6"),
        "local_updater": Option("optimizer", choices=LOCAL_UPDATERS, paper_rule="sgd",
                                doc="the local updater (\"optimizer\": the user's optimizer's own step, its state "
                                "unchanged; \"sgd\", \"dc-asgd-c\", \"dc-asgd-a\": §3.3's)", paper="OD-SGD §3.3"),
        "local_lr": Option(None, "number", minimum=0, above=True, none=True,
                           doc="the local updater's learning rate η (None: the optimizer's current one)",
                           paper="OD-SGD §3.3"),
        "dc_lambda": Option(None, "number", minimum=0, none=True,
                            doc="DC-ASGD's compensation strength λ (None: §4.3's for the updater: 0.04 for "
                                "dc-asgd-c, 0.95 for dc-asgd-a)", paper="OD-SGD §4.3"),
        "mean_square_decay": Option(0.95, "number", minimum=0, maximum=1, below=True,
                                    doc="DC-ASGD-a's mean-square decay m", paper="OD-SGD §3.3"),
        "timeout": TIMEOUT,
    }
    HOROVOD_APPLIED = frozenset(horovod_kwargs.NAMES)
    HOROVOD_PASSTHROUGH = True  # the warm-up is Horovod's DistributedOptimizer itself
    _AFTER = "after the warm-up, OD-SGD's own gradient allreduce (hetsync's engine, MPI, host memory) "
    HOROVOD_PART_TIME = {  # what OD-SGD's training stage does not apply (backward_passes_per_step and
        # average_aggregated_gradients it applies itself; sparse_as_dense: its gradients are made dense anyway)
        "name": "after the warm-up, the ops OD-SGD adds (its allreduce, the local updater) are not under that name",
        "device_dense": _AFTER + "places no ops on a device",
        "device_sparse": _AFTER + "places no ops on a device",
        "compression": _AFTER + "sends float32",
        "gradient_predivide_factor": _AFTER + "averages the gradient sum without it",
        "op": _AFTER + "averages (op=Average)",
        "num_groups": _AFTER + "sends every gradient in one operation per step",
        "groups": _AFTER + "sends every gradient in one operation per step",
        "scale_local_gradients": _AFTER + "does not apply it",
    }


    # -- set-up -------------------------------------------------------------------------------------------------
    def wrap(self, optimizer):
        import types

        import horovod.tensorflow.keras as hvd_keras

        _runtime.require_init("sync='od-sgd'")
        optimizer, loss_scaled = loss_scale_parts(optimizer)
        wrapped = horovod_optimizer(hvd_keras, optimizer, self.horovod_kwargs)
        self.make_contribution()
        with tf.init_scope():
            self.pending = tf.Variable(False, trainable=False, name="hetsync_od_pending")
            self.handle = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_od_handle")
            self.last_times = tf.Variable(tf.zeros([4], tf.float64), trainable=False, name="hetsync_od_times")
            # sums over the training stage: transfer time (data phase) and the part of it the step waited for
            self.transfer_s = tf.Variable(tf.zeros([2], tf.float64), trainable=False, name="hetsync_od_transfer")
            self.global_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_od_updates")
        self.optimizer, self.cls = wrapped, type(wrapped)
        self._w, self._ms, self._sums, self._variables = {}, {}, {}, None
        with tf.init_scope():
            self._passes = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_od_passes")
        inner = wrapped._allreduce
        algo = self
        once = ReducedOnce()  # a custom loop's gradients go through _allreduce in apply_gradients

        def _allreduce(opt, grads, variables):
            once.reduced()
            grads = algo.mark_compute_done(list(grads))
            scaled = [None if g is None else tf.convert_to_tensor(g) * tf.cast(algo.contribution, g.dtype)
                      for g in grads]
            idx = [i for i, g in enumerate(scaled) if g is not None]
            present = [scaled[i] for i in idx]
            if not present:
                return grads
            reduced = tf.cond(algo.in_warmup(), lambda: list(inner([scaled[i] for i in idx],
                                                                    [variables[i] for i in idx])),
                              lambda: [tf.identity(g) for g in present])
            out = list(scaled)
            for i, r in zip(idx, reduced):
                out[i] = r
            return out

        def apply_gradients(opt, grads_and_vars, *args, **kwargs):
            pairs = [(tf.convert_to_tensor(g), v) for g, v in once.ready(opt, grads_and_vars) if g is not None]
            variables = [v for _, v in pairs]
            algo._ensure(variables)
            done = tf.cond(algo.in_warmup(),
                           lambda: algo._warm(pairs, args, kwargs),
                           lambda: algo._accumulate_or_train([g for g, _ in pairs], variables))
            with tf.control_dependencies([done]):
                return update_result(opt, tf.identity(opt.iterations))

        wrapped._allreduce = types.MethodType(_allreduce, wrapped)
        wrapped.apply_gradients = types.MethodType(apply_gradients, wrapped)
        marks.record(wrapped, algorithm=self)
        return loss_scaled(wrapped)

    def validate(self):
        if self.options["local_updater"] == "optimizer":
            extra = [k for k in ("local_lr", "dc_lambda") if self.options[k] is not None]
            if extra:
                raise ValueError(f"sync='od-sgd': {', '.join(extra)} set with local_updater='optimizer', which takes "
                                 "the optimizer's own step (its learning rate, no DC-ASGD term); drop them or choose "
                                 "'sgd', 'dc-asgd-c' or 'dc-asgd-a'")

    def in_warmup(self):
        """``iterations < warmup_steps``, rounded up to whole updates: with ``backward_passes_per_step`` N Horovod's
        gradient aggregation advances ``iterations`` on every pass, and the switch must come after a complete
        update (a switch in the middle of Horovod's accumulation left its half-accumulated state behind and stalled
        training, measured)."""
        passes = int(self.horovod_kwargs.get("backward_passes_per_step", 1) or 1)
        warmup = -(-int(self.options["warmup_steps"]) // passes) * passes
        return self.optimizer.iterations < warmup

    def build(self, variables):
        """The W copies (and DC-ASGD-a's MeanSquare, ``backward_passes_per_step``'s sums) before the first trace:
        left to it, they made fit trace the train step twice (first fit 2.8 s against allreduce's 1.4 s, 2 ranks)."""
        build_slots(self.optimizer, variables)
        with tf.init_scope():
            for v in variables:
                if v.ref() not in self._w:
                    self._w[v.ref()] = tf.Variable(v.read_value(), trainable=False, name="hetsync_od_w")
                    if int(self.horovod_kwargs.get("backward_passes_per_step", 1) or 1) > 1:
                        self._sums[v.ref()] = tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                          name="hetsync_od_accumulated_gradient")
                    if self.options["local_updater"] == "dc-asgd-a":
                        self._ms[v.ref()] = tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                        name="hetsync_od_mean_square")

    def _ensure(self, variables):
        """The state of the variables this step updates (made here unless ``build`` made it already)."""
        self.build(variables)
        self._variables = list(variables)

    # -- the stages (graph code, inside the compiled train step) ------------------------------------------------
    def _warm(self, pairs, args, kwargs):
        """Warm-up: Horovod's DistributedOptimizer (its allreduce already ran in compute_gradients)."""
        self.cls.apply_gradients(self.optimizer, pairs, *args, **kwargs)
        return tf.constant(True)

    def _global_update(self, variables):
        """Step 1: wait for the outstanding allreduce; W <- the user's optimizer applied to W with the mean."""
        like = list(variables) + [tf.zeros([1], tf.float32)]
        sums, times = self._wait(like)
        count = tf.maximum(sums[-1][0], 1.0)
        mean = [tf.cast(s / count, v.dtype) for s, v in zip(sums[:-1], variables)]
        writes = [v.assign(self._w[v.ref()]) for v in variables]
        spent = tf.stack([times[2] - times[1], tf.maximum(times[2] - times[3], 0.0)])
        with tf.control_dependencies(writes + [self.last_times.assign(times), self.transfer_s.assign_add(spent)]):
            self.cls.apply_gradients(self.optimizer, list(zip(mean, variables)))
        with tf.control_dependencies([self.global_updates.assign_add(1)]):
            return tf.constant(True)

    def _wait(self, like):
        wire = [tf.cast(t, tf.float32) if t.dtype != tf.float32 else t for t in like]
        sums, times = ops.allreduce_wait(self.handle, wire)
        return sums, times

    def _accumulate_or_train(self, grads, variables):
        """Horovod's ``backward_passes_per_step`` N in the training stage: N passes add up locally (their sum, or
        mean with ``average_aggregated_gradients``), then one training step.  (In the warm-up Horovod's own helper
        does it.)"""
        passes = int(self.horovod_kwargs.get("backward_passes_per_step", 1) or 1)
        if passes == 1:
            return self._train(grads, variables)
        sums = [self._sums[v.ref()] for v in variables]
        added = [s.assign_add(g) for s, g in zip(sums, grads)]
        with tf.control_dependencies(added):
            ready = self._passes.assign_add(1) >= passes

        def update():
            total = [s.read_value() for s in sums]
            if self.horovod_kwargs.get("average_aggregated_gradients", False):
                total = [t / passes for t in total]
            done = self._train(total, variables)
            with tf.control_dependencies([done]):
                cleared = [s.assign(tf.zeros_like(s)) for s in sums] + [self._passes.assign(0)]
            with tf.control_dependencies(cleared):
                return tf.constant(True)

        return tf.cond(ready, update, lambda: tf.constant(False))

    def _train(self, grads, variables):
        local = [tf.identity(v.read_value()) for v in variables]  # L_t: where g_t was computed
        with tf.control_dependencies(local):
            updated = tf.cond(self.pending, lambda: self._global_update(variables), lambda: tf.constant(False))
        with tf.control_dependencies([updated]):
            w_t = [self._w[v.ref()].assign(v.read_value()) for v in variables]  # W_t (the model holds it now)
        with tf.control_dependencies(w_t):
            wire = [tf.cast(g, tf.float32) for g in grads] + [tf.reshape(self.contribution, [1])]
            handle = ops.allreduce_start(wire, timeout=self.options["timeout"])
            started = [self.handle.assign(handle), self.pending.assign(True)]
        with tf.control_dependencies(started):
            if self.options["local_updater"] == "optimizer":
                steps = self._optimizer_step(grads, variables)
            else:
                steps = [v.assign(self._local(v, g, self._w[v.ref()].read_value(), l))
                         for v, g, l in zip(variables, grads, local)]
        with tf.control_dependencies(steps):
            return tf.constant(True)

    def _optimizer_step(self, grads, variables):
        """Local updater "optimizer": the model (W_t now) takes the user's optimizer's step with this rank's g_t,
        and the optimizer's state is put back: the global update stays the only one that moves slots and
        ``iterations``, identical on every rank."""
        state = optimizer_variables(self.optimizer)
        saved = [tf.identity(s.read_value()) for s in state]
        with tf.control_dependencies(saved):  # the user's class: Horovod's wrapper would allreduce g_t again
            apply_locally(self.optimizer, list(zip(grads, variables)))
        with tf.control_dependencies([v.read_value() for v in variables]):
            return [s.assign(x) for s, x in zip(state, saved)]

    def _learning_rate(self):
        if self.options["local_lr"] is not None:
            return tf.constant(float(self.options["local_lr"]))
        lr = self.optimizer.learning_rate
        if callable(lr):
            lr = lr(self.optimizer.iterations)
        return tf.convert_to_tensor(lr)

    @property
    def dc_lambda(self):
        """λ of the DC-ASGD updaters: the option, else the value §4.3 uses with this updater."""
        lam = self.options["dc_lambda"]
        return float(PAPER_DC_LAMBDA.get(self.options["local_updater"], 0.0) if lam is None else lam)

    def _local(self, v, g, w, l):
        """The local updater (§3.3): L_{t+1} from W_t, g_t (computed at L_t) and L_t."""
        eta = tf.cast(self._learning_rate(), v.dtype)
        kind = self.options["local_updater"]
        if kind == "sgd":
            return w - eta * g
        lam = tf.cast(self.dc_lambda, v.dtype)
        if kind == "dc-asgd-c":  # eq. 4
            return w - eta * (g + lam * g * g * (w - l))
        m = float(self.options["mean_square_decay"])  # eqs. 5-6
        ms = self._ms[v.ref()].assign(m * self._ms[v.ref()] + (1.0 - m) * g * g)
        return w - eta * (g + lam / tf.sqrt(ms + 1e-7) * g * g * (w - l))

    # -- sync points, idle ranks ---------------------------------------------------------------------------------
    def flush(self):
        """Completes the outstanding allreduce and sets the model to W (the same on every worker)."""
        if self._variables is None or not bool(self.pending.numpy()):
            return
        self._global_update(self._variables)
        self.pending.assign(False)
        for v in self._variables:
            self._w[v.ref()].assign(v)

    def on_consensus_begin(self):
        self.flush()

    def metrics(self):
        """Global updates of the training stage; the last allreduce's engine times (started, data, done, waited);
        the mean transfer time and the mean part of it a step waited for (not hidden by the next step's compute)."""
        n = max(int(self.global_updates.numpy()), 1)
        spent = self.transfer_s.numpy() / n
        return {"global_updates": int(self.global_updates.numpy()),
                "mean_transfer_s": float(spent[0]), "mean_exposed_wait_s": float(spent[1]),
                "last_allreduce_times": [float(t) for t in self.last_times.numpy()],
                "in_warmup": bool(self.in_warmup().numpy())}
