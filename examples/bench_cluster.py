"""Benchmarks across hosts: the emulated cluster of scripts/cluster.sh (network namespaces with their own host
names, tbf-limited links, cgroup CPU quotas; root), each part a ratio against plain Horovod or MPI in the same run
(README "Across hosts").  `make bench-cluster` runs every part (~40 minutes on 2 cores).

    python examples/bench_cluster.py                    # every part
    python examples/bench_cluster.py --parts micro,od   # some of micro, modes, od, hop, ripples

1. micro: P-Reduce (tests/mpi/bench_preduce.py, 10 MB) and eager-SGD's solo/majority partial allreduce
   (tests/mpi/bench_partial.py, 16 KB, 2 ms linear skew) against MPI_Allreduce of the same size and ranks, over
   TCP between 2 hosts x 2 ranks on 1 Gbit/s links.
2. modes: every mode against Horovod's allreduce, 2 hosts x 2 ranks, host h2 CPU-throttled by its cgroup to
   --slow-cpu of one core for its two ranks (default 0.33: h1's two ranks share the other 1.67 cores, 5x the CPU
   per rank; real slowness, no sleep): time to a target mean test loss on digits.
3. od: OD-SGD's overlap (§3) on 2 hosts x 2 ranks with a --od-rate link, the wide MLP of bench_esync_od.py.
   Calibration: an od-sgd run without emulated compute measures the transfer T_com, an allreduce run T_sync =
   T_real + T_com; every measured run then emulates E = T_com - T_real of compute, so T_cop = E + T_real ~ T_com
   (the issue's setting).  allreduce vs od-sgd: throughput and time to a target accuracy; od-sgd again with Open
   MPI's libnbc choosing its own MPI_Iallreduce algorithm (hetsync's engine sets the ring at its start: docs/engine.md, "MPI settings").
4. hop: Fig 21, 8 workers on machines of 4, 2 and 2 (hosts h1:4,h2:2,h3:2, machines from the real placement),
   inter-machine links of --hop-rate, random 6x slowdowns: ring-based vs node-allreduce-ring with one link per
   machine pair ("gateway", Fig 21 (b)), distinct links ("distinct", (c)) and all links ("all").
5. ripples: ripples-smart with and without Inter-Intra synchronization (§5.2) on 2 hosts x 2 ranks with a
   --ripples-rate link, worker 3 2x slower; allreduce for reference.
Parts 4 and 5 train an MLP with --net-hidden units (gradients big enough for the link to matter).
Writes --out/results.md (the README's tables), results.json and each job's logs; prints [i/N] with an ETA.
"""
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_eager import (_run, chosen_parts, first_time, parser, throughput, train, warm,  # noqa: E402
                         write_results)
from bench_esync_od import rate_after  # noqa: E402
from benchmark import mean_curve  # noqa: E402
from cluster_hosts import Cluster, launcher  # noqa: E402
from common import Progress  # noqa: E402

PARTS = ("micro", "modes", "od", "hop", "ripples")
MODES = ["allreduce", "balanced", "ripples-static", "ripples-random", "ripples-smart", "eager-solo",
         "eager-majority", "hop", "esync", "od-sgd", "auto"]
HOP_RUNS = [("ring-based", ["topology=ring-based"])] + [
    (f"node-allreduce-ring {links}", ["topology=node-allreduce-ring", f"node_links={links}"])
    for links in ("gateway", "distinct", "all")]
RING = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"  # 1 = ring (hetsync's default), 0 = libnbc chooses
JOBS = {"micro": 2, "modes": len(MODES), "od": 5, "hop": len(HOP_RUNS) + 1, "ripples": 3}


def _secs(t):
    return "not reached" if t is None else f"{t:.1f} s"


def _ratio(base, other):
    if base is None or other is None:
        return "n/a"
    return f"{base / other:.2f}x"


