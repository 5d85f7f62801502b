"""A Horovod Keras training script in the shape of Horovod's own TF2 Keras MNIST example, with one line changed.

What a Horovod user has: Adam with the learning rate scaled by the number of workers, ``hvd.DistributedOptimizer``
with ``backward_passes_per_step`` / ``average_aggregated_gradients``, ``BroadcastGlobalVariablesCallback(0)``,
``MetricAverageCallback()``, ``LearningRateWarmupCallback``, ``ModelCheckpoint`` on rank 0, progress bars on rank 0.
hetsync changes two lines: ``hetsync.init()`` after ``hvd.init()``, and the optimizer wrapper::

    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
    opt = hetsync.DistributedOptimizer(opt, sync=args.sync, backward_passes_per_step=1,          # <- this line
                                       average_aggregated_gradients=True)

The data is scikit-learn's bundled 8x8 digits (nothing is downloaded), shaped as images for a small CNN.

Flags beyond Horovod's example turn on the situations hetsync must survive (tests/test_dropin.py runs them):
``--slow-rank/--factor`` (one rank slower per step), ``--allreduce-every N`` (a custom callback calls
``hvd.allreduce`` every N batches), ``--time-budget T0,T1,..`` (rank r stops after T_r seconds of its own clock),
``--batch-budget B0,B1,..`` (rank r stops after its B_r-th batch; 0: no budget -- the same stop at a point no other
rank knows, decided by a count instead of a clock, so a test gets it at the same batch on any machine),
``--early-stop-rank R`` (EarlyStopping fires on rank R only), ``--uneven`` (rank r's epochs are shorter: uneven
shards), ``--consensus`` (add hetsync.callbacks.ConsensusCallback), ``--refit`` (call fit a second time).

    horovodrun --mpi -np 4 -H localhost:4 python examples/horovod_keras_mnist.py --sync ripples-smart
"""
import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.training  # noqa: E402
import hetsync.callbacks  # noqa: E402
import hetsync.testing  # noqa: E402
from common import digit_images_split, without_autotune  # noqa: E402  (examples/common.py, beside this script)
from user_callbacks import PeriodicAllreduce  # noqa: E402  (a user's own callback, beside this script)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sync", default="allreduce", help="hetsync mode (hetsync.available_modes())")
    p.add_argument("--sync-options", default="{}", help="the mode's options, as JSON")
    p.add_argument("--per-rank-epochs", action="store_true", help="job_epochs=False: N train steps per rank")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--data", choices=("shard", "full"), default="shard",
                   help="shard: rank r trains on x[r::size]; full: every rank on the whole training set, shuffled "
                        "with its own seed (Horovod's tensorflow2_keras_mnist.py)")
    p.add_argument("--lr", type=float, default=0.002, help="Adam learning rate per worker (scaled by size)")
    p.add_argument("--warmup-epochs", type=float, default=1)
    p.add_argument("--compute", type=float, default=0.0, help="emulated compute seconds per step, every rank")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--factors", default=None,
                   help="comma list, one slowdown factor per rank (instead of --slow-rank/--factor)")
    p.add_argument("--base-time", type=float, default=0.01, help="normal step time the slowdown multiplies")
    p.add_argument("--allreduce-every", type=int, default=0)
    p.add_argument("--time-budget", default=None, help="comma-separated seconds per rank")
    p.add_argument("--batch-budget", default=None, help="comma-separated batches per rank (0: none)")
    p.add_argument("--early-stop-rank", type=int, default=None)
    p.add_argument("--uneven", action="store_true")
    p.add_argument("--consensus", default=None, help="add hetsync.callbacks.ConsensusCallback(every=...): epoch, N or none")
    p.add_argument("--refit", action="store_true", help="call fit again after the first one")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--summary-dir", default=None, help="write summary<rank>.json here")
    p.add_argument("--target-loss", type=float, default=None, help="exit 1 unless the final test loss reaches it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-autotune", action="store_true",
                   help="tf.data autotuning off: TensorFlow 2.15 can hold one rank at the end of fit for up to 60 s "
                        "(docs/limitations.md); the test suite turns it off, users' scripts keep TF's default")
    p.add_argument("--switch-to", default=None, help='live switch: a mode, or mode{"option": value} (SyncModeCallback)')
    p.add_argument("--switch-at", type=int, default=0, help="rank 0 requests --switch-to after this Keras step")
    p.add_argument("--sync-mode-callback", action="store_true", help="a SyncModeCallback callback that never switches")
    p.add_argument("--stop-at-loss", type=float, default=None,
                   help="stop at the first epoch end whose validation loss is at most this (time to target)")
    return p.parse_args(argv)


def build_model():
    """Built lazily at its first call, as Horovod's example builds its model (no Input layer)."""
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


