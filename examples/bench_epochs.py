"""Real epochs: Horovod's Keras example shape, every mode against Horovod in the same run (issue: job epochs).

Each job is ``examples/horovod_keras_mnist.py`` -- the structure of Horovod's ``tensorflow2_keras_mnist.py``:
``steps_per_epoch = STEPS // size``, several epochs, Adam scaled by size, Horovod's broadcast / metric-average /
LR-warm-up callbacks, a model built lazily -- with one line changed.  One worker is ``--factor`` times slower: every
worker sleeps ``--compute`` seconds per train step (emulated GPU compute, so 8 workers fit on 2 cores; the real CNN
still runs in the step) and the slow one ``factor - 1`` times that more.

Per mode: rank 0's fit time (its own clock, from fit's first callback to its last), the ratio to Horovod's
(``allreduce``, the same script and flags), the consensus model's test accuracy and its difference to Horovod's,
and each rank's train steps (fast ranks take more in the modes whose epochs are the job's).  Writes
``results.json`` and ``results.md`` under ``--out`` and prints progress as it goes.

    python examples/bench_epochs.py --workers 4,8 --out results/epochs
"""
import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from common import Progress, run_streamed  # noqa: E402
SCRIPT = os.path.join(HERE, "horovod_keras_mnist.py")
LOOP_SCRIPT = os.path.join(HERE, "horovod_tf2_mnist.py")  # --loop: Horovod's TF2 custom loop
MODES = ["allreduce", "balanced", "ripples-smart", "ripples-random", "ripples-static", "eager-solo", "eager-majority",
         "hop", "esync", "od-sgd", "auto"]
# Each mode with the options its own benchmark found best for one deterministic straggler (README per mode).
OPTIONS = {"hop": {"max_ig": 12, "backup_workers": 1, "skip": 10, "skip_trigger": 2}}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_mpi_yield_when_idle": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def parse_run(run):
    """A run is a mode name, optionally followed by its options as JSON: ``od-sgd{"warmup_steps": 40}``; then
    ``>MODE@N`` (rank 0 asks for a live switch to MODE after Keras step N) or ``+syncmode`` (a SyncModeCallback callback
    that never switches: its cost alone).  Returns (mode, options, extra flags for the script)."""
    extra = []
    if run.endswith("+syncmode"):
        run, extra = run[:-len("+syncmode")], ["--sync-mode-callback"]
    if ">" in run:
        run, target = run.split(">", 1)
        to, at = target.rsplit("@", 1)
        extra = ["--switch-to", to, "--switch-at", at]
    at = run.find("{")
    if at < 0:
        return run, OPTIONS.get(run, {}), extra
    return run[:at], json.loads(run[at:]), extra


def launch(workers, run, args, out_dir):
    """One job, printing rank 0's output lines as they come; returns (exit code, wall seconds, the tail of its
    output)."""
    mode, options, extra = parse_run(run)
    common = ["--sync", mode, "--sync-options", json.dumps(options), "--compute", str(args.compute),
              "--summary-dir", out_dir, "--seed", str(args.seed), *extra]
    if args.speeds:  # rank r runs at speeds[r % len]: its slowdown factor is the fastest speed over its own
        speeds = [float(v) for v in args.speeds.split(":")]
        common += ["--factors", ",".join(f"{max(speeds) / speeds[r % len(speeds)]:.4f}" for r in range(workers))]
    else:
        common += ["--slow-rank", str(workers - 1), "--factor", str(args.factor)]
    if args.stop_at_loss is not None:
        common += ["--stop-at-loss", str(args.stop_at_loss)]
    if args.lr is not None:
        common += ["--lr", str(args.lr)]
    if args.data != "shard":
        common += ["--data", args.data]
    if args.loop:  # the same job's steps over the whole loop: STEPS x EPOCHS, each rank STEPS x EPOCHS // size
        script = [LOOP_SCRIPT, "--steps", str(args.steps * args.epochs)]
    else:
        script = [SCRIPT, "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps // workers),
                  "--base-time", str(args.compute)]
    cmd = ["mpirun", "-np", str(workers), "--oversubscribe", "--bind-to", "none", "--tag-output", sys.executable,
           *script, *common]
    env = dict(os.environ, **MPI_ENV)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    began = time.monotonic()
    proc = run_streamed(cmd, cwd=ROOT, env=env, timeout=args.job_timeout)
    with open(os.path.join(out_dir, "output.txt"), "w") as f:
        f.write(proc.stdout)
    return proc.returncode, time.monotonic() - began, proc.stdout[-3000:]


def summarize(workers, mode, out_dir):
    runs = [json.load(open(os.path.join(out_dir, f"summary{r}.json"))) for r in range(workers)]
    if "loop_s" in runs[0]:  # the custom loop: its time on rank 0, and each rank's trained batches
        return {"workers": workers, "mode": mode, "fit_s": runs[0]["loop_s"], "accuracy": runs[0]["accuracy"],
                "loss": runs[0]["loss"], "train_steps": [s["trained"] for s in runs], "switches": []}
    return {"workers": workers, "mode": mode, "fit_s": runs[0]["fit_time_s"], "accuracy": runs[0]["accuracy"],
            "loss": runs[0]["loss"], "train_steps": [s["iterations"] for s in runs],
            "switches": runs[0]["switches"], "first_batch_s": max(s["first_batch_s"] for s in runs),
            "target_s": runs[0]["target_reached_s"], "target_epoch": runs[0]["target_epoch"],
            "shares": runs[0].get("algorithm", {}).get("shares")}


