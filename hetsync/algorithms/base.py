"""The one interface every synchronization method implements (one module per method, registered by name).

``DistributedOptimizer`` only looks a name up in the registry and asks the algorithm to wrap the user's optimizer;
everything method-specific lives in the algorithm's module.
"""
from hetsync.algorithms import horovod_kwargs
from hetsync.algorithms._wrap import flush_accumulation
from hetsync.algorithms.options import check_all, did_you_mean


class SyncAlgorithm:
    """Base class of a synchronization method.

    Subclasses set ``name`` (the ``sync=`` string), ``OPTIONS`` (option name -> ``options.Option``: default, type, bounds) and implement
    ``wrap(optimizer)``.  Decentralized methods (workers hold different parameters between synchronizations) use
    the ``on_consensus_*`` hooks (see decentralized.py) to withdraw the worker from hetsync's collectives while the
    job averages parameters with Horovod, so nobody waits on a worker that is busy elsewhere.

    Every mode also accepts all keyword arguments of ``horovod.tensorflow.keras.DistributedOptimizer``
    (horovod_kwargs.NAMES): the constructor splits ``**options`` into the mode's own ``OPTIONS`` (``self.options``)
    and Horovod's (``self.horovod_kwargs``, as passed).  Unless ``HOROVOD_PASSTHROUGH`` (the mode hands them to
    Horovod itself, like ``allreduce``), they are validated and resolved here for a parameter-averaging mode:

    - ``self.compression``: ``hvd.Compression.none`` or ``hvd.Compression.fp16`` (what the sync sends);
    - ``self.backward_passes_per_step``, ``self.average_aggregated_gradients``, ``self.sparse_as_dense``,
      ``self.scope_name`` (Horovod's ``name``): applied by ``_wrap.wrap_post_update``;
    - ``process_set``: only the global one (else ValueError);
    - the rest (``op``, ``device_dense``, ...): accepted with one warning on rank 0 when not at Horovod's default
      (``self.ignored_horovod_kwargs`` says why).

    ``HOROVOD_APPLIED`` lists the kwargs the mode applies (default: those ``wrap_post_update`` applies); a mode whose
    ``wrap`` does not go through ``wrap_post_update`` applies them itself or narrows ``HOROVOD_APPLIED``.
    """

    name = None
    OPTIONS = {}
    # How the mode's ranks step (hetsync/training/job_epochs.py): "own" (each at its own pace: an epoch is the job's
    # train steps, shared by speed), "rounds" (one Keras step is a round of local iterations, ESync) or "lockstep"
    # (one train step per rank per Keras step, synchronous).
    STEPPING = "own"
    consensus_every = None  # batches between mid-epoch model averages (None: epoch ends only)
    consensus_epochs = 1    # epoch ends between model averages (the others are sync points without an average)
    # Why the mode cannot run in a custom loop (hetsync.job_steps), or None: it can.  job_steps raises it as a
    # ValueError on every rank before any collective.
    NO_CUSTOM_LOOPS = None
    # The mode trains in a bare custom loop (its optimizer's apply_gradients called outside hetsync.keras.fit and
    # hetsync.job_steps): a lockstep mode that is Horovod's allreduce in every step, under Horovod's own rule (every
    # rank runs the same steps).  Else such a loop is refused at its first step (hetsync/training/front_door.py).
    BARE_LOOP = False
    KERAS_TRAIN_STEP = True  # the mode runs Keras' compiled train function (balanced runs its own micro-batch step)
    HOROVOD_APPLIED = horovod_kwargs.APPLIED_BY_WRAPPER
    HOROVOD_PASSTHROUGH = False
    HOROVOD_REASONS = {}  # overrides of horovod_kwargs.REASONS (the warning's "why") for this mode
    # A HOROVOD_PASSTHROUGH mode whose Horovod optimizer runs only part of the training (OD-SGD's warm-up): the
    # kwargs that the rest does not apply, and why.  Set to another value than Horovod's default, they are named
    # in the same one warning on rank 0.
    HOROVOD_PART_TIME = {}
    # What a mode that wraps the user's optimizer with _wrap.wrap_post_update exchanges around each local update:
    # gradients before it (``before_update``: eager-SGD, Hop) and/or parameters after it (``after_update``:
    # Ripples, Hop).  The wrapper calls only the hooks declared here as in use.
    EXCHANGES_GRADIENTS = False
    EXCHANGES_PARAMETERS = False

    def __init__(self, **options):
        clash = sorted(set(self.OPTIONS) & set(horovod_kwargs.NAMES))
        if clash:
            raise TypeError(f"{type(self).__name__}.OPTIONS redefines Horovod keyword argument(s) {clash}")
        unknown = sorted(set(options) - set(self.OPTIONS) - set(horovod_kwargs.NAMES))
        if unknown:
            valid = ", ".join(sorted(self.OPTIONS)) or "(none)"
            raise ValueError(
                f"unknown option(s) {unknown} for sync={self.name!r}; valid options: {valid}; and Horovod "
                f"DistributedOptimizer keyword arguments (accepted by every mode): "
                f"{', '.join(sorted(horovod_kwargs.NAMES))}"
                f"{did_you_mean(unknown, [*self.OPTIONS, *horovod_kwargs.NAMES])}")
        self.options = check_all(f"sync={self.name!r}", self.OPTIONS,
                                 {k: v for k, v in options.items() if k in self.OPTIONS})
        # Horovod's register_local_var: refs of variables that stay this worker's own (no exchange, no consensus
        # average).  One set for every mode of a family (switching.Family shares it).
        self.local_vars = set()
        self.horovod_kwargs = {k: v for k, v in options.items() if k in horovod_kwargs.NAMES}
        if self.HOROVOD_PASSTHROUGH:
            resolved = None
            self.compression = self.horovod_kwargs.get("compression", horovod_kwargs._compression().none)
            self.ignored_horovod_kwargs = horovod_kwargs.part_time(self.name, self.horovod_kwargs,
                                                                   self.HOROVOD_PART_TIME)
        else:
            resolved = horovod_kwargs.resolve(self.name, self.horovod_kwargs, self.HOROVOD_APPLIED,
                                              self.HOROVOD_REASONS)
            self.compression = resolved.compression
            self.ignored_horovod_kwargs = resolved.ignored
        self.backward_passes_per_step = resolved.backward_passes_per_step if resolved else 1
        self.average_aggregated_gradients = resolved.average_aggregated_gradients if resolved else False
        self.sparse_as_dense = resolved.sparse_as_dense if resolved else False
        self.scope_name = resolved.scope_name if resolved else None
        self._compute_stamp = None  # (make_compute_stamp)
        self.validate()
        horovod_kwargs.warn_ignored(self.name, self.ignored_horovod_kwargs)

    def validate(self):
        """Checks between option values (each value's type and bounds were checked against ``OPTIONS`` already);
        raise ValueError naming the options and what is allowed."""

    def preflight(self):
        """Checks that need the job (its size, this rank's placement) but no peer: every error ``wrap`` could raise
        on some ranks only.  A live switch runs it on every rank and refuses the switch everywhere when it fails
        anywhere (hetsync/switching.py), before any rank leaves the mode in force; ``wrap`` may call it again."""

    def wrap(self, optimizer):
        """Returns a Keras optimizer that trains with this method."""
        raise NotImplementedError

    def build(self, variables):
        """Creates this mode's own per-variable state for ``variables`` (the model's trainable ones), outside any
        tf.function, before fit traces its first step (hetsync/training/keras_fit.py, a switch into the mode): a
        ``tf.function`` whose first trace creates variables is traced twice, so state left to the trace doubles the
        first step's tracing on every rank.  Default: nothing (the mode keeps no such state)."""

    def before_update(self, grads, variables):
        """``EXCHANGES_GRADIENTS``, graph code in the train step: this step's gradients (dense, None ones left out)
        of ``variables`` in, the gradients the local update applies out (the exchanged ones)."""
        return grads

    def after_update(self, variables, iterations):
        """``EXCHANGES_PARAMETERS``, graph code in the train step: after the local update of ``variables`` (its
        ``iterations`` already incremented: iteration k sees k + 1), the parameter exchange."""

    def last_round_timing(self):
        """``STEPPING == "rounds"``: (local iterations, compute seconds) of the last round, for the step clock
        (hetsync/training/step_clock.py), or None: the mode does not time its rounds."""
        return None

    def last_round_iterations(self):
        """``STEPPING == "rounds"``: the compute seconds of each local iteration of the last round (one sample per
        iteration for sync="auto"), or None: only the round's total."""
        return None

    def on_idle(self):
        """This rank stopped while others train on (hetsync/training/): leave every collective of the mode."""

    def idle_step(self, train_function, iterator):
        """One step of an idle rank.  Default (decentralized modes): train nothing, run nothing, return None.
        Synchronous modes run ``train_function`` so the others' collectives complete (and return its logs)."""
        return None

    def on_epoch_begin(self):
        """A new Keras epoch begins (a new data iterator may come with it)."""

    def attach(self, model, local_hooks):
        """``STEPPING == "rounds"``: the model and the per-train-step callbacks, at each fit's start."""

    def run_step(self, train_function, iterator):
        """``STEPPING == "rounds"``: one Keras step (a round of local iterations); returns Keras' logs."""
        raise NotImplementedError(f"sync={self.name!r} steps {self.STEPPING!r}, not in rounds")

    def begin_loop(self, model):
        """``STEPPING == "rounds"``: a custom loop (hetsync.job_steps) starts training ``model``."""
        raise NotImplementedError(f"sync={self.name!r} steps {self.STEPPING!r}, not in rounds")

    def round_ready(self, local_steps, capability_s, finished_at):
        """``STEPPING == "rounds"``, custom loops: after a local iteration, is the round over?"""
        raise NotImplementedError(f"sync={self.name!r} steps {self.STEPPING!r}, not in rounds")

    def finish_round(self, active, steps):
        """``STEPPING == "rounds"``, custom loops: the round's aggregation (collective); ``active``: this rank
        trained ``steps`` local iterations in it.  Returns how many ranks trained in the round."""
        raise NotImplementedError(f"sync={self.name!r} steps {self.STEPPING!r}, not in rounds")

    def last_job_steps(self):
        """``STEPPING == "rounds"``: the train steps the whole job took in the last round (the same on every
        rank: job epochs count them)."""
        return 0

    def on_resume(self):
        """The fit in which this rank was idle has ended (every rank is back at the same point)."""

    def on_consensus_begin(self):
        """Called by the Consensus step before the global average (e.g. to tell a coordinator we pause)."""

    def on_consensus_end(self, finished):
        """Called after the global average; ``finished`` is True on a worker whose training has ended."""

    def activate(self):
        """The mode is entered (collective): its first use (``DistributedOptimizer``), or a live switch into it
        (hetsync/switching.py, after the switch's consensus round, before ``on_consensus_end``).  Installs what the
        mode keeps outside this process (a coordinator service's configuration, a watcher thread): ``wrap`` only
        builds the optimizer and touches no service, so ``sync="auto"`` can pretrace a mode while another runs."""

    def drain(self, optimizer, variables):
        """A live switch leaves this mode (every rank, after ``on_consensus_begin``, before the switch's average):
        gradients the mode holds but has not applied are applied now, as local updates of ``optimizer`` (the
        mode's, in force), so the average that follows shares them and none is lost or applied twice.  Default:
        the ``backward_passes_per_step`` accumulators (_wrap.flush_accumulation).  Returns what was applied (dict of
        counts, for the switch's record)."""
        return {"accumulated": flush_accumulation(optimizer, variables)}

    def deactivate(self):
        """A live switch leaves this mode (after ``on_consensus_begin``): drop state that must not outlive it."""

    def pretrace(self, model, iterator):
        """sync="auto", before this mode is ever used (switching.pretrace): trace the mode's own tf.functions for
        ``model`` and the data of ``iterator`` (not the Keras step, which the caller traces when
        ``KERAS_TRAIN_STEP``), so the first switch into it does not stall on tracing.  Default: nothing."""

    def mark_compute_done(self, tensors):
        """Graph code: records when this step's gradients were ready (``tf.timestamp``), so the step's compute time
        excludes the waits of the exchange that follows (sync="auto", the heterogeneity report).  Returns
        ``tensors`` (dense ones through ``tf.identity``) ordered after the stamp; call it where the gradients enter
        the mode's exchange."""
        import tensorflow as tf

        self.make_compute_stamp()
        dense = [t for t in tensors if isinstance(t, tf.Tensor)]
        with tf.control_dependencies(dense):
            stamped = self._compute_stamp.assign(tf.timestamp())
        with tf.control_dependencies([stamped]):
            return [tf.identity(t) if isinstance(t, tf.Tensor) else t for t in tensors]

    def make_compute_stamp(self):
        """Creates the variable ``mark_compute_done`` writes.  Family.entry calls it right after ``wrap``, outside
        any tf.function: a variable created while Keras traces its train step makes TensorFlow trace the step a
        second time."""
        import tensorflow as tf

        if self._compute_stamp is None:
            with tf.init_scope():
                self._compute_stamp = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                                  name="hetsync_compute_done")

    def compute_done_time(self):
        """``time.time()`` when the last step's gradients were ready (0.0: the mode does not stamp)."""
        return float(self._compute_stamp.numpy()) if self._compute_stamp is not None else 0.0

    def shared(self, variables):
        """``variables`` without the worker-local ones (what the mode exchanges and the consensus averages)."""
        return [v for v in variables if v.ref() not in self.local_vars]

    def metrics(self):
        """Method-specific counters for reports (dict of numbers)."""
        return {}

    def __repr__(self):
        extra = f", horovod={self.horovod_kwargs}" if self.horovod_kwargs else ""
        return f"{type(self).__name__}({self.options}{extra})"
