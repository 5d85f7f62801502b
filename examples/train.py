"""A Horovod Keras training script where hetsync is the one changed line.

    horovodrun --mpi -np 4 python examples/train.py --sync ripples-static --slowdown deterministic --slow-ranks 3

Trains a small MLP on scikit-learn's bundled digits (or the generated hyperplane regression), each worker on its
shard, with the chosen sync mode and heterogeneity.  ``--log-dir`` writes per-rank CSV logs (local-model test loss
over wall time) and a JSON summary the benchmark reads.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hetsync  # noqa: E402
import hetsync.keras  # noqa: E402
import hetsync.callbacks  # noqa: E402
import hetsync.testing  # noqa: E402
from common import EvalLogger, shard, task  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sync", default="allreduce", help=f"one of {hetsync.available_modes()}")
    p.add_argument("--sync-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a sync mode option, e.g. node_size=2 (repeatable; values parsed as JSON when possible)")
    p.add_argument("--task", default="digits", choices=["digits", "hyperplane"])
    p.add_argument("--steps", type=int, default=200, help="training steps per worker")
    p.add_argument("--steps-per-rank", default="", help="comma list overriding --steps per rank (uneven workers)")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--slowdown", default="none", choices=["none", "deterministic", "random", "random-one", "imbalance"])
    p.add_argument("--delay-range", default="0.05,0.4", help="lo,hi seconds, for --slowdown imbalance")
    p.add_argument("--slow-ranks", default="0", help="comma list, for --slowdown deterministic")
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--factors", default="", help="comma list, one slowdown factor per rank (deterministic)")
    p.add_argument("--hidden", type=int, default=64, help="digits: hidden units of the MLP (its gradient size)")
    p.add_argument("--base-time", type=float, default=None, help="normal iteration time in s (default: measured)")
    p.add_argument("--compute-time", type=float, default=0.0, help="emulated compute sleep per step, s")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--scenario", default="fixed", choices=["fixed", "changing"],
                   help="changing: homogeneous for the first --phase-steps steps, the last rank --factor x slower "
                        "for the next --phase-steps, random 6x slowdowns with p = 1/n for the rest (needs "
                        "--base-time)")
    p.add_argument("--phase-steps", type=int, default=0, help="--scenario changing: steps of the first two phases "
                                                               "(default: a third of --steps)")
    p.add_argument("--report-dir", default="", help="write hetsync.callbacks.HeterogeneityReportCallback records there")
    p.add_argument("--log-dir", default="")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def sync_options(pairs):
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def changing_scenario(args, rank, size, steps):
    """bench_switch.py's scenario, in hetsync's step count: ``--phase-steps`` (default a third of the steps) of
    homogeneous, as many with one persistent straggler, random slowdowns for the rest."""
    if args.base_time is None:
        raise SystemExit("--scenario changing needs --base-time (the normal iteration time)")
    straggler = hetsync.testing.SlowdownCallback("deterministic", ranks=[size - 1], factor=args.factor,
                                         base_time=args.base_time, rank=rank, size=size)
    random = hetsync.testing.SlowdownCallback("random", factor=6.0, base_time=args.base_time, seed=args.seed, rank=rank,
                                      size=size)
    phase = args.phase_steps or max(steps // 3, 1)
    return hetsync.testing.PhasedSlowdownCallback([(phase, None), (phase, straggler), (max(steps - 2 * phase, 1), random)])


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    hetsync.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed)
    (x_train, y_train, x_test, y_test), build, loss, metrics = task(args.task, args.seed, args.hidden)
    steps = args.steps
    if args.steps_per_rank:
        steps = [int(s) for s in args.steps_per_rank.split(",")][rank]

    model = build()
    opt = hetsync.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr), sync=args.sync,
                                       **sync_options(args.sync_option))
    model.compile(optimizer=opt, loss=loss, metrics=metrics)

    hvd.allreduce(tf.constant(0.0), name="start_barrier")  # common t0 for all ranks
    t0 = time.time()
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    log_path = os.path.join(args.log_dir, f"rank{rank}.csv") if args.log_dir else ""
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if args.compute_time:
        callbacks.append(hetsync.testing.EmulatedComputeCallback(args.compute_time))
    if args.slowdown != "none":
        slow = [int(r) for r in args.slow_ranks.split(",") if r]
        lo, hi = (float(v) for v in args.delay_range.split(","))
        factors = [float(f) for f in args.factors.split(",")] if args.factors else None
        callbacks.append(hetsync.testing.SlowdownCallback(args.slowdown, ranks=slow, factor=args.factor,
                                                  delay_range=(lo, hi), base_time=args.base_time, seed=args.seed,
                                                  factors=factors))
    if args.scenario == "changing":
        callbacks.append(changing_scenario(args, rank, size, steps))
    if args.report_dir:
        callbacks.append(hetsync.callbacks.HeterogeneityReportCallback(args.report_dir, every_s=0.5))
        if args.scenario == "changing" and rank == 0:  # for `hetsync report` to hatch them
            from hetsync.report import write_phases

            phase = args.phase_steps or max(steps // 3, 1)
            write_phases(args.report_dir, [(phase, 2 * phase, f"rank {size - 1} {args.factor:g}x slower"),
                                           (2 * phase, steps, "random 6x slowdowns")])
    evaluator = EvalLogger(x_test, y_test, loss, args.eval_every, t0, log_path, rank,
                           print_every=max(steps // 4, 1) if rank == 0 else 0, total=steps)
    callbacks += [evaluator, hetsync.callbacks.ConsensusCallback(every=None)]

    hetsync.keras.fit(model, shard(x_train, y_train, rank, size, args.batch_size, args.seed), steps_per_epoch=steps, epochs=1,
              callbacks=callbacks, verbose=0)
    train_time = evaluator.last_step_time or (time.time() - t0)  # this worker's own steps, not the final wait
    result = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    summary = {"rank": rank, "size": size, "sync": args.sync, "steps": steps, "train_time_s": train_time,
               "steps_per_s": steps / train_time, "consensus_loss": result["loss"],
               "consensus_accuracy": result.get("accuracy"), "algorithm": hetsync.metrics(model),
               "samples": int(model.optimizer.iterations.numpy()) * args.batch_size,
               # this worker's own optimizer steps: under a job budget a fast worker takes more than `steps`
               "iterations": int(model.optimizer.iterations.numpy()),
               "iterations_per_s": int(model.optimizer.iterations.numpy()) / train_time}
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    summary["weights_checksum"] = float(np.sum(weights * np.arange(1, weights.size + 1) % 7))
    if args.log_dir:
        with open(os.path.join(args.log_dir, f"summary{rank}.json"), "w") as f:
            json.dump(summary, f)
    print(f"rank {rank}: {args.sync} steps={steps} time={train_time:.2f}s consensus loss={result['loss']:.4f} "
          f"accuracy={result.get('accuracy', float('nan')):.3f}", flush=True)
    hetsync.shutdown()


if __name__ == "__main__":
    main()