def table(rows):
    if any(r.get("target_s") is not None or r.get("target_epoch") for r in rows):
        return target_table(rows)
    lines = ["| workers | mode | fit time (s) | vs Horovod | test accuracy | vs Horovod (points) | train steps per rank |",
             "|---|---|---|---|---|---|---|"]
    base = {r["workers"]: r for r in rows if r["mode"] == "allreduce"}
    for r in rows:
        b = base.get(r["workers"])
        ratio = f"{b['fit_s'] / r['fit_s']:.2f}x" if b else "-"
        delta = f"{100 * (r['accuracy'] - b['accuracy']):+.1f}" if b else "-"
        lines.append(f"| {r['workers']} | {r['mode']} | {r['fit_s']:.1f} | {ratio} | {r['accuracy']:.3f} | {delta} | "
                     f"{', '.join(map(str, r['train_steps']))} |")
    return "\n".join(lines)


def target_table(rows):
    """--stop-at-loss: time to the target (rank 0's clock, from fit's start, at the epoch end that reached it)."""
    lines = ["| workers | run | first batch (s) | time to target (s) | vs Horovod | epochs | test accuracy | "
             "vs Horovod (points) | switches |", "|---|---|---|---|---|---|---|---|---|"]
    base = {r["workers"]: r for r in rows if r["mode"] == "allreduce" and r.get("target_s")}
    for r in rows:
        b = base.get(r["workers"])
        t = r.get("target_s")
        ratio = f"{b['target_s'] / t:.2f}x" if b and t else "-"
        switches = ", ".join(f"{a}->{c} at {p}" for a, c, p in r["switches"]) or "-"
        delta = f"{100 * (r['accuracy'] - b['accuracy']):+.1f}" if b else "-"
        lines.append(f"| {r['workers']} | {r['mode']} | {r['first_batch_s']:.1f} | "
                     f"{'not reached' if t is None else f'{t:.1f}'} | {ratio} | "
                     f"{'-' if r['target_epoch'] is None else r['target_epoch'] + 1} | {r['accuracy']:.3f} | {delta} | "
                     f"{switches} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="4", help="comma list")
    p.add_argument("--modes", default=";".join(MODES),
                   help='";" list of runs: a mode, or a mode with its options as JSON (od-sgd{"warmup_steps": 40})')
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps", type=int, default=160, help="the job's steps per epoch: each rank gets STEPS // size")
    p.add_argument("--compute", type=float, default=0.05, help="emulated compute seconds per train step")
    p.add_argument("--factor", type=float, default=5.0, help="the last rank is this many times slower")
    p.add_argument("--speeds", default=None,
                   help="relative worker speeds, e.g. 1:2:3:5 (rank r gets speeds[r %% len]); else --factor")
    p.add_argument("--data", choices=("shard", "full"), default="shard",
                   help="shard: rank r trains on x[r::size]; full: each rank on all of it, its own shuffle (as "
                        "Horovod's own Keras example)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--loop", action="store_true", help="Horovod's TF2 custom loop (examples/horovod_tf2_mnist.py)")
    p.add_argument("--stop-at-loss", type=float, default=None,
                   help="time to target: every job stops at the first epoch end with validation loss <= this")
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate per worker (default: the script's)")
    p.add_argument("--out", default="results/epochs")
    args = p.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(";")
    cases = [(n, m) for n in workers for m in modes]
    rows = []
    # before a job has ended: ~20 s of start-up and every step at the slowed worker's pace (Horovod's case)
    estimate = sum(20 + args.epochs * (args.steps // n) * args.compute * (args.factor if not args.speeds else 1)
                   for n, _ in cases) / len(cases)
    progress = Progress(len(cases), estimate_s=estimate)
    for n, mode in cases:
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in mode)
        out_dir = os.path.join(args.out, f"{n}w-{slug}")
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        progress.begin(f"{n} workers {mode}")
        code, wall, tail = launch(n, mode, args, out_dir)
        if code != 0:
            progress.end(f"{n} workers {mode}: FAILED (exit {code}) after {wall:.0f} s\n{tail}")
            continue
        row = summarize(n, mode, out_dir)
        rows.append(row)
        reached = ""
        if args.stop_at_loss is not None:
            reached = ", target not reached" if row["target_s"] is None else f", target at {row['target_s']:.1f} s"
        progress.end(f"{n} workers {mode}: fit {row['fit_s']:.1f} s, accuracy {row['accuracy']:.3f}, "
                     f"first batch {row['first_batch_s']:.1f} s{reached}, train steps {row['train_steps']}"
                     f"{'' if row.get('shares') is None else ', shares ' + str(row['shares'])}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    text = table(rows)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