def measure(args, label, mode, log, extra, progress, column=1, target=None, reached=None, after=None):
    """One train.py job across ``args.hosts``: steady-state steps/s, time to target, final consensus value."""
    summaries, curves = train(args, mode, "digits", os.path.join(args.out, log), extra, progress)
    start = warm(curves, args)
    curve = mean_curve(curves, column)
    hit = first_time(curve, reached) if reached else None
    rate = throughput(curves, args) if after is None else rate_after(curves, after)
    metrics = [s.get("algorithm", {}) for s in summaries]
    r = dict(steps_per_s=rate, time_to_target=None if hit is None else hit - start,
             loss=summaries[0]["consensus_loss"], accuracy=summaries[0].get("consensus_accuracy"),
             wall_s=max(s["train_time_s"] for s in summaries), metrics=metrics)
    progress.end(f"{label}: {rate:.2f} steps/s, to target {_secs(r['time_to_target'])}, final loss "
                 f"{r['loss']:.3f}")
    return r


def _first_error(text):
    """The first error line a failed job printed (its exception), for the table."""
    found = [line for line in (raw.split(">:", 1)[-1].strip() for raw in text.splitlines()[1:])  # 1st: the command
             if re.match(r"^[\w.]+(Error|Timeout|Exception): \S", line)]
    ours = [line for line in found if "hetsync" in line]  # hetsync's own error says more than TF's wrapper
    return (ours or found or ["the job failed (see its log)"])[0][:160]


# -- parts ----------------------------------------------------------------------------------------------------------
def micro(args, progress):
    args.hosts, args.workers = "h1:2,h2:2", 4
    out = {}
    with Cluster(2, rate="1gbit"):
        env = dict(os.environ)
        for name, script, extra in (("preduce", "bench_preduce.py", ["--mb", "10"]),
                                    ("partial", "bench_partial.py", ["--kb", "16", "--skew-ms", "2"])):
            progress.begin(f"micro {name}, 2 hosts x 2 ranks, 1 Gbit/s")
            cmd = launcher(4, args.hosts, env) + [sys.executable, os.path.join(ROOT, "tests", "mpi", script),
                                                  *extra]
            text = _run(cmd, args.job_timeout)
            out[name] = json.loads(re.search(r"RESULT (\{.*\})", text).group(1))
            progress.end(f"micro {name}")
    return out


def modes(args, progress):
    args.hosts, args.workers = "h1:2,h2:2", 4
    results = {}
    with Cluster(2, rate="1gbit", cpu=[f"h2={args.slow_cpu}"]):
        for mode in args.modes.split(","):
            try:
                results[mode] = measure(args, mode, mode, f"modes-{mode}", [], progress,
                                        reached=lambda v: v <= args.target_loss)
            except RuntimeError as exc:  # a mode that fails here is a result too: the table says so, the rest run
                results[mode] = dict(failed=_first_error(str(exc)))
                progress.end(f"{mode}: FAILED ({results[mode]['failed']})")
    return results


def od(args, progress):
    args.hosts, args.workers = "h1:2,h2:2", 4
    epoch = 1437 // (args.workers * args.od_batch)  # steps in one pass over a worker's shard (common.digits)
    shape = ["--hidden", str(args.od_hidden), "--batch-size", str(args.od_batch), "--lr", str(args.od_lr)]
    warm_opt = ["--sync-option", f"warmup_steps={epoch}"]
    after = epoch + args.eval_every
    acc = dict(column=2, reached=lambda v: v >= args.target_accuracy)
    with Cluster(2, rate=args.od_rate):
        sync0 = measure(args, "calibration: allreduce, no emulated compute", "allreduce", "od-cal-sync", shape,
                        progress, **acc)
        od0 = measure(args, "calibration: od-sgd, no emulated compute", "od-sgd", "od-cal-od", shape + warm_opt,
                      progress, after=after, **acc)
        t_sync = 1.0 / sync0["steps_per_s"]
        t_com = sum(m["mean_transfer_s"] for m in od0["metrics"]) / len(od0["metrics"])
        t_real = max(t_sync - t_com, 0.0)
        emulated = max(t_com - t_real, 0.0)
        compute = ["--compute-time", f"{emulated:.4f}"] + shape
        results = {"calibration": dict(t_sync_s=t_sync, t_com_s=t_com, t_real_s=t_real, emulated_s=emulated,
                                       epoch_steps=epoch)}
        results["allreduce"] = measure(args, "allreduce", "allreduce", "od-allreduce", compute, progress,
                                       after=after, **acc)
        results["od-sgd"] = measure(args, "od-sgd", "od-sgd", "od-od-sgd", compute + warm_opt, progress,
                                    after=after, **acc)
        # hetsync's engine sets libnbc's ring for its MPI_Iallreduce (docs/engine.md, "MPI settings"); again with
        # libnbc's own choice (0), to show what that default is worth
        os.environ[RING] = "0"
        try:
            results["od-sgd, libnbc's own iallreduce"] = measure(
                args, "od-sgd, libnbc's own iallreduce", "od-sgd", "od-od-sgd-libnbc", compute + warm_opt, progress,
                after=after, **acc)
        finally:
            os.environ.pop(RING, None)
    return results


