"""ESync's and OD-SGD's benchmarks, each as ratios against Horovod allreduce measured in the same invocation
(README, "ESync" and "OD-SGD").

    python examples/bench_esync_od.py                    # both parts, 4 processes, ~12 minutes on 2 cores
    python examples/bench_esync_od.py --parts esync      # one of esync, od-sgd

1. esync: 4 workers with capacities 1:1:1:5 (worker 3 5x slower) and 1:2:3:5 (per-iteration times base x factor),
   each an allreduce run and an esync run of the same number of Keras steps.  Reports samples/s relative to the sum
   of the workers' standalone samples/s (each worker's batch / its mean local-iteration time, measured in the esync
   run: what it would process alone; goal >= 0.9), and the time to a target test accuracy vs allreduce (goal >= 3x
   at 1:1:1:5) with the final accuracies (goal: esync within 0.5 point of allreduce, or better).  The paper's rules
   beside ours: non-blocking with ``on_ready="abort"`` (§4.2) vs ``"finish"``, and without the batch test.
   ``--esync-runs`` and ``--profiles`` pick a subset (labels of ESYNC_RUNS; allreduce is always run).
2. od-sgd: a wide MLP (``--od-hidden`` units: its gradient is ~MBs) whose allreduce takes about as long as its
   compute: a calibration run (allreduce, no emulated compute) measures the step time T, which is then used as the
   emulated compute of every run (T_cop ~ T_com).  Throughput of od-sgd with each local updater vs synchronous SGD
   (allreduce), final accuracies, and warm-up length sensitivity (0, 1, 2, 3 epochs; §4.6).
Digits, SGD, 32 examples per worker and step.  Time to target: from each job's evaluation after step
``--eval-every`` (the start-up left out) until the test accuracy of the (common) model reaches the target.  Writes
``--out``/results.md, results.json and esync_od.png; prints one line per run with an ETA.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_eager import (Progress, chosen_parts, first_time, parser, plot_parts, train, warm,  # noqa: E402
                         write_results)
from benchmark import mean_curve  # noqa: E402
from common import curve_style  # noqa: E402

PARTS = ("esync", "od-sgd")
PROFILES = {"1:1:1:5": "1,1,1,5", "1:2:3:5": "1,2,3,5"}
UPDATERS = ("sgd", "dc-asgd-c", "dc-asgd-a")
_NB = ["--sync-option", "non_blocking=true"]
# (label, mode, options).  "non-blocking" is §4.2 with on_ready="finish" (ours: the iteration in flight when READY
# arrives is kept); "non-blocking abort" is §4.2's rule (it is discarded); "no batch test" leaves out Algorithm 1's
# RUN-BATCH-DATA-TEST (round 0 then starts with capabilities 0).
ESYNC_RUNS = [("allreduce", "allreduce", []), ("esync", "esync", []),
              ("esync no batch test", "esync", ["--sync-option", "batch_data_test=false"]),
              ("esync non-blocking", "esync", _NB + ["--sync-option", "on_ready=finish"]),
              ("esync non-blocking abort", "esync", _NB + ["--sync-option", "on_ready=abort"])]
GOALS = {"samples_ratio": 0.9, "time_to_accuracy": 3.0, "od_gain": 0.30}
TRAIN_DIGITS = 1437  # examples/common.py: 80% of scikit-learn's 1797 digits


def _secs(t):
    return "not reached" if t is None else f"{t:.1f} s"


def _x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def rate_after(curves, step):
    """Steps per second per worker from the first evaluation at or after ``step`` to the last one (mean)."""
    rates = []
    for rows in curves.values():
        first = next(row for row in rows if row[3] >= step)
        rates.append((rows[-1][3] - first[3]) / (rows[-1][0] - first[0]))
    return sum(rates) / len(rates)


def run(args, label, mode, log, extra, progress, after=None):
    summaries, curves = train(args, mode, "digits", os.path.join(args.out, log), extra, progress)
    acc = mean_curve(curves, 2)
    start = warm(curves, args)
    reached = first_time(acc, lambda v: v >= args.target_accuracy)
    metrics = [s.get("algorithm", {}) for s in summaries]
    wall = max(s["train_time_s"] for s in summaries)
    r = dict(steps_per_s=rate_after(curves, max(after or 0, args.eval_every)), accuracy=summaries[0]["consensus_accuracy"],
             time_to_target=None if reached is None else reached - start, wall_s=wall,
             samples=[s.get("samples", 0) for s in summaries], metrics=metrics)
    progress.step(f"{label}: {r['steps_per_s']:.2f} steps/s, time to accuracy {args.target_accuracy}: "
                  f"{_secs(r['time_to_target'])}, final accuracy {r['accuracy']:.3f}")
    return r, [(t - start, v) for t, v in acc]


def esync_style(i, label):
    """esync_od.png's lines: in the esync panel one colour and marker per run, solid for capacities 1:1:1:5 and
    dashed for 1:2:3:5 (the two allreduce curves coincide at first); elsewhere common.curve_style."""
    profile, _, run = label.partition(" ")
    if profile not in PROFILES:
        return curve_style(i)
    k = [r[0] for r in ESYNC_RUNS].index(run) if run in [r[0] for r in ESYNC_RUNS] else i
    return curve_style(k, linestyle="-" if profile == list(PROFILES)[0] else "--")


def esync_runs(args):
    return [r for r in ESYNC_RUNS if r[0] == "allreduce" or r[0] in args.esync_runs]


def esync_part(args, progress):
    results, curves = {}, {}
    for profile in args.profiles:
        slow = ["--compute-time", str(args.base_time), "--base-time", str(args.base_time), "--slowdown",
                "deterministic", "--factors", PROFILES[profile]]
        for label, mode, options in esync_runs(args):
            key = f"{profile} {label}"
            tag = f"esync-{profile.replace(':', '')}-{label.replace(' ', '-')}"
            results[key], curves[key] = run(args, key, mode, tag, slow + options, progress)
        batch = 32
        esync = [results[f"{profile} {label}"] for label, mode, _ in esync_runs(args) if mode == "esync"]
        for es in esync:
            es["standalone_samples_per_s"] = sum(batch / m["mean_iteration_s"] for m in es["metrics"])
            es["local_steps"] = [round(m["mean_local_steps"], 2) for m in es["metrics"]]
        results[f"{profile} allreduce"]["standalone_samples_per_s"] = esync[0]["standalone_samples_per_s"]
        for label, _, _ in esync_runs(args):  # steady state: steps/s x samples per step
            x = results[f"{profile} {label}"]
            x["samples_per_s"] = x["steps_per_s"] * sum(x["samples"]) / args.steps
            x["samples_ratio"] = x["samples_per_s"] / x["standalone_samples_per_s"]
    return results, curves


def od_part(args, progress):
    """Calibration (emulated compute 0, CPU-bound): an allreduce run gives the synchronous step T_sync = T_real +
    T_com, an od-sgd run the engine's transfer time T_com (its data phase); T_real ~ T_com for these MLPs, but on 2
    shared cores compute and transfer fight for the same CPUs, so nothing can overlap there (both runs are reported).
    Every measured run then adds E = T_sync of emulated compute (a GPU as fast as the whole CPU step, during which the
    CPU is free to move the data): T_cop = E + T_real."""
    results, curves = {}, {}
    esync_steps, args.steps = args.steps, args.od_steps
    epoch = TRAIN_DIGITS // (args.workers * args.od_batch)  # steps in one pass over a worker's shard
    shape = ["--hidden", str(args.od_hidden), "--batch-size", str(args.od_batch), "--lr", str(args.od_lr)]
    warm_opt = ["--sync-option", f"warmup_steps={epoch}"]
    sync0, _ = run(args, "calibration: allreduce, no emulated compute", "allreduce", "od-calibration-sync", shape,
                   progress)
    od0, _ = run(args, "calibration: od-sgd, no emulated compute", "od-sgd", "od-calibration-od", shape + warm_opt,
                 progress, 2 * epoch)
    results["CPU-bound: allreduce"], results["CPU-bound: od-sgd sgd"] = sync0, od0
    t_sync = 1.0 / sync0["steps_per_s"]
    t_com = sum(m["mean_transfer_s"] for m in od0["metrics"]) / len(od0["metrics"])
    t_real = max(t_sync - t_com, 0.0)
    emulated = t_sync
    results["calibration"] = dict(step_s=t_sync, t_com_s=t_com, t_real_s=t_real, emulated_s=emulated)
    after = 3 * epoch + args.eval_every  # every run's rate after the longest warm-up: the training stage
    compute = ["--compute-time", f"{emulated:.4f}"] + shape
    plan = [("allreduce", "allreduce", [])]
    plan += [(f"od-sgd {u}", "od-sgd", [f"local_updater={u}", f"warmup_steps={epoch}"]) for u in UPDATERS]
    plan += [(f"od-sgd sgd, warm-up {e} epochs", "od-sgd", ["local_updater=sgd", f"warmup_steps={e * epoch}"])
             for e in (0, 2, 3)]
    for label, mode, options in plan:
        extra = list(compute)
        for o in options:
            extra += ["--sync-option", o]
        tag = "od-" + label.replace(" ", "_").replace(",", "")
        results[label], curves[label] = run(args, label, mode, tag, extra, progress, after)
    results["calibration"]["epoch_steps"] = epoch
    args.steps = esync_steps
    return results, curves


def markdown(results, args):
    lines = [f"ESync / OD-SGD benchmarks, {args.workers} processes ({__import__('time').strftime('%Y-%m-%d')}, "
             f"`python examples/bench_esync_od.py`; digits, {args.steps} steps per worker, lr {args.lr_}, "
             f"target test accuracy {args.target_accuracy})", ""]
    if "esync" in results:
        r = results["esync"]
        lines += [f"**ESync** ({args.base_time * 1000:.0f} ms emulated compute x capacity factor per local iteration)",
                  "", "| capacities | mode | steps/s | time to target | vs allreduce | final accuracy | samples/s | "
                  "vs standalone sum | local steps per round |", "|---|---|---|---|---|---|---|---|---|"]
        for profile in args.profiles:
            ar = r[f"{profile} allreduce"]
            for label in [x[0] for x in esync_runs(args)]:
                x = r[f"{profile} {label}"]
                speed = (ar["time_to_target"] / x["time_to_target"]
                         if ar["time_to_target"] and x["time_to_target"] else None)
                lines.append(f"| {profile} | {label} | {x['steps_per_s']:.2f} | {_secs(x['time_to_target'])} | "
                             f"{_x(speed)} | {x['accuracy']:.3f} | {x['samples_per_s']:.0f} | "
                             f"{x['samples_ratio']:.2f} | {x.get('local_steps', 1)} |")
        lines += ["", f"goals: samples/s >= {GOALS['samples_ratio']} of the standalone sum; time to target >= "
                  f"{GOALS['time_to_accuracy']}x at 1:1:1:5; final accuracy within 0.5 point of allreduce", ""]
    if "od-sgd" in results:
        r = results["od-sgd"]
        base = r["allreduce"]["steps_per_s"]
        c = r["calibration"]
        lines += [f"**OD-SGD** ({args.od_hidden}-unit MLP, {args.od_batch} examples per step; calibration: "
                  f"synchronous step {c['step_s'] * 1000:.1f} ms = T_real {c['t_real_s'] * 1000:.1f} + T_com "
                  f"{c['t_com_s'] * 1000:.1f} ms; the other runs add E = {c['emulated_s'] * 1000:.1f} ms of emulated "
                  f"compute per step, a GPU as fast as the CPU step)", "",
                  "| run | steps/s | throughput gain (eq. 7) | IMP_Rate (eq. 1) | transfer / waited per step | "
                  "time to target | final accuracy |", "|---|---|---|---|---|---|---|"]
        for label, x in r.items():
            if label == "calibration":
                continue
            m = x["metrics"][0]
            hidden = (f"{m['mean_transfer_s'] * 1000:.1f} / {m['mean_exposed_wait_s'] * 1000:.1f} ms"
                      if "mean_transfer_s" in m else "-")
            b = r["CPU-bound: allreduce"]["steps_per_s"] if label.startswith("CPU-bound") else base
            lines.append(f"| {label} | {x['steps_per_s']:.2f} | {x['steps_per_s'] / b - 1:+.0%} | "
                         f"{1 - b / x['steps_per_s']:.0%} | {hidden} | {_secs(x['time_to_target'])} | "
                         f"{x['accuracy']:.3f} |")
        after = 3 * r["calibration"]["epoch_steps"] + args.eval_every
        lines += ["", f"steps/s counted after step {after} (every run is then past its warm-up); goal: >= "
                  f"+{GOALS['od_gain']:.0%} throughput (paper +17.9..+35%, limit +50%) at final accuracy within 0.5 "
                  f"point; warm-up rows: §4.6's sensitivity (1 epoch = {r['calibration']['epoch_steps']} steps = the "
                  "'od-sgd sgd' row)", ""]
    return "\n".join(lines)


def main(argv=None):
    p = parser(__doc__, PARTS, 150, "results/esync_od")
    p.set_defaults(workers=4)
    p.add_argument("--base-time", type=float, default=0.03, help="esync: emulated compute per local iteration, s")
    p.add_argument("--od-hidden", type=int, default=4096, help="od-sgd: hidden units of the wide MLP")
    p.add_argument("--od-batch", type=int, default=16, help="od-sgd: examples per worker and step")
    p.add_argument("--od-lr", type=float, default=0.05, help="od-sgd: learning rate")
    p.add_argument("--od-steps", type=int, default=200, help="od-sgd: steps per worker (> 3 warm-up epochs)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--profiles", nargs="+", choices=list(PROFILES), default=list(PROFILES), help="esync: capacities")
    p.add_argument("--esync-runs", nargs="+", choices=[r[0] for r in ESYNC_RUNS[1:]],
                   default=[r[0] for r in ESYNC_RUNS[1:]], help="esync: the runs beside allreduce")
    p.add_argument("--target-accuracy", type=float, default=0.9)
    args = p.parse_args(argv)
    args.lr_ = args.lr
    args.lr = {"digits": args.lr}
    parts = chosen_parts(p, args, PARTS)
    runs = {"esync": len(esync_runs(args)) * len(args.profiles), "od-sgd": 2 + 1 + len(UPDATERS) + 3}
    progress = Progress(sum(runs[x] for x in parts))
    results, curves = {}, {}
    for part in parts:
        results[part], curves[part] = (esync_part if part == "esync" else od_part)(args, progress)
    text = markdown(results, args)
    write_results(args, results, text)
    plot_parts(curves, PARTS, os.path.join(args.out, "esync_od.png"), "test accuracy", width=6.0, style=esync_style)
    print(text)


if __name__ == "__main__":
    main()