class EpochEnds(tf.keras.callbacks.Callback):
    """Records this rank's fit duration (its own clock) and, at each epoch end, the job's Keras steps since fit began
    (the job's step count goes on across fits in one process) and this rank's train steps so far (its optimizer's
    iterations: a rank that stopped early takes none while it steps along)."""

    def __init__(self):
        super().__init__()
        self.positions, self.iterations, self.fit_s, self.t0, self.start = [], [], None, None, 0

    def on_train_begin(self, logs=None):
        self.t0 = time.monotonic()
        self.start = hetsync.training.position()

    def on_epoch_end(self, epoch, logs=None):
        self.positions.append(hetsync.training.position() - self.start)
        self.iterations.append(int(self.model.optimizer.iterations.numpy()))

    def on_train_end(self, logs=None):
        self.fit_s = time.monotonic() - self.t0


class FirstBatch(tf.keras.callbacks.Callback):
    """Seconds from fit's start to the end of its first batch on this rank (start-up cost: tracing, set-up)."""

    def __init__(self):
        super().__init__()
        self.t0, self.seconds = None, None

    def on_train_begin(self, logs=None):
        self.t0 = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.seconds is None:
            self.seconds = time.monotonic() - self.t0


class SwitchAt(tf.keras.callbacks.Callback):
    """Rank 0 asks for ``mode`` (with ``options``) after its Keras step ``at``: a live switch mid-epoch."""

    def __init__(self, switch, at, mode, options):
        super().__init__()
        self.switch, self.at, self.mode, self.options, self.steps = switch, at, mode, options, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.at and hvd.rank() == 0:
            self.switch.request(self.mode, self.options)


class StopAtLoss(tf.keras.callbacks.Callback):
    """Time to target: stops at the first epoch end whose validation loss is <= ``target`` (the consensus model is
    the same on every rank after the epoch end, so every rank decides alike)."""

    def __init__(self, target, started):
        super().__init__()
        self.target, self.started, self.reached_s, self.epoch = target, started, None, None

    def on_epoch_end(self, epoch, logs=None):
        if self.reached_s is None and (logs or {}).get("val_loss", float("inf")) <= self.target:
            self.reached_s, self.epoch = time.monotonic() - self.started.t0, epoch
            self.model.stop_training = True


class TimeBudget(tf.keras.callbacks.Callback):
    """Stops this rank's training once its own clock passes ``seconds`` (each rank has its own budget)."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.t0, self.stopped_at = seconds, None, None

    def on_train_begin(self, logs=None):
        self.t0 = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.stopped_at is None and time.monotonic() - self.t0 > self.seconds:
            self.model.stop_training = True
            self.stopped_at = time.monotonic() - self.t0


class BatchBudget(tf.keras.callbacks.Callback):
    """Stops this rank's training after its ``batches``-th batch of fit (each rank has its own budget)."""

    def __init__(self, batches):
        super().__init__()
        self.batches, self.seen, self.stopped_at = batches, 0, None

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.stopped_at is None and self.seen >= self.batches:
            self.model.stop_training = True
            self.stopped_at = self.seen


def consensus_callback(spec):
    if spec is None:
        return []
    every = {"epoch": "epoch", "none": None}.get(spec, None if spec == "none" else spec)
    return [hetsync.callbacks.ConsensusCallback(every=int(every) if isinstance(every, str) and every.isdigit() else every)]


def weights_checksum(model):
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)
    return hashlib.sha256(flat.tobytes()).hexdigest()[:16]


def main():
    args = parse()
    hvd.init()
    hetsync.init()
    loss = train(args)
    hetsync.shutdown()
    if args.target_loss is not None and loss > args.target_loss:
        print(f"rank {hvd.rank()}: test loss {loss:.4f} did not reach the target {args.target_loss}", file=sys.stderr)
        sys.exit(1)


