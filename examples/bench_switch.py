"""Benchmark of live switching: every fixed mode and sync="auto" on a changing scenario, in one run.

8 workers (default) train the digits MLP for --steps steps each, with --base-time s of emulated compute per step
(EmulatedComputeCallback: 8 workers fit on 2 cores) and examples/train.py's ``--scenario changing``: homogeneous for the
first --phase-steps (300) steps, the last worker --factor (5) x slower for the next 300, random 6x slowdowns with
p = 1/n on every worker for the rest (900 of the 1500 steps: a long last phase, so that every mode has the steps to
reach a tight target and "not reached" does not just mean "out of steps").  For each run it reports:

* time to the target loss (the mean of the workers' local-model test losses, as benchmark.py measures it), from
  the end of the start-up (bench_eager.warm);
* per phase, the job's training throughput: samples per second summed over the workers, from each worker's
  heterogeneity-report records (hetsync.callbacks.HeterogeneityReportCallback, every 0.5 s) whose step is in the phase (a
  worker's first record, which holds the job's start-up and first tracing, is left out; the tracing of a mode a
  switch enters for the first time stays in: auto pays it);
* for auto, its switches (step, target, the policy's evidence) and ``hetsync report``'s PNG of its run
  (``<out>/auto/hetsync_report.png``).

Part ``stationary``: each phase's scenario alone for the whole run (homogeneous; the last worker 5x slower; random 6x
slowdowns), time to target of each fixed mode of ``--stationary-modes`` and of auto.

Goal (issue 10): on each phase auto within 5% of the best fixed mode -- read here as the time to target on that
phase's scenario alone (throughput alone would crown a mode that processes samples fast and converges slowly) --
and on the changing run a shorter time to target than every fixed mode.  Writes results.json and results.md under
--out; prints a line per run with an ETA.
"""
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_eager import Progress, chosen_parts, first_time, parser, train, warm, write_results  # noqa: E402
from benchmark import mean_curve  # noqa: E402

FIXED = ("allreduce", "esync", "eager-solo", "hop", "ripples-smart")
PHASES = ("homogeneous", "straggler", "random")


def phase_throughput(report_dir, steps, batch, phase):
    """Samples/s of the job in each phase (sum over workers of iterations / seconds of their records there)."""
    bounds = [(0, phase), (phase, 2 * phase), (2 * phase, steps + 1)]
    out = [0.0, 0.0, 0.0]
    for path in glob.glob(os.path.join(report_dir, "hetsync", "rank*.jsonl")):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        rates = [r for r in records if r["kind"] == "rate" and r["steps"] > 0][1:]  # the first: start-up, tracing
        for k, (lo, hi) in enumerate(bounds):
            inside = [r for r in rates if lo < r["position"] <= hi]
            seconds = sum(r["interval_s"] for r in inside)
            if seconds > 0:
                out[k] += sum(r["iterations"] for r in inside) * batch / seconds
    return out


