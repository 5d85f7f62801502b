"""``sync="esync"``: ESync -- fast workers take local steps until the slowest is ready, then one aggregation
(ESync §3.1 Algorithm 1 for the worker, §4.1 Algorithm 2 for the State Server, §4.2 for the non-blocking query).

**One Keras step is one ESync round** (hetsync/training/ calls :meth:`ESync.run_step`, not the compiled step):

0. RUN-BATCH-DATA-TEST (Algorithm 1 line 3, ``batch_data_test=True``), each time ESync is entered: local
   iterations on real batches, timed and undone, and a k = 0 query, so round 0 is decided on measured capabilities;
1. local iterations of the compiled train step (the user's optimizer and loss) while the State Server
   (coordinator/state_server/, on rank 0) answers NOT-READY; the first asks nothing (Algorithm 2 answers NOT-READY
   to k = 0), so the slowest worker takes exactly one, a worker c times faster about c;
2. roll call (``StateWait``): a worker that never comes is named in an error after ``timeout`` seconds instead of
   leaving everyone inside a Horovod collective that never completes;
3. aggregation: Δ_i = w_local - w_t (eq. 6), ONE Horovod allreduce (Sum) of the fused Δ, the non-trainable float
   variables (BatchNorm statistics) and a contribution flag; w_{t+1} = w_t + ε·mean(Δ) (eqs. 7-8, ε =
   ``global_lr``), bit for bit the same on every worker;
4. RESET-STATE-SERVER with the round's end time.

So every rank takes the same number of Keras steps (callbacks, a user's per-batch collectives, epoch ends stay in
lockstep) while a fast worker processes more batches per step: its dataset must supply them (``dataset.repeat()``
with ``steps_per_epoch``).  A rank whose iterator runs out ends the round there and only aggregates afterwards.

Choices where the paper is silent, and the options that keep the paper's rule (docs/modes/esync.md tabulates them
with measurements):

* The mean is over the workers that trained this round (the flag's sum).  An idle worker (stopped early,
  hetsync/training/) runs only the aggregation, with Δ = 0 and flag 0, so the others' allreduce completes and it
  receives their models, and it is away for the State Server.
* RUN-BATCH-DATA-TEST runs three iterations, undone (Algorithm 1 starts round 0 from w_0), and takes the shorter of
  the second and third durations (the first may include tracing).  A lazily built model gets its variables in an
  extra first iteration, whose update stays.  Custom loops have no batch test (capabilities start at 0).
* Each fit's round 0 starts after an allreduce (w_t <- the average), and the worker reports t_e with a k = 0 query.
* Capability c (Algorithm 1 line 15) is the last local iteration's duration (non-blocking: plus the query's RTT).
* ``non_blocking=True`` (§4.2): the query goes out without waiting and is read after each iteration.
  ``on_ready="abort"`` is the paper's rule: the model, optimizer and metric variables are snapshotted before each
  iteration run while a query is in flight and restored when READY arrived before it ended (a compiled step cannot
  be interrupted: the compute is spent, the iteration counts nowhere).  ``on_ready="finish"`` (ours, the default)
  keeps the iteration's update in Δ.
* w_t starts, at each ``fit``'s first step, as the average of the workers' models, and follows every sync point's
  consensus.
"""
import itertools
import logging
import time

import tensorflow as tf

from hetsync import _runtime
from hetsync.algorithms import register
from hetsync.algorithms._wrap import wrap_post_update
from hetsync.algorithms.base import SyncAlgorithm
from hetsync.algorithms.esync_aggregation import Aggregation
from hetsync.algorithms.esync_snapshot import restore, snapshot
from hetsync.algorithms.options import Option, TIMEOUT

_WRAPS = itertools.count()