def hop(args, progress):
    args.hosts, args.workers = "h1:4,h2:2,h3:2", 8
    slow = ["--compute-time", str(args.base_time), "--base-time", str(args.base_time), "--slowdown", "random",
            "--factor", "6", "--hidden", str(args.net_hidden)]
    results = {}
    with Cluster(3, rate=args.hop_rate):
        results["allreduce"] = measure(args, "hop: allreduce", "allreduce", "hop-allreduce", slow, progress,
                                       reached=lambda v: v <= args.target_loss)
        for label, options in HOP_RUNS:
            extra = list(slow)
            for o in options:
                extra += ["--sync-option", o]
            results[label] = measure(args, f"hop: {label}", "hop", "hop-" + label.replace(" ", "_"), extra,
                                     progress, reached=lambda v: v <= args.target_loss)
    return results


def ripples(args, progress):
    args.hosts, args.workers = "h1:2,h2:2", 4
    slow = ["--compute-time", str(args.base_time), "--base-time", str(args.base_time), "--slowdown",
            "deterministic", "--slow-ranks", "3", "--factor", "2", "--hidden", str(args.net_hidden)]
    runs = [("allreduce", "allreduce", []), ("ripples-smart, Inter-Intra", "ripples-smart", ["inter_intra=true"]),
            ("ripples-smart, no Inter-Intra", "ripples-smart", ["inter_intra=false"])]
    results = {}
    with Cluster(2, rate=args.ripples_rate):
        for label, mode, options in runs:
            extra = list(slow)
            for o in options:
                extra += ["--sync-option", o]
            results[label] = measure(args, f"ripples: {label}", mode, "ripples-" + label.replace(" ", "_")
                                     .replace(",", ""), extra, progress, reached=lambda v: v <= args.target_loss)
    return results


# -- tables ---------------------------------------------------------------------------------------------------------
def _table(results, base, what="loss"):
    lines = [f"| run | steps/s per worker | time to target {what} | vs allreduce | final {what} |",
             "|---|---|---|---|---|"]
    for label, r in results.items():
        if label == "calibration":
            continue
        if "failed" in r:
            lines.append(f"| {label} | failed: {r['failed']} | | | |")
            continue
        final = r["loss"] if what == "loss" else r["accuracy"]
        lines.append(f"| {label} | {r['steps_per_s']:.2f} | {_secs(r['time_to_target'])} | "
                     f"{_ratio(results[base].get('time_to_target'), r['time_to_target'])} | {final:.3f} |")
    return lines