def phase_of(args, scenario):
    """The first two phases' length in steps (a stationary run: a third of its steps, for the same table)."""
    return args.phase_steps if scenario == "changing" else max(args.steps // 3, 1)


STATIONARY = {"homogeneous": [], "straggler": ["--slowdown", "deterministic", "--slow-ranks", "{last}"],
              "random": ["--slowdown", "random", "--factor", "6"]}


def run(args, label, mode, extra, progress, scenario="changing"):
    log_dir = os.path.join(args.out, label)
    report_dir = os.path.join(log_dir, "report")
    slowdown = ["--compute-time", str(args.base_time), "--base-time", str(args.base_time), "--factor",
                str(args.factor), "--report-dir", report_dir]
    if scenario == "changing":
        slowdown += ["--scenario", "changing", "--phase-steps", str(args.phase_steps)]
    else:
        slowdown += [a.format(last=args.workers - 1) for a in STATIONARY[scenario]]
    summaries, curves = train(args, mode, "digits", log_dir, slowdown + extra, progress)
    loss = mean_curve(curves, 1)  # rows: time, loss, accuracy, step
    start = warm(curves, args)
    reached = first_time(loss, lambda v: v <= args.target_loss)
    r = {"time_to_target": None if reached is None else reached - start,
         "phase_samples_per_s": phase_throughput(report_dir, args.steps, 32, phase_of(args, scenario)),
         "final_loss": summaries[0]["consensus_loss"], "wall_s": max(s["train_time_s"] for s in summaries)}
    if mode == "auto":
        from hetsync.report import load, summarize, write_report

        _, _, switches = summarize(load(report_dir))
        r["switches"] = [(s["position"], s["to"], s["reason"]) for s in switches]
        r["report_png"], _ = write_report(report_dir, log_dir)
    t = "not reached" if r["time_to_target"] is None else f"{r['time_to_target']:.1f} s"
    phases = ", ".join(f"{p} {v:.0f}" for p, v in zip(PHASES, r["phase_samples_per_s"]))
    progress.step(f"{label}: time to loss {args.target_loss}: {t}; samples/s by phase: {phases}")
    return r


def stationary(args, modes, auto_opts, progress):
    """Each phase's scenario alone, for ``--stationary-steps``: time to target of every mode and of auto."""
    import argparse

    args = argparse.Namespace(**{**vars(args), "steps": args.stationary_steps})
    out = {}
    for scenario in PHASES:
        out[scenario] = {m: run(args, f"{scenario}-{m}", m, auto_opts if m == "auto" else [], progress, scenario)
                         for m in modes + ["auto"]}
    return out


def stationary_markdown(results, args):
    lines = ["", f"Each phase alone ({args.stationary_steps} steps): time to loss {args.target_loss}", "",
             "| scenario | " + " | ".join(results[PHASES[0]]) + " | auto / best fixed |",
             "|---|" + "---|" * (len(results[PHASES[0]]) + 1)]
    for scenario, runs in results.items():
        times = {m: r["time_to_target"] for m, r in runs.items()}
        fixed = {m: t for m, t in times.items() if m != "auto" and t is not None}
        best = min(fixed, key=fixed.get) if fixed else None
        ratio = (f"{times['auto'] / fixed[best]:.2f}x of {best}" if best and times["auto"] is not None
                 else "n/a")
        cells = " | ".join("not reached" if t is None else f"{t:.1f} s" for t in times.values())
        lines.append(f"| {scenario} | {cells} | {ratio} |")
    return "\n".join(lines)


def markdown(results, args):
    fixed = {k: v for k, v in results.items() if k != "auto"}
    auto = results["auto"]
    lines = [f"{args.workers} workers, {args.steps} steps, {args.base_time * 1e3:.0f} ms compute per step; "
             f"{args.phase_steps} steps homogeneous, {args.phase_steps} with worker {args.workers - 1} "
             f"{args.factor:g}x slower, then random 6x slowdowns (p = 1/{args.workers}).", "",
             "| mode | time to loss " + f"{args.target_loss} | " + " | ".join(f"{p} samples/s" for p in PHASES)
             + " | final loss |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        t = "not reached" if r["time_to_target"] is None else f"{r['time_to_target']:.1f} s"
        lines.append(f"| {name} | {t} | " + " | ".join(f"{v:.0f}" for v in r["phase_samples_per_s"])
                     + f" | {r['final_loss']:.3f} |")
    lines += ["", "auto against the best fixed mode of each phase (throughput):", ""]
    for k, p in enumerate(PHASES):
        best = max(fixed, key=lambda m: fixed[m]["phase_samples_per_s"][k])
        ratio = auto["phase_samples_per_s"][k] / max(fixed[best]["phase_samples_per_s"][k], 1e-9)
        lines.append(f"- {p}: best fixed {best}; auto at {ratio:.2f}x of it (goal >= 0.95)")
    times = {m: r["time_to_target"] for m, r in fixed.items() if r["time_to_target"] is not None}
    if times and auto["time_to_target"] is not None:
        best = min(times, key=times.get)
        lines.append(f"- whole run: auto {auto['time_to_target']:.1f} s to target, best fixed {best} "
                     f"{times[best]:.1f} s ({'better' if auto['time_to_target'] < times[best] else 'not better'})")
    lines += ["", "auto's switches (step, mode, evidence):", ""]
    lines += [f"- step {pos}: {to} ({why})" for pos, to, why in auto.get("switches", [])]
    return "\n".join(lines)


def main(argv=None):
    # long enough that the step count does not decide who reaches the target: 1500 steps (300, 300, then random for
    # 900), 600 alone
    p = parser(__doc__, ("changing", "stationary"), 1500, "results/switch")
    p.add_argument("--phase-steps", type=int, default=300, help="steps of the homogeneous and straggler phases")
    p.add_argument("--stationary-steps", type=int, default=600, help="steps of each stationary run")
    p.add_argument("--stationary-modes", default="allreduce,esync,eager-solo",
                   help="the fixed modes of the stationary part (each phase's scenario alone)")
    p.add_argument("--base-time", type=float, default=0.03, help="emulated compute per step, s")
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--target-loss", type=float, default=0.2)
    p.add_argument("--modes", default=",".join(FIXED), help="the fixed modes to compare auto with")
    p.add_argument("--auto-option", action="append", default=[], metavar="KEY=VALUE",
                   help='more sync="auto" options (JSON values), e.g. candidates=\'{"straggler": "eager-solo"}\'')
    args = p.parse_args(argv)
    args.lr = {"digits": args.lr}
    os.makedirs(args.out, exist_ok=True)
    parts = chosen_parts(p, args, ("changing", "stationary"))
    modes = [m for m in args.modes.split(",") if m]
    still = [m for m in args.stationary_modes.split(",") if m]
    runs = (len(modes) + 1 if "changing" in parts else 0) + (3 * (len(still) + 1) if "stationary" in parts else 0)
    progress = Progress(runs)
    auto_opts = ["--sync-option", "window=3.0", "--sync-option", "min_interval=3.0", "--sync-option", "settle=1.0"]
    for pair in args.auto_option:
        auto_opts += ["--sync-option", pair]
    results, text = {}, ""
    if "changing" in parts:
        changing = {m: run(args, m, m, [], progress) for m in modes}
        changing["auto"] = run(args, "auto", "auto", auto_opts, progress)
        results["changing"] = changing
        text += markdown(changing, args)
    if "stationary" in parts:
        results["stationary"] = stationary(args, still, auto_opts, progress)
        text += stationary_markdown(results["stationary"], args)
    write_results(args, results, text)
    print(text)


if __name__ == "__main__":
    main()