@register
class ESync(SyncAlgorithm):
    name = "esync"
    OPTIONS = {
        "global_lr": Option(1.0, "number", minimum=0, above=True, doc="the global learning rate of eq. 7",
                            paper="ESync §3.1 (eqs. 7-8)"),
        "epsilon": Option(0.005, "number", minimum=0, doc="seconds of slack in the State Server's decision",
                          paper="ESync §4.1 (Algorithm 2)"),
        "non_blocking": Option(False, "bool", doc="§4.2's delayed ACK: keep iterating while the query is in flight",
                               paper="ESync §4.2"),
        "on_ready": Option("finish", choices=("finish", "abort"),
                           doc="non-blocking mode, READY during an iteration: 'abort' discards it (§4.2), 'finish' "
                               "keeps its update (ours)", paper="ESync §4.2",
                           paper_rule="abort", acts_with={"non_blocking": True}),
        "batch_data_test": Option(True, "bool", doc="RUN-BATCH-DATA-TEST before round 0 (Algorithm 1 line 3): "
                                                    "round 0 decided on measured capabilities",
                                  paper="ESync §3.1 (Algorithm 1)"),
        "timeout": TIMEOUT,
    }
    LOCAL_ITERATIONS = True  # one Keras step runs run_step (several local iterations)
    STEPPING = "rounds"
    HOROVOD_REASONS = {
        "device_dense": "it places Horovod's gradient allreduce ops on a device; sync={mode!r} allreduces model "
                        "deltas once per round, in host memory",
        "device_sparse": "it places Horovod's sparse gradient allgather ops on a device; sync={mode!r} allreduces "
                         "dense model deltas",
        "gradient_predivide_factor": "sync={mode!r} allreduces model deltas (Sum) and divides once by the workers "
                                     "that trained in the round",
        "op": "sync={mode!r} averages model deltas over the workers that trained (eq. 7); no other reduction",
        "num_groups": "sync={mode!r} fuses every delta into one allreduce per round",
        "groups": "sync={mode!r} fuses every delta into one allreduce per round",
        "scale_local_gradients": "sync={mode!r} allreduces no gradients: each worker applies its own, unscaled",
    }

    # -- set-up -------------------------------------------------------------------------------------------------
    def wrap(self, optimizer):
        _runtime.require_init("sync='esync'")
        services = _runtime.services()
        self.client = services.state_client()  # a channel: the State Server is installed by activate
        self.wait_timeout = float(self.options["timeout"] or _runtime.timeout())
        self.scope = f"hetsync.esync.{next(_WRAPS)}"
        self.local_hooks = []          # callbacks with on_local_iteration_begin/_end (the training layer sets them)
        self.model = None
        self._round, self._c, self._rtt, self._slowest_last = 0, 0.0, 0.0, -1
        self._tested, self.aborted = False, 0  # batch test done for this State Server; iterations aborted (§4.2)
        self._job_steps = 0
        self._fresh, self._exhausted, self._idle = True, False, False
        self._aggregation, self._built_for = None, None
        self.steps_per_round, self.blocking_s = [], []
        self._iteration_s = [0.0, 0]  # sum and count of local iteration times (mean capability)
        self._round_iterations = []   # compute seconds of each local iteration of the last round
        return wrap_post_update(optimizer, self)

    def _build(self, model):
        """w_t variables and the compiled aggregation, once per model."""
        if self.model is model and self._aggregation is not None and self._built_for is model:
            return
        self._built_for = model
        self.model = model
        trainable = self.shared(model.trainable_variables)
        ids = {id(v) for v in model.trainable_variables}
        others = [v for v in self.shared(model.variables) if v.dtype.is_floating and id(v) not in ids]
        self._aggregation = Aggregation(trainable, others, self.scope, self.compression, self.options["global_lr"])

    # -- one Keras step = one round -----------------------------------------------------------------------------
    def run_step(self, train_function, iterator):
        """Local iterations while NOT-READY, roll call, aggregation, reset; returns the last iteration's logs."""
        if self._fresh:
            self._begin_fit(train_function, iterator)
        logs, k = None, 0
        future, asked_at = None, None
        iterations = []
        non_blocking = self.options["non_blocking"]
        while not self._exhausted:
            if k > 0:
                if non_blocking:
                    future, asked_at, ready = self._poll(future, asked_at, k)
                else:
                    ready = self.client.query(k, self._c, self._t_e)
                if ready:
                    break
            saved = snapshot(self.model) if future is not None and self.options["on_ready"] == "abort" else None
            try:
                out, took = self._iterate(train_function, iterator)
            except (tf.errors.OutOfRangeError, StopIteration):
                if k == 0:
                    raise  # as in any mode: Keras ends the epoch
                self._exhausted = True
                break
            iterations.append(took)
            if saved is not None and self._ready_during(future, self._t_e):
                restore(saved)  # §4.2: READY came while it ran -- it never happened
                self.aborted += 1
                break
            logs = out
            self._c = took + (self._rtt if non_blocking else 0.0)
            k += 1
        self.steps_per_round.append(k)
        self._round_iterations = iterations
        self._finish_round(active=1.0, steps=k)
        return logs if logs is not None else self._metric_logs()

    def _iterate(self, train_function, iterator, count=True):
        """One local iteration (Algorithm 1 lines 10-14) with the per-iteration hooks; returns (logs, seconds).
        ``count``: into the mean iteration time (not the batch test's: its first may be a trace)."""
        began = time.monotonic()
        for hook in self.local_hooks:
            hook.on_local_iteration_begin()
        logs = train_function(iterator)
        for hook in self.local_hooks:
            hook.on_local_iteration_end()
        self._t_e = time.monotonic()
        if count:
            self._iteration_s[0] += self._t_e - began
            self._iteration_s[1] += 1
        return logs, self._t_e - began

    def _ready_during(self, future, ended):
        """§4.2: did a READY answer to the query in flight arrive before the iteration that just ended did?"""
        if not future.done():
            return False
        if getattr(future, "answered_at", ended) > ended:  # it came after the iteration: nothing was in flight
            return False
        return future.exception() is None and bool(future.result().ready)

    # -- RUN-BATCH-DATA-TEST and the abort's snapshots -------------------------------------------------------------
    def _begin_fit(self, train_function, iterator):
        """A fit's first round: the batch test (once per State Server), then w_t <- the workers' average (an
        allreduce: a barrier), then a k = 0 query with t_e = the barrier's end, where round 0 starts: a t_e from
        before it (the test's, the last fit's reset) would make the slowest look nearly done, as tracing and
        waiting at the barrier took seconds, and end round 0 after one step everywhere.  A model still unbuilt
        without the test starts w_t at the first round's end (_finish_round)."""
        if self.options["batch_data_test"] and not self._tested:
            self._batch_data_test(train_function, iterator)
        if self.model.built:
            self._build(self.model)
            self._start_fit()
            self.client.query(0, self._c, self._t_e)

    def _batch_data_test(self, train_function, iterator):
        """Algorithm 1 line 3, c <- RUN-BATCH-DATA-TEST(b), then line 8's first QUERY-STATE (k = 0: always
        NOT-READY) reports it, before _start_fit's allreduce: every worker's capability is on the State Server
        before anyone's round 0 asks it anything.  The iterations are undone (line 6: round 0 starts from w_0).
        The first may trace the train step: c is the shorter of the next two (one iteration disturbed by another
        process would make a fast worker the "slowest" for all of round 0).  A lazily built model gets its
        variables in an extra first iteration, kept (nothing to restore it to)."""
        if not self.model.built:
            self._iterate(train_function, iterator, count=False)
        saved = snapshot(self.model)
        took = min([self._iterate(train_function, iterator, count=False)[1] for _ in range(3)][1:])
        restore(saved)
        self._c, self._tested = took, True
        self.client.query(0, self._c, self._t_e)
        logging.getLogger(__name__).info("ESync RUN-BATCH-DATA-TEST: capability %.4f s", took)

    def idle_step(self, train_function, iterator):
        """An idle rank (hetsync/training/) trains nothing: it only takes part in the round's allreduce, with Δ = 0.
        (A model not built yet is built by one train step first: the aggregation needs its variables.)"""
        if self._fresh and not self.model.built:
            train_function(iterator)
        if self._fresh:
            self._start_fit()
        self._finish_round(active=0.0, steps=0)
        return self._metric_logs()

    def attach(self, model, local_hooks):
        """hetsync/training/, at on_train_begin: the model and the callbacks that act per local iteration.  A model
        built lazily (no Input layer, as in Horovod's examples) has no variables before its first step: the first
        round then builds w_t at its end (_finish_round)."""
        self.model = model
        if model.built:
            self._build(model)
        self.local_hooks = list(local_hooks)
        self._fresh, self._exhausted = True, False

    def begin_loop(self, model):
        """A custom loop (hetsync.job_steps) trains ``model``: rounds start afresh (w_t at the first round's end)."""
        self.model = model
        self._fresh, self._exhausted, self._idle = True, False, False
        self._t_e = time.monotonic()

    def round_ready(self, local_steps, capability_s, finished_at):
        """Algorithm 1's query after a local iteration of a custom loop (blocking form)."""
        self._c, self._t_e = capability_s, finished_at
        self._iteration_s[0] += capability_s
        self._iteration_s[1] += 1
        return bool(self.client.query(local_steps, capability_s, finished_at))

    def finish_round(self, active, steps):
        """The round's roll call and aggregation in a custom loop; returns the ranks that trained in it."""
        if active:
            self.steps_per_round.append(steps)
        return self._finish_round(active=active, steps=steps)

    def on_epoch_begin(self):
        """A new epoch has a new iterator (hetsync/training/)."""
        self._exhausted = False

    def _start_fit(self):
        """First step of a fit: w_t <- the average of the workers' models (one Horovod allreduce)."""
        self._aggregation.fn(tf.constant(1.0), True, tf.constant(0.0))
        self._fresh = False
        self._t_e = time.monotonic()

    def _poll(self, future, asked_at, k):
        """Non-blocking query (§4.2): read the answer if it came, else keep one query in flight.  The worker
        the last answer named the slowest asks and waits: Algorithm 2 answers it READY after any step, so there is
        nothing to overlap, and an iteration more would delay everyone's aggregation by a whole slow step.  So
        does a worker that has had no answer yet (a fresh State Server): it may be the slowest."""
        if future is not None and future.done():
            future, ready = None, self._read(future, asked_at)
            if ready:
                return None, None, True
        if future is None:
            asked_at = time.monotonic()
            future = self.client.query_async(k, self._c, self._t_e)
            future.add_done_callback(lambda f: setattr(f, "answered_at", time.monotonic()))
            if self._slowest_last in (-1, self.client.worker):
                return None, None, self._read(future, asked_at)
        return future, asked_at, False

    def _read(self, future, asked_at):
        reply = future.result()
        self._rtt = getattr(future, "answered_at", time.monotonic()) - asked_at
        self._slowest_last = reply.slowest
        return bool(reply.ready)

    def _finish_round(self, active, steps):
        waited = time.monotonic()
        if active:
            self._roll_call()
        if self._fresh:  # the model was built by this round's first iteration: w_t <- the workers' average now
            self._build(self.model)
            trained, job_steps = self._aggregation.fn(tf.constant(1.0), True, tf.constant(float(steps)))
            self._fresh = False
        else:
            trained, job_steps = self._aggregation.fn(tf.constant(active), False, tf.constant(float(steps)))
        self._job_steps = int(round(float(job_steps)))
        now = time.monotonic()
        if active:
            self.blocking_s.append(now - waited)
        self._round += 1
        if not self._idle:
            self.client.reset(self._round, now)
        self._t_e = now
        return int(round(float(trained)))

    def _roll_call(self):
        import grpc

        try:
            self.client.wait(self._round, self.wait_timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "ESync round" in (exc.details() or ""):
                raise tf.errors.DeadlineExceededError(None, None, exc.details()) from None
            raise RuntimeError(f"ESync State Server (rank 0) unreachable or failed: {exc.code()}: "
                               f"{exc.details()}") from None

    def _metric_logs(self):
        return {m.name: m.result() for m in self.model.metrics}

    # -- training layer / sync points ---------------------------------------------------------------------------------
    def on_consensus_end(self, finished):
        """The models were averaged (identical already after a round): w_t follows them."""
        if self._aggregation is not None:
            self._aggregation.follow_models()

    def pretrace(self, model, iterator):
        """The aggregation (a fit's first round, and every later one), traced before a switch needs it."""
        self._build(model)
        for start in (True, False):
            self._aggregation.fn.get_concrete_function(tf.constant(1.0), start, tf.constant(0.0))

    def activate(self):
        """ESync is entered (first use, or a live switch back): a fresh State Server (collective), and the next
        step starts a new fit's rounds."""
        _runtime.services().install_state_server(float(self.options["epsilon"]))
        self._round, self._slowest_last, self._tested = 0, -1, False
        self._fresh, self._exhausted = True, False

    def deactivate(self):
        """A live switch leaves ESync: the State Server must not wait for this worker any more."""
        self.client.away()

    def last_job_steps(self):
        return self._job_steps

    def last_round_timing(self):
        """(local iterations, their compute seconds) of the last round, for sync="auto" and reports."""
        return len(self._round_iterations), sum(self._round_iterations)

    def last_round_iterations(self):
        """The compute seconds of each local iteration of the last round: sync="auto" takes one sample per
        iteration, not the round's mean, which would dilute one slow iteration among a fast rank's many."""
        return list(self._round_iterations)

    def on_idle(self):
        self._idle = True
        self.client.away()

    def on_resume(self):
        self._idle = False

    def metrics(self):
        """Rounds, local iterations per round (mean, last ones), aggregation blocking time, capability."""
        rounds = self.steps_per_round
        block = self.blocking_s
        return {"rounds": self._round, "mean_local_steps": sum(rounds) / len(rounds) if rounds else 0.0,
                "local_steps_last": rounds[-5:], "capability_s": self._c,
                "mean_iteration_s": self._iteration_s[0] / max(self._iteration_s[1], 1),
                "mean_blocking_s": sum(block) / len(block) if block else 0.0, "aborted": self.aborted}