def train(args):
    """One training run of this script (after hvd.init and hetsync.init); returns this rank's final test loss."""
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed + rank)  # different initial weights: the broadcast must align them

    x, y, xt, yt = digit_images_split(args.seed)
    steps = args.steps_per_epoch - (3 * rank if args.uneven else 0)  # uneven shards: shorter epochs on high ranks
    mine = slice(None) if args.data == "full" else slice(rank, None, size)
    dataset = (tf.data.Dataset.from_tensor_slices((x[mine], y[mine]))
               .repeat().shuffle(1000, seed=args.seed + rank).batch(args.batch_size))
    if args.no_autotune:
        dataset = without_autotune(dataset)
    model = build_model()

    scaled_lr = args.lr * size
    opt = tf.keras.optimizers.Adam(scaled_lr)
    # Horovod: opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
    opt = hetsync.DistributedOptimizer(opt, sync=args.sync, backward_passes_per_step=1,
                                       average_aggregated_gradients=True, job_epochs=not args.per_rank_epochs,
                                       **json.loads(args.sync_options))
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt,
                  metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs,
                                                 steps_per_epoch=steps, verbose=0),
    ]
    if args.compute:
        callbacks.append(hetsync.testing.EmulatedComputeCallback(args.compute))
    if args.factors:
        callbacks.append(hetsync.testing.SlowdownCallback("deterministic", factors=[float(f) for f in args.factors.split(",")],
                                                  base_time=args.base_time))
    elif args.slow_rank is not None:
        callbacks.append(hetsync.testing.SlowdownCallback("deterministic", ranks=[args.slow_rank], factor=args.factor,
                                                  base_time=args.base_time))
    ends = EpochEnds()
    callbacks.append(ends)
    first = FirstBatch()
    callbacks.append(first)
    switch = hetsync.callbacks.SyncModeCallback() if args.switch_to or args.sync_mode_callback else None
    callbacks += [switch] if switch else []
    if args.switch_to:
        at = args.switch_to.find("{")
        mode, options = (args.switch_to, {}) if at < 0 else (args.switch_to[:at], json.loads(args.switch_to[at:]))
        callbacks.append(SwitchAt(switch, args.switch_at, mode, options))
    target = StopAtLoss(args.stop_at_loss, ends) if args.stop_at_loss is not None else None
    callbacks += [target] if target else []
    user = PeriodicAllreduce(args.allreduce_every) if args.allreduce_every else None
    callbacks += [user] if user else []
    budget = None
    if args.time_budget:
        budget = TimeBudget(float(args.time_budget.split(",")[rank]))
        callbacks.append(budget)
    batch_budget = None
    if args.batch_budget and int(args.batch_budget.split(",")[rank]) > 0:
        batch_budget = BatchBudget(int(args.batch_budget.split(",")[rank]))
        callbacks.append(batch_budget)
    if args.early_stop_rank == rank:
        # fires after the second epoch on this rank only: the loss never improves by 10
        callbacks.append(tf.keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1))
    callbacks += consensus_callback(args.consensus)
    if rank == 0 and args.checkpoint_dir:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.weights.h5"), save_weights_only=True))
    verbose = 1 if rank == 0 and sys.stdout.isatty() else 0

    t0 = time.time()
    history = hetsync.keras.fit(model, dataset, steps_per_epoch=steps, callbacks=callbacks, epochs=args.epochs, verbose=verbose,
                        validation_data=(xt, yt))
    epochs_run = len(history.history.get("loss", []))
    if args.refit:  # fit again afterwards: a fresh round of every guarantee
        hetsync.keras.fit(model, dataset, steps_per_epoch=steps, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.MetricAverageCallback()] + consensus_callback(args.consensus))
    train_time = time.time() - t0

    # After training, as users do: evaluate with metric averaging; broadcast after loading rank 0's checkpoint.
    loss, acc = model.evaluate(xt, yt, verbose=0)
    avg_loss = float(hvd.allreduce(tf.constant(loss), name="final.loss"))
    checksum = weights_checksum(model)  # the model fit left on this rank
    if args.checkpoint_dir:
        latest = os.path.join(args.checkpoint_dir, f"checkpoint-{epochs_run}.weights.h5")
        if rank == 0:
            model.load_weights(latest)
        hvd_tf.broadcast_variables(model.variables, root_rank=0)
    summary = {
        "rank": rank, "sync": args.sync, "loss": float(loss), "accuracy": float(acc), "avg_loss": avg_loss,
        "val_loss": [float(v) for v in history.history.get("val_loss", [])],
        "epochs_run": epochs_run, "steps_per_epoch": steps, "train_time_s": train_time,
        "fit_time_s": ends.fit_s, "epoch_end_positions": ends.positions,
        "epoch_end_iterations": ends.iterations, "first_batch_s": first.seconds,
        "target_reached_s": target.reached_s if target else None, "target_epoch": target.epoch if target else None,
        "iterations": int(model.optimizer.iterations.numpy()), "weights_checksum": checksum,
        "switches": [(h["from"], h["to"], h["position"]) for h in hetsync.switch_history(model)],
        "after_checkpoint_broadcast_checksum": weights_checksum(model),
        "user_allreduces": user.calls if user else 0,
        "stopped_by_budget_at_s": budget.stopped_at if budget else None,
        "stopped_by_budget_at_batch": batch_budget.stopped_at if batch_budget else None,
        "engine": hetsync.ops.engine_stats(),
        "algorithm": hetsync.metrics(opt),
    }
    print(f"rank {rank}: sync={args.sync} epochs={epochs_run} test loss {loss:.4f} acc {acc:.3f} "
          f"iterations {summary['iterations']} train {train_time:.1f}s checksum {checksum}",
          flush=True)
    if args.summary_dir:
        os.makedirs(args.summary_dir, exist_ok=True)
        with open(os.path.join(args.summary_dir, f"summary{rank}.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return loss


if __name__ == "__main__":
    main()
