"""eager-SGD's three benchmarks, each a ratio against a baseline measured in the same run (README, "eager-SGD").

    python examples/bench_eager.py                      # all three, 8 processes, ~10 minutes on 2 cores
    python examples/bench_eager.py --parts micro        # one of micro, hyperplane, imbalance

1. micro (§6.1, Fig 8/9): tests/mpi/bench_partial.py -- mean latency of solo, majority and MPI_Allreduce with the
   processes linearly skewed before each call; mean number of active processes (NAP).
2. hyperplane (§6.2.1): y = a.x + noise, one dense layer (dimension 256: the paper's task scaled to 2 cores), each
   step ONE random process is delayed by 1x, 1.5x, 2x the base step (SlowdownCallback "random-one"; the paper's
   200/300/400 ms against its step).  eager-solo vs allreduce: throughput (steps/s per worker) and the final loss
   of the averaged model.
3. imbalance (§6.2.3): every process sleeps a delay from a range, the assignment shifted by one rank each step
   (SlowdownCallback "imbalance"; the paper's 50-400 ms scaled to 10-80 ms over a 20 ms base step), on digits.
   eager-majority vs allreduce: time until the mean over workers of their local models' test accuracy reaches the
   target, and the final accuracy of the averaged model.
Every step of every worker also sleeps a fixed emulated compute time (a GPU's step, which 2 cores do not have); the
real forward/backward still runs.  Time to target counts from each job's first evaluation, at fit's
on_train_begin (the same instant for every mode); throughput from the evaluation after step ``--eval-every`` (steady
state: the one-time start-up, e.g. Horovod's first negotiations, is left out).  Writes ``--out``/results.md, results.json and eager.png; prints a line per run.
"""
import argparse
import csv
import glob
import json
import os
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchmark import mean_curve  # noqa: E402  (rows here: time, loss, accuracy, step)
from cluster_hosts import launcher  # noqa: E402
from common import Progress, curve_style, log_axis, run_streamed  # noqa: E402,F401  (Progress: for bench_*.py)
PARTS = ("micro", "hyperplane", "imbalance")
DELAYS = (1.0, 1.5, 2.0)  # hyperplane: delay of the one slowed process, in base steps
GOALS = {"micro": {"solo": 20.0, "majority": 2.0}, "hyperplane": {1.0: 1.6, 1.5: 1.9, 2.0: 2.2},
         "imbalance": 1.35}


