"""Side-by-side benchmark of sync modes under the papers' heterogeneity protocols, all from one run.

For each scenario (workers, slowdown) and each mode it launches ``horovodrun --mpi -np N examples/train.py`` on the
same seeds and data, then reports, per mode: time to the target loss, each worker's own iterations/s, the consensus model's
final loss/accuracy, and method metrics.  Writes ``results.csv``, ``results.md`` and ``loss_vs_time.png``.

Time to target: every worker evaluates its *local* model on the fixed test set every ``eval_every`` steps; at any
wall time the job's loss is the mean over workers of their latest evaluation, and the target is reached the first
time that mean is <= the target.  (For allreduce all local models are equal, so this is just the model's loss.)

GG request latency is rank 0's RPC time without the time the GG held the request waiting for its group (the
pure request cost); the CSV also has the total (waiting included).

Each step sleeps a fixed emulated compute time (``--compute-time``) so 8 workers fit on 2 cores; the real MLP
forward/backward still runs in the step.  A slowed worker sleeps (factor - 1) x that normal time more (Ripples §7.4).
"""
import argparse
import csv
import glob
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from common import Progress, curve_style, log_axis, run_streamed  # noqa: E402

PRESETS = {
    # make demo: 4 workers, one slowed 5x, Horovod vs static and smart Ripples.
    "demo": dict(workers=[4], scenarios=["5x"], modes=["allreduce", "ripples-static", "ripples-smart"], steps=200),
    # make bench: the Ripples §7.4 grid.
    "full": dict(workers=[4, 8], scenarios=["homogeneous", "2x", "5x"],
                 modes=["allreduce", "ripples-static", "ripples-random", "ripples-smart"], steps=200),
}
SCENARIOS = {"homogeneous": None, "2x": 2.0, "5x": 5.0}


def launch(workers, mode, factor, args, log_dir, sync_options):
    """Runs one training job, printing rank 0's output lines as they come; returns its wall time.  Raises with the
    job's output when it fails."""
    os.makedirs(log_dir, exist_ok=True)
    cmd = ["horovodrun", "--mpi", "-np", str(workers), "-H", f"localhost:{workers}",
           sys.executable, os.path.join(HERE, "train.py"), "--sync", mode, "--task", args.task,
           "--steps", str(args.steps), "--compute-time", str(args.compute_time), "--base-time", str(args.compute_time),
           "--eval-every", str(args.eval_every), "--lr", str(args.lr), "--log-dir", log_dir, "--seed", str(args.seed)]
    for option in sync_options:
        cmd += ["--sync-option", option]
    if factor:
        cmd += ["--slowdown", "deterministic", "--slow-ranks", str(workers - 1), "--factor", str(factor)]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    start = time.time()
    proc = run_streamed(cmd, env=env, cwd=ROOT, timeout=args.job_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-8000:]}")
    return time.time() - start


def load_curves(log_dir):
    """{rank: [(time, step, loss, accuracy), ...]} from the per-rank CSV logs."""
    curves = {}
    for path in glob.glob(os.path.join(log_dir, "rank*.csv")):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        curves[int(rows[0]["rank"])] = [(float(r["time_s"]), int(r["step"]), float(r["loss"]),
                                         float(r["accuracy"])) for r in rows]
    return curves


def mean_curve(curves, column):
    """[(t, mean over ranks of their latest value in ``column`` at t)] on the union of evaluation times; rows are
    tuples whose first item is the time."""
    events = sorted((row[0], rank, row[column]) for rank, rows in curves.items() for row in rows)
    latest = {rank: rows[0][column] for rank, rows in curves.items()}
    curve = []
    for t, rank, value in events:
        latest[rank] = value
        curve.append((t, sum(latest.values()) / len(latest)))
    return curve


def mean_loss_curve(curves):
    """[(t, mean over ranks of their latest loss at t)] (rows: time, step, loss, accuracy)."""
    return mean_curve(curves, 2)


def time_to_target(curve, target):
    return next((t for t, loss in curve if loss <= target), None)


def own_rate(summary):
    """A worker's own optimizer steps per second of its training.  Not train.py's ``steps_per_s`` (the job's steps
    per rank over the time to the job's end): every rank ends the job together, a slow one having taken fewer of
    its steps.  Logs from before train.py wrote ``iterations_per_s`` give it as samples / its default batch of 32."""
    if "iterations_per_s" in summary:
        return summary["iterations_per_s"]
    if "samples" in summary:
        return summary["samples"] / 32 / summary["train_time_s"]
    return summary["steps_per_s"]


def summarize(workers, scenario, mode, log_dir, wall, target):
    summaries = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(log_dir, "summary*.json")))]
    curve = mean_loss_curve(load_curves(log_dir))
    rates = [own_rate(s) for s in sorted(summaries, key=lambda s: s["rank"])]
    row = {"workers": workers, "scenario": scenario, "mode": mode,
           "time_to_target_s": time_to_target(curve, target), "job_wall_s": round(wall, 2),
           "iterations_per_s_min": round(min(rates), 2), "iterations_per_s_max": round(max(rates), 2),
           "iterations_per_s": " ".join(f"{r:.1f}" for r in rates),
           "final_loss": round(summaries[0]["consensus_loss"], 4),
           "final_accuracy": summaries[0].get("consensus_accuracy")}
    metrics = summaries[0].get("algorithm") or {}
    row.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    return row, curve


def gg_latency(row):
    if "gg_request_overhead_p50_ms" not in row:
        return ""
    return f"{row['gg_request_overhead_p50_ms']:.2f} / {row['gg_request_overhead_p99_ms']:.2f}"