def markdown(results, args):
    day = time.strftime("%Y-%m-%d")
    lines = [f"Across hosts ({day}, `python examples/bench_cluster.py`, scripts/cluster.sh; ratios from one run)", ""]
    if "micro" in results:
        p, q = results["micro"]["preduce"], results["micro"]["partial"]
        lines += ["**P-Reduce and partial allreduce vs MPI_Allreduce**, 2 hosts x 2 ranks, 1 Gbit/s links", "",
                  "| collective | size | ours | MPI_Allreduce | ratio (ours / MPI) |", "|---|---|---|---|---|"]
        for label in ("alone", "horovod"):
            r = p[label]
            when = "" if label == "alone" else ", Horovod running"
            lines.append(f"| P-Reduce{when} | 10 MB | {r['preduce_ms']:.0f} ms | {r['mpi_ms']:.0f} ms | "
                         f"{r['preduce_ms'] / r['mpi_ms']:.2f} |")
            lines.append(f"| P-Reduce fp16{when} | 10 MB | {r['fp16_ms']:.0f} ms | {r['mpi_ms']:.0f} ms | "
                         f"{r['fp16_ms'] / r['mpi_ms']:.2f} |")
        mpi = q["mpi_allreduce"]["mean_latency_ms"]
        for kind in ("solo", "majority"):
            r = q[kind]
            lines.append(f"| {kind} allreduce, 2 ms skew (mean latency) | 16 KB | {r['mean_latency_ms']:.2f} ms | "
                         f"{mpi:.2f} ms | {r['mean_latency_ms'] / mpi:.2f} |")
        lines.append("")
    if "modes" in results:
        lines += [f"**Every mode vs Horovod**, 2 hosts x 2 ranks, 1 Gbit/s, host h2's two ranks limited to "
                  f"{args.slow_cpu} of a core (cgroup), digits, {args.steps} steps, lr {args.lr_}, target mean "
                  f"test loss {args.target_loss}", ""]
        lines += _table(results["modes"], "allreduce") + [""]
    if "od" in results:
        c = results["od"]["calibration"]
        lines += [f"**OD-SGD**, 2 hosts x 2 ranks, {args.od_rate} links, MLP hidden {args.od_hidden}, batch "
                  f"{args.od_batch}; T_com {c['t_com_s'] * 1e3:.0f} ms, T_real {c['t_real_s'] * 1e3:.0f} ms, "
                  f"emulated compute {c['emulated_s'] * 1e3:.0f} ms (T_cop ~ T_com)", ""]
        lines += _table(results["od"], "allreduce", "accuracy")
        base = results["od"]["allreduce"]["steps_per_s"]
        gains = ", ".join(f"{label} {(r['steps_per_s'] / base - 1) * 100:+.0f}%" for label, r in results["od"].items()
                          if label.startswith("od-sgd"))
        lines += ["", f"throughput vs allreduce: {gains} (goal >= +30%)", ""]
    if "hop" in results:
        lines += [f"**Hop, Fig 21**: 8 workers on hosts of 4, 2, 2 ranks, {args.hop_rate} links, MLP hidden "
                  f"{args.net_hidden}, random 6x slowdowns, {args.base_time * 1e3:.0f} ms emulated compute, target loss {args.target_loss}", ""]
        lines += _table(results["hop"], "allreduce") + [""]
    if "ripples" in results:
        lines += [f"**Ripples Inter-Intra**, 2 hosts x 2 ranks, {args.ripples_rate} links, MLP hidden "
                  f"{args.net_hidden}, worker 3 2x slower, {args.base_time * 1e3:.0f} ms emulated compute, target "
                  f"loss {args.target_loss}", ""]
        lines += _table(results["ripples"], "allreduce") + [""]
    return "\n".join(lines)


def main(argv=None):
    p = parser(__doc__, PARTS, 120, "results/cluster")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--target-loss", type=float, default=0.6)
    p.add_argument("--target-accuracy", type=float, default=0.85)
    p.add_argument("--base-time", type=float, default=0.03, help="hop, ripples: emulated compute per step, s")
    p.add_argument("--modes", default=",".join(MODES), help="modes: which (allreduce first: the reference)")
    p.add_argument("--slow-cpu", type=float, default=0.33,
                   help="modes: CPU of host h2 (cores, for its 2 ranks; 0.33: h1's get the other 1.67, 5x per rank)")
    p.add_argument("--od-rate", default="100mbit")
    p.add_argument("--od-hidden", type=int, default=4096)
    p.add_argument("--od-batch", type=int, default=16)
    p.add_argument("--od-lr", type=float, default=0.05)
    p.add_argument("--net-hidden", type=int, default=1024, help="hop, ripples: hidden units of the MLP (300 KB of "
                   "gradients at 1024: 24 ms on a 100 Mbit/s link)")
    p.add_argument("--hop-rate", default="100mbit")
    p.add_argument("--ripples-rate", default="100mbit")
    args = p.parse_args(argv)
    args.lr_, args.lr = args.lr, {"digits": args.lr}
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")  # several ranks per core: one TF thread pool each
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    parts = chosen_parts(p, args, PARTS)
    JOBS["modes"] = len(args.modes.split(","))
    progress = Progress(sum(JOBS[x] for x in parts), estimate_s=90)
    runners = {"micro": micro, "modes": modes, "od": od, "hop": hop, "ripples": ripples}
    results = {}
    for part in parts:
        results[part] = runners[part](args, progress)
        write_results(args, results, markdown(results, args))  # what is done so far survives a later failure
    print(markdown(results, args))


if __name__ == "__main__":
    main()