def _env():
    return dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(cmd, timeout):
    """Runs one job, printing rank 0's output lines as they come (common.run_streamed); returns rank 0's output
    lines (and the launcher's own), reassembled."""
    proc = run_streamed(cmd, cwd=ROOT, env=_env(), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    return "\n".join(text for rank, text in proc.lines if rank in (0, None))


def parser(doc, parts, steps, out):
    """The arguments every part-based benchmark takes (this one and bench_hop.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(parts))
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--out", default=out)
    p.add_argument("--hosts", default=None, help="run the jobs across the emulated cluster's hosts, e.g. h1:2,h2:2 "
                   "(scripts/cluster.sh up first; examples/bench_cluster.py does it)")
    p.add_argument("--from-logs", action="store_true", help="rebuild the tables and the plot from --out's logs")
    return p


def chosen_parts(p, args, parts):
    """The parts asked for (p.error on an unknown one); creates --out."""
    chosen = [x for x in args.parts.split(",") if x]
    bad = [x for x in chosen if x not in parts]
    if bad:
        p.error(f"unknown parts {bad}; valid: {', '.join(parts)}")
    os.makedirs(args.out, exist_ok=True)
    return chosen


def write_results(args, results, text):
    """results.json (the arguments and every number) and results.md (the tables) under --out."""
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), **results}, f, indent=1, default=str)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")


def micro(args, progress):
    results = []
    for skew in (float(v) for v in args.skew_ms.split(",")):
        cmd = ["mpirun", "-np", str(args.workers), "--oversubscribe", "--bind-to", "none", "--tag-output",
               sys.executable, os.path.join(ROOT, "tests", "mpi", "bench_partial.py"), "--skew-ms", str(skew),
               "--reps", str(args.micro_reps)]
        progress.begin(f"micro, skew {skew} ms/rank")
        out = _run(cmd, args.job_timeout)
        result = json.loads(re.search(r"RESULT (\{.*\})", out).group(1))
        progress.step(f"micro, skew {skew} ms/rank: solo {result['solo']['speedup_vs_mpi']:.1f}x, majority "
                      f"{result['majority']['speedup_vs_mpi']:.2f}x lower latency than MPI_Allreduce")
        results.append(result)
    return results


def train(args, mode, task, log_dir, slowdown, progress=None):
    """One job of examples/train.py: horovodrun here, or across the emulated hosts ``args.hosts`` (cluster_hosts.py;
    ``progress``: its [i/N] line first, named by the log folder);
    returns its per-rank summaries and curves."""
    if not args.from_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    cmd = launcher(args.workers, args.hosts, _env()) + [sys.executable,
           os.path.join(HERE, "train.py"), "--sync", mode, "--task", task, "--steps", str(args.steps),
           "--lr", str(args.lr[task]), "--eval-every", str(args.eval_every), "--log-dir", log_dir,
           "--seed", str(args.seed), *slowdown]
    if not args.from_logs:
        if progress is not None:
            progress.begin(f"{os.path.basename(log_dir)} ({mode})")
        _run(cmd, args.job_timeout)
    summaries = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(log_dir, "summary*.json")))]
    curves = {}
    for path in glob.glob(os.path.join(log_dir, "rank*.csv")):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        curves[int(rows[0]["rank"])] = [(float(r["time_s"]), float(r["loss"]), float(r["accuracy"] or "nan"),
                                         int(r["step"])) for r in rows]
    return summaries, curves


def first_time(curve, reached):
    return next((t for t, v in curve if reached(v)), None)


def warm(curves, args):
    """Mean wall time of the workers' first evaluation, at fit's on_train_begin: where time to target counts from,
    the same instant for every mode.  (It counted from the evaluation after Keras step ``eval_every`` before, which
    flattered ESync: ten ESync rounds hold several times the training of ten allreduce steps.)"""
    times = [rows[0][0] for rows in curves.values()]
    return sum(times) / len(times)


def throughput(curves, args):
    """Steps per second per worker in the steady state (from step eval_every to the last step), mean over workers."""
    rates = []
    for rows in curves.values():
        first = next(row for row in rows if row[3] >= args.eval_every)
        last = rows[-1]
        rates.append((last[3] - first[3]) / (last[0] - first[0]))
    return sum(rates) / len(rates)


def hyperplane(args, progress):
    rows, curves = [], {}
    for delay in DELAYS:
        runs = {}
        for mode in ("allreduce", "eager-solo"):
            slow = ["--compute-time", str(args.base_time), "--base-time", str(args.base_time), "--slowdown",
                    "random-one", "--factor", str(1.0 + delay)]
            summaries, c = train(args, mode, "hyperplane", os.path.join(args.out, f"hyperplane-{delay}-{mode}"), slow,
                                 progress)
            runs[mode] = dict(steps_per_s=throughput(c, args), loss=summaries[0]["consensus_loss"],
                              metrics=summaries[0].get("algorithm", {}))
            curves[(delay, mode)] = mean_curve(c, 1)
            progress.step(f"hyperplane delay {delay}x {mode}: {runs[mode]['steps_per_s']:.2f} steps/s, "
                          f"final loss {runs[mode]['loss']:.4f}")
        ar, eager = runs["allreduce"], runs["eager-solo"]
        rows.append(dict(delay=delay, allreduce=ar, eager=eager, speedup=eager["steps_per_s"] / ar["steps_per_s"],
                         loss_diff=(eager["loss"] - ar["loss"]) / ar["loss"]))
    return rows, curves


def imbalance(args, progress):
    runs, curves = {}, {}
    for mode in ("allreduce", "eager-majority"):
        slow = ["--compute-time", str(args.imb_base_time), "--slowdown", "imbalance", "--delay-range",
                args.delay_range]
        summaries, c = train(args, mode, "digits", os.path.join(args.out, f"imbalance-{mode}"), slow, progress)
        acc = mean_curve(c, 2)
        curves[mode] = acc
        start = warm(c, args)
        reached = first_time(acc, lambda v: v >= args.target_accuracy)
        runs[mode] = dict(steps_per_s=throughput(c, args), accuracy=summaries[0]["consensus_accuracy"],
                          time_to_target=None if reached is None else reached - start,
                          metrics=summaries[0].get("algorithm", {}))
        progress.step(f"imbalance {mode}: {runs[mode]['steps_per_s']:.2f} steps/s, time to accuracy "
                      f"{args.target_accuracy}: {_secs(runs[mode]['time_to_target'])}, final {runs[mode]['accuracy']:.3f}")
    ar, maj = runs["allreduce"], runs["eager-majority"]
    ratio = ar["time_to_target"] / maj["time_to_target"] if ar["time_to_target"] and maj["time_to_target"] else None
    return dict(runs=runs, speedup=ratio, accuracy_diff_points=100 * (maj["accuracy"] - ar["accuracy"])), curves


def _secs(t):
    return "not reached" if t is None else f"{t:.1f} s"


def markdown(results, args):
    lines = [f"eager-SGD benchmarks, {args.workers} processes ({time.strftime('%Y-%m-%d')}, "
             f"`python examples/bench_eager.py`)", ""]
    if "micro" in results:
        lines += ["**micro** (float32, rank r sleeps r x skew before each call; mean over ranks and repetitions)", "",
                  "| skew per rank | MPI_Allreduce | solo | majority | solo NAP (active) | majority NAP (active) |",
                  "|---|---|---|---|---|---|"]
        for m in results["micro"]:
            solo, maj = m["solo"], m["majority"]
            lines.append(f"| {m['skew_ms']} ms | {m['mpi_allreduce']['mean_latency_ms']:.2f} ms | "
                         f"{solo['mean_latency_ms']:.2f} ms (**{solo['speedup_vs_mpi']:.1f}x** lower; goal "
                         f">= {GOALS['micro']['solo']}x) | {maj['mean_latency_ms']:.2f} ms "
                         f"(**{maj['speedup_vs_mpi']:.2f}x**; goal >= {GOALS['micro']['majority']}x) | "
                         f"{solo['mean_active']:.2f} | {maj['mean_active']:.2f} |")
        lines.append("")
    if "hyperplane" in results:
        lines += [f"**hyperplane** (dim 256, base step {args.base_time * 1000:.0f} ms, {args.steps} steps, one "
                  "random process delayed per step)", "",
                  "| delay | allreduce steps/s | eager-solo steps/s | speedup | goal | final loss allreduce | "
                  "eager-solo | diff |", "|---|---|---|---|---|---|---|---|"]
        for r in results["hyperplane"]:
            lines.append(f"| {r['delay']}x | {r['allreduce']['steps_per_s']:.2f} | {r['eager']['steps_per_s']:.2f} | "
                         f"{r['speedup']:.2f}x | >= {GOALS['hyperplane'][r['delay']]}x | "
                         f"{r['allreduce']['loss']:.4f} | {r['eager']['loss']:.4f} | {100 * r['loss_diff']:+.1f}% |")
        lines.append("")
    if "imbalance" in results:
        r = results["imbalance"]
        ar, maj = r["runs"]["allreduce"], r["runs"]["eager-majority"]
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "target not reached"
        lines += [f"**imbalance** (digits, delays {args.delay_range} s shifted per step, base step "
                  f"{args.imb_base_time * 1000:.0f} ms, {args.steps} steps, target accuracy {args.target_accuracy})",
                  "", "| | steps/s | time to target | final accuracy |", "|---|---|---|---|",
                  f"| allreduce | {ar['steps_per_s']:.2f} | {_secs(ar['time_to_target'])} | {ar['accuracy']:.3f} |",
                  f"| eager-majority | {maj['steps_per_s']:.2f} | {_secs(maj['time_to_target'])} | "
                  f"{maj['accuracy']:.3f} |",
                  "", f"time to target: {speed} (goal >= {GOALS['imbalance']}x); final accuracy "
                  f"{r['accuracy_diff_points']:+.1f} points (goal within 0.5)", ""]
    return "\n".join(lines)


def plot_parts(curves, parts, path, ylabel, yscale="linear", width=5.0, style=None):
    """One panel per part (bench_hop.py, bench_esync_od.py): each run's curve of ``ylabel`` over wall time after the
    warm-up (from 0: the start-up is left out, as in the tables).  ``style(i, label)``: the line's keywords (default
    common.curve_style: colour, dashes and marker of its own)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in parts if p in curves]
    fig, axes = plt.subplots(1, len(parts), figsize=(width * len(parts), 3.8), squeeze=False)
    for ax, part in zip(axes[0], parts):
        for i, (label, curve) in enumerate(curves[part].items()):
            if curve:
                ax.plot(*zip(*curve), label=label, **(style(i, label) if style else curve_style(i)))
        ax.set(title=f"{part}: {ylabel}", xlabel="wall time after warm-up (s)", ylabel=ylabel.split()[-1],
               yscale=yscale)
        ax.set_xlim(left=0)
        if yscale == "log":
            log_axis(ax)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, ((delay, mode), curve) in enumerate(sorted(curves.get("hyperplane", {}).items())):
        if curve:
            axes[0].plot(*zip(*curve), label=f"{mode}, delay {delay}x",
                         **curve_style(i, linestyle="-" if mode == "eager-solo" else "--"))
    axes[0].set(title="hyperplane: mean worker test loss", xlabel="wall time (s)", ylabel="MSE", yscale="log")
    for i, (mode, curve) in enumerate(curves.get("imbalance", {}).items()):
        if curve:
            axes[1].plot(*zip(*curve), label=mode, **curve_style(i))
    axes[1].set(title="imbalance (digits): mean worker test accuracy", xlabel="wall time (s)", ylabel="accuracy")
    for ax in axes:
        ax.set_xlim(left=0)
        if ax.lines:
            ax.legend(fontsize=7)
    if axes[0].lines:
        log_axis(axes[0])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = parser(__doc__, PARTS, 150, "results/eager")
    p.add_argument("--skew-ms", default="2,10,20", help="comma list: one micro run per skew (ms per rank)")
    p.add_argument("--micro-reps", type=int, default=60)
    p.add_argument("--base-time", type=float, default=0.04, help="hyperplane: emulated compute per step, s")
    p.add_argument("--imb-base-time", type=float, default=0.02, help="imbalance: emulated compute per step, s")
    p.add_argument("--delay-range", default="0.01,0.08")
    p.add_argument("--target-accuracy", type=float, default=0.9)
    args = p.parse_args(argv)
    args.lr = {"hyperplane": 0.05, "digits": 0.2}
    parts = chosen_parts(p, args, PARTS)
    total = (len(args.skew_ms.split(",")) * ("micro" in parts) + 2 * len(DELAYS) * ("hyperplane" in parts)
             + 2 * ("imbalance" in parts))
    progress = Progress(total)
    results, curves = {}, {}
    if "micro" in parts and not args.from_logs:
        results["micro"] = micro(args, progress)
    if "hyperplane" in parts:
        results["hyperplane"], curves["hyperplane"] = hyperplane(args, progress)
    if "imbalance" in parts:
        results["imbalance"], curves["imbalance"] = imbalance(args, progress)
    text = markdown(results, args)
    write_results(args, results, text)
    plot(curves, os.path.join(args.out, "eager.png"))
    print(text)


if __name__ == "__main__":
    main()
