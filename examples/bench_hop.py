"""Hop's three benchmarks (Hop §7.3), each as ratios against runs measured in the same invocation (README, "Hop").

    python examples/bench_hop.py                          # all three, 8 processes, ~12 minutes on 2 cores
    python examples/bench_hop.py --parts random           # one of random, deterministic, topology

1. random (§7.3.1, §7.3.3, §7.3.4): ring-based graph; each worker is 6x slower with probability 1/n at each
   iteration (SlowdownCallback "random").  Horovod allreduce vs hop standard vs backup_workers=1 vs staleness=5 with the
   paper's Reduce (§4.4: only the updates received in the iteration, stale_reduce="received") and with ours
   (stale_reduce="newest": every neighbour's newest satisfactory update), every hop run with max_ig=8 (with the default 4 the token bound, not the staleness bound s + 1 = 6, limits how far a
   worker runs ahead: measured 1.71x instead of the ratio below).
2. deterministic (§7.3.5): ring-based; worker 7 is 4x slower at every step.  allreduce vs hop standard vs skip=2
   and skip=10 (both with backup_workers=1: with neither backup workers nor staleness no worker ever falls more
   than one iteration behind an out-neighbour, Theorem 1, so there is nothing to skip; max_ig=12 for every hop
   run so a jump of 10 fits under the token bound; skip_trigger=2).
3. topology (§7.3.6, Fig 20/21): 8 workers on 3 emulated machines of 4, 2 and 2 (node_size=[4, 2, 2], Fig 21);
   ring-based (Fig 21 (a)) vs node-allreduce-ring with one worker per machine carrying both links (Fig 21 (b),
   node_links="gateway"), with different workers per link (Fig 21 (c), "distinct") and with a link per worker
   ("all", ours); the random protocol of 1.  Reports each graph's spectral gap under the paper's W (0.6667,
   0.2682, 0.2688 for (a)-(c)).  (One host cannot emulate the slow links between machines that make the
   paper's per-machine graphs faster; README says so.)
Digits MLP, SGD, 32 examples per worker and step; every step also sleeps an emulated compute time (a GPU's step,
which 2 cores do not have).  Time to target: from each job's evaluation after step ``--eval-every`` (the start-up
left out) until the mean over workers of their local models' test loss reaches ``--target-loss``.  Writes
``--out``/results.md, results.json and hop.png; prints one line per run with an ETA.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_eager import (Progress, chosen_parts, first_time, parser, plot_parts, throughput, train,  # noqa: E402
                         warm, write_results)
from benchmark import mean_curve  # noqa: E402

PARTS = ("random", "deterministic", "topology")
GOALS = {"random": 1.8, "deterministic": 2.2, "deterministic_vs_allreduce": 2.0}
RANDOM_RUNS = [("allreduce", "allreduce", []), ("standard", "hop", ["max_ig=8"]),
               ("backup_workers=1", "hop", ["max_ig=8", "backup_workers=1"]),
               ("staleness=5", "hop", ["max_ig=8", "staleness=5"]),
               ("staleness=5 newest", "hop", ["max_ig=8", "staleness=5", "stale_reduce=newest"])]
DET_RUNS = [("allreduce", "allreduce", []), ("standard", "hop", ["max_ig=12"]),
            ("skip=2", "hop", ["max_ig=12", "backup_workers=1", "skip=2", "skip_trigger=2"]),
            ("skip=10", "hop", ["max_ig=12", "backup_workers=1", "skip=10", "skip_trigger=2"])]
MACHINES = "[4,2,2]"
LINKS = {"node-allreduce-ring (b) gateway": "gateway", "node-allreduce-ring (c) distinct": "distinct",
         "node-allreduce-ring all links": "all"}
TOPO_RUNS = [("ring-based", "hop", ["topology=ring-based"])] + [
    (label, "hop", ["topology=node-allreduce-ring", f"node_size={MACHINES}", f"node_links={links}"])
    for label, links in LINKS.items()]


def slowdown(part, args):
    common = ["--compute-time", str(args.base_time), "--base-time", str(args.base_time)]
    if part == "deterministic":
        return common + ["--slowdown", "deterministic", "--slow-ranks", str(args.workers - 1), "--factor", "4"]
    return common + ["--slowdown", "random", "--factor", "6"]


def run_part(part, runs, args, progress):
    results, curves = {}, {}
    for label, mode, options in runs:
        extra = slowdown(part, args)
        for opt in options:
            extra += ["--sync-option", opt]
        tag = label.replace(" ", "_").replace("(", "").replace(")", "").replace("=", "")
        summaries, c = train(args, mode, "digits", os.path.join(args.out, f"{part}-{tag}"), extra, progress)
        loss = mean_curve(c, 1)
        start = warm(c, args)
        reached = first_time(loss, lambda v: v <= args.target_loss)
        metrics = [s.get("algorithm", {}) for s in summaries]
        results[label] = dict(steps_per_s=throughput(c, args), loss=summaries[0]["consensus_loss"],
                              time_to_target=None if reached is None else reached - start,
                              skips=[m.get("skips", 0) for m in metrics],
                              mean_updates=[round(m.get("mean_updates", 0), 2) for m in metrics])
        curves[label] = [(t - start, v) for t, v in loss]
        r = results[label]
        progress.step(f"{part} {label}: {r['steps_per_s']:.2f} steps/s, time to loss {args.target_loss}: "
                      f"{_secs(r['time_to_target'])}, final {r['loss']:.3f}")
    return results, curves


def gaps():
    from hetsync.algorithms import hop_topology as topo

    machines = json.loads(MACHINES)
    out = {"ring-based": topo.spectral_gap(topo.build("ring-based", sum(machines)))}
    for label, links in LINKS.items():
        out[label] = topo.spectral_gap(topo.build("node-allreduce-ring", sum(machines), machines, links))
    return out


def _secs(t):
    return "not reached" if t is None else f"{t:.1f} s"


def ratio(base, other):
    b, o = base["time_to_target"], other["time_to_target"]
    return b / o if b and o else None


def _x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def table(part, results, reference, args, spectral=None):
    lines = ["| run | steps/s per worker | time to target | vs " + reference + " | vs allreduce | final loss |"
             + (" spectral gap |" if spectral else ""),
             "|---|---|---|---|---|---|" + ("---|" if spectral else "")]
    for label, r in results.items():
        vs_ref = ratio(results[reference], r) if reference in results else None
        vs_ar = ratio(results["allreduce"], r) if "allreduce" in results else None
        lines.append(f"| {label} | {r['steps_per_s']:.2f} | {_secs(r['time_to_target'])} | {_x(vs_ref)} | "
                     f"{_x(vs_ar)} | {r['loss']:.3f} |" + (f" {spectral[label]:.4f} |" if spectral else ""))
    return lines


def markdown(results, args):
    lines = [f"Hop benchmarks, {args.workers} processes ({time.strftime('%Y-%m-%d')}, `python examples/bench_hop.py`; "
             f"digits, {args.steps} steps per worker, {args.base_time * 1000:.0f} ms emulated compute, lr {args.lr_}, "
             f"target mean local test loss {args.target_loss})", ""]
    if "random" in results:
        lines += ["**random slowdown** (each worker 6x slower with p = 1/n per step; ring-based)", ""]
        lines += table("random", results["random"], "standard", args)
        best = max((ratio(results["random"]["standard"], results["random"][k]) or 0)
                   for k in ("backup_workers=1", "staleness=5", "staleness=5 newest"))
        lines += ["", f"better of backup/staleness vs standard: {best:.2f}x (goal >= {GOALS['random']}x)", ""]
    if "deterministic" in results:
        lines += [f"**deterministic slowdown** (worker {args.workers - 1} 4x slower; ring-based)", ""]
        lines += table("deterministic", results["deterministic"], "standard", args)
        lines += ["", f"skips of the slow worker: skip=2 {results['deterministic']['skip=2']['skips'][-1]}, "
                  f"skip=10 {results['deterministic']['skip=10']['skips'][-1]} (goal: >= "
                  f"{GOALS['deterministic']}x vs standard, >= {GOALS['deterministic_vs_allreduce']}x vs allreduce)",
                  ""]
    if "topology" in results:
        lines += [f"**topologies** (8 workers on machines {MACHINES}; random slowdown)", ""]
        lines += table("topology", results["topology"], "ring-based", args, gaps())
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    p = parser(__doc__, PARTS, 200, "results/hop")
    p.add_argument("--base-time", type=float, default=0.04, help="emulated compute per step, s")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--target-loss", type=float, default=0.5)
    args = p.parse_args(argv)
    args.lr_ = args.lr
    args.lr = {"digits": args.lr}
    parts = chosen_parts(p, args, PARTS)
    plan = {"random": RANDOM_RUNS, "deterministic": DET_RUNS, "topology": TOPO_RUNS}
    progress = Progress(sum(len(plan[x]) for x in parts))
    results, curves = {}, {}
    for part in parts:
        results[part], curves[part] = run_part(part, plan[part], args, progress)
    text = markdown(results, args)
    write_results(args, results, text)
    plot_parts(curves, PARTS, os.path.join(args.out, "hop.png"), "mean worker test loss", yscale="log")
    print(text)


if __name__ == "__main__":
    main()