def write_outputs(rows, curves, out, target):
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    base = {(r["workers"], r["scenario"]): r["time_to_target_s"] for r in rows if r["mode"] == "allreduce"}
    lines = [f"Target loss {target}. Speedup = allreduce's time to target / the mode's (same run).", "",
             "| workers | scenario | mode | time to target (s) | speedup vs allreduce | iterations/s per worker | "
             "final loss | final accuracy | GG conflicts | GG request p50/p99 (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ttt, ref = r["time_to_target_s"], base.get((r["workers"], r["scenario"]))
        speedup = f"{ref / ttt:.2f}x" if ttt and ref else "n/a"
        acc = r["final_accuracy"]
        lines.append(f"| {r['workers']} | {r['scenario']} | {r['mode']} | "
                     f"{'not reached' if ttt is None else f'{ttt:.1f}'} | {speedup} | {r['iterations_per_s']} | "
                     f"{r['final_loss']} | {'' if acc is None else f'{acc:.3f}'} | {r.get('gg_conflicts', '')} | "
                     f"{gg_latency(r)} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table)
    plot(curves, out, target)
    return table


def plot(curves, out, target):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted({key[0] for key in curves})
    modes = sorted({key[2] for key in curves})
    scenarios = [s for s in SCENARIOS if any(key[1] == s for key in curves)]
    fig, axes = plt.subplots(len(workers), len(scenarios), figsize=(5.5 * len(scenarios), 4 * len(workers)),
                             squeeze=False)
    for row, n in enumerate(workers):
        for col, scenario in enumerate(scenarios):
            ax = axes[row][col]
            for (w, sc, mode), curve in sorted(curves.items()):
                if (w, sc) == (n, scenario) and curve:  # a mode's style is the same in every panel
                    ax.plot([t for t, _ in curve], [loss for _, loss in curve], label=mode,
                            **curve_style(modes.index(mode)))
            ax.axhline(target, color="gray", linestyle="--", linewidth=1, label="target")
            slow = "no worker slowed" if SCENARIOS[scenario] is None else f"worker {n - 1} {scenario} slower throughout"
            ax.set(title=f"{n} workers, {scenario} ({slow})", xlabel="wall time (s)", ylabel="mean local test loss",
                   yscale="log")
            ax.set_xlim(left=0)
            log_axis(ax)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss_vs_time.png"), dpi=100)


def job_estimate(args, factor):
    """A first guess of one job's seconds, for the ETA before a job has ended: ~15 s of start-up (processes,
    TensorFlow, Horovod's first negotiations) and every step at the slowed worker's pace (the allreduce case)."""
    return 15 + args.steps * args.compute_time * (factor or 1.0) * 1.2


def run_case(n, scenario, mode, args, progress=None):
    """Runs (or, with --from-logs, re-reads) one job; returns (table row, loss curve) or None if absent."""
    log_dir = os.path.join(args.out, "logs", f"{n}w-{scenario}-{mode}")
    if args.from_logs:
        if not os.path.isdir(log_dir):
            return None
        wall = float("nan")
    else:
        if progress is None:
            print(f"[bench] {n} workers, {scenario}, {mode} ...", flush=True)
        else:
            progress.begin(f"{n} workers, {scenario}, {mode}")
        shutil.rmtree(log_dir, ignore_errors=True)
        options = [] if mode == "allreduce" else args.sync_option
        wall = launch(n, mode, SCENARIOS[scenario], args, log_dir, options)
    row, curve = summarize(n, scenario, mode, log_dir, wall, args.target)
    ttt = row["time_to_target_s"]
    done = (f"{n} workers, {scenario}, {mode}: time to target {'not reached' if ttt is None else f'{ttt:.1f} s'}, "
            f"iterations/s {row['iterations_per_s']}, final loss {row['final_loss']}")
    if progress is None:
        print(f"[bench]   {done}", flush=True)
    else:
        progress.end(done)
    return row, curve


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    p.add_argument("--workers", default="", help="comma list overriding the preset")
    p.add_argument("--scenarios", default="", help=f"comma list of {list(SCENARIOS)}")
    p.add_argument("--modes", default="", help="comma list of sync modes")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--task", default="digits")
    p.add_argument("--target", type=float, default=0.3, help="target test loss")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--compute-time", type=float, default=0.04)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--sync-option", action="append", default=[], help="passed to every non-allreduce mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--out", default="results/bench")
    p.add_argument("--from-logs", action="store_true", help="rebuild the table and plot from --out's logs, no runs")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    workers = [int(w) for w in args.workers.split(",")] if args.workers else preset["workers"]
    scenarios = args.scenarios.split(",") if args.scenarios else preset["scenarios"]
    modes = args.modes.split(",") if args.modes else preset["modes"]
    args.steps = args.steps or preset["steps"]
    os.makedirs(args.out, exist_ok=True)
    rows, curves = [], {}
    jobs = [(n, scenario, mode) for n in workers for scenario in scenarios for mode in modes]
    estimate = sum(job_estimate(args, SCENARIOS[scenario]) for _, scenario, _ in jobs) / len(jobs)
    progress = None if args.from_logs else Progress(len(jobs), estimate_s=estimate)
    for n in workers:
        for scenario in scenarios:
            for mode in modes:
                result = run_case(n, scenario, mode, args, progress)
                if result is not None:
                    rows.append(result[0])
                    curves[(n, scenario, mode)] = result[1]
    table = write_outputs(rows, curves, args.out, args.target)
    print("\n" + table)
    print(f"wrote {args.out}/results.csv, results.md, loss_vs_time.png")


if __name__ == "__main__":
    main()
