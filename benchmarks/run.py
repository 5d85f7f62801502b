"""The benchmark: every mode against plain Horovod on real heterogeneity (per-rank CPU quotas), stored raw.

    sudo python benchmarks/run.py                           # the headline scenario, every mode, 3 runs each
    python benchmarks/run.py --scenarios slow-node,homogeneous --modes horovod,allreduce,esync --repeats 3
    python benchmarks/run.py --modes horovod,eager-solo,eager-solo/late=algorithm5   # a mode, and the same mode
                                                                     # with one of its options set
    python benchmarks/run.py --modes horovod --paper-rules   # every option whose default departs from its paper,
                                                             # both ways (docs/paper-fidelity.md)

Each run launches ``horovodrun --mpi -np N benchmarks/in_cgroup.sh python benchmarks/keras_example.py --sync M``:
each rank in its own cgroup whose CPU quota makes it the node the scenario says (benchmarks/quota.py), the real
model, nothing emulated -- except in the sleep-emulated scenarios (``EMULATED``: ``slow-gpu``, ``random-gpu``,
``random-gpu-sgd``, ``random-gpu-long``), which add a GPU's device time as a sleep per sample inside each training
step (a slow GPU's longer, or random slow steps), at equal quotas.  ``2-hosts`` runs across
the emulated hosts of scripts/cluster.sh, each host's cgroup holding its ranks.  ``horovod`` is plain
``hvd.DistributedOptimizer`` with no hetsync import; ``allreduce``
is hetsync's synchronous mode, so its overhead is a row of its own.  The modes of one repeat run one after another
before the next repeat begins, so a drift of the machine spreads over all of them.

One JSON per run goes to ``--out`` (default ``benchmarks/results/<date>/``): the scenario, mode, repeat, commit,
command, machine, quotas (and the quota changes as applied, in seconds after the launch or, for a scenario whose
changes count from the training's start, after that), the HOROVOD_* variables the job ran with (Horovod's
tuning knobs, such as HOROVOD_CYCLE_TIME), the job's wall time (launch to exit, the driver's
clock), when the training started (seconds after the launch, the driver's clock: rank 0's start file appearing),
the probe (the machine's busy, idle and steal CPU seconds over the job, each rank group's throttled
periods and seconds, and the groups' CFS period phases, measured before the repeat's first job: each repeat gets
new groups) and every rank's own record (training time from fit's on_train_begin to on_train_end, fit's return,
train steps and each one's end, its CPU seconds, rank 0's accuracy curve); with ``--thread-cpu``, each rank's CPU
seconds per thread.
benchmarks/tables.py makes the README's tables from them.  Prints [i/N] and an ETA.
"""
import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)

from cluster_hosts import Cluster, launcher  # noqa: E402
from common import Progress, run_streamed  # noqa: E402
from quota import Quotas, Schedule, difference, machine_cpu  # noqa: E402
from stored import load, token_parts  # noqa: E402

from hetsync.algorithms import available_modes, declared_options, departures  # noqa: E402
from hetsync.algorithms.options import check_all  # noqa: E402
from hetsync.optimizer import auto_settings  # noqa: E402

FAST, SLOW = 0.45, 0.09  # of one core: a slow node 5x slower than a fast one
DEVICE_MS = 1.0  # emulated device time per sample (32 ms a step at batch 32), in the sleep-emulated scenarios


def _transient(ranks, seconds=400, every=8.0, lasting=4.0, seed=0):
    """Random transient slowdowns: every ``every`` s one rank drawn at random (seeded) runs at SLOW for ``lasting``
    s, then back at FAST."""
    rng, changes, at = random.Random(seed), [], every
    while at < seconds:
        r = rng.randrange(ranks)
        changes += [(at, r, SLOW), (at + lasting, r, FAST)]
        at += every
    return changes


_RANDOM_GPU = dict(ms=2 * DEVICE_MS, factors=[1, 1, 1, 1], random=[0.25, 4])
_RANDOM_WHAT = (f"random slow steps, emulated: every training step sleeps {2 * DEVICE_MS} ms per sample, 4x that at a "
                "random quarter of each rank's steps (seeded per rank: a shared GPU, variable input lengths; Hop's "
                "random-slowdown protocol)")
SCENARIOS = {
    "slow-node": dict(quotas=[FAST, FAST, FAST, SLOW], what="one slow node: rank 3 has a fifth of the others' CPU"),
    "speeds-1-2-3-5": dict(quotas=[FAST, FAST / 2, FAST / 3, FAST / 5], what="speeds 1 : 1/2 : 1/3 : 1/5"),
    "shared-node": dict(quotas=[FAST] * 4, changes=[(30.0, 3, SLOW), (60.0, 3, FAST)],
                        what="rank 3's node is shared from 30 s to 60 s after launch (a fifth of its CPU)"),
    # the same share change, counted from the training's start (the common-start allreduce), so that it lands
    # mid-run in every mode: from launch, the modes' start-ups (seconds apart) decided how much of it a job met
    "shared-mid-run": dict(quotas=[FAST] * 4, changes=[(8.0, 3, SLOW), (24.0, 3, FAST)], changes_from="start",
                           what="rank 3's node is shared from 8 s to 24 s after training starts (a fifth of its CPU)"),
    "transient": dict(quotas=[FAST] * 4, changes=_transient(4),
                      what="every 8 s a random rank runs at a fifth of its CPU for 4 s"),
    # the same slowdowns, counted from the training's start: from launch, each job's start-up decided which of its
    # steps they hit
    "transient-mid-run": dict(quotas=[FAST] * 4, changes=_transient(4), changes_from="start",
                              what="every 8 s after training starts a random rank runs at a fifth of its CPU for "
                                   "4 s"),
    "homogeneous": dict(quotas=[FAST] * 4, what="four equal ranks"),
    "8-workers": dict(quotas=[FAST / 2] * 7 + [SLOW / 2], what="8 ranks, one 5x slower"),
    # across 2 emulated hosts (scripts/cluster.sh: network namespaces, 1 Gbit/s links), the second throttled: each
    # host's cgroup holds its ranks, so h2's two ranks share 2 x SLOW of a core, h1's 2 x FAST
    "2-hosts": dict(quotas=[FAST, FAST, SLOW, SLOW], hosts={"h1": 2, "h2": 2}, rate="1gbit",
                    what="2 emulated hosts of 2 ranks on 1 Gbit/s links, host h2 with a fifth of h1's CPU"),
    # sleep-emulated: device time of a slow GPU (per sample of the batch), every rank at the same CPU quota
    "slow-gpu": dict(quotas=[FAST] * 4, device=dict(ms=DEVICE_MS, factors=[1, 1, 1, 5]),
                     what=f"one slow GPU, emulated: every training step sleeps {DEVICE_MS} ms per sample (rank 3: "
                          "5x that), equal CPU quotas"),
    "random-gpu": dict(quotas=[FAST] * 4, device=_RANDOM_GPU, what=_RANDOM_WHAT + ", equal CPU quotas"),
    # the same job twice as long, each repeat with its own seed (draws, data split, initial weights), every mode of
    # a repeat with that repeat's: what a switch costs once is spread over more epochs, and the repeats differ in
    # the slow steps they meet, not only in the machine's pace
    "random-gpu-long": dict(quotas=[FAST] * 4, device=_RANDOM_GPU, epochs=6, seed_per_repeat=True,
                            what=_RANDOM_WHAT + ", equal CPU quotas, 6 epochs, each repeat seeded with its number"),
    # the same with plain SGD (momentum 0.9) for Adam: a rule that scales the averaged gradient scales the step
    "random-gpu-sgd": dict(quotas=[FAST] * 4, device=_RANDOM_GPU, args=["--optimizer", "sgd"],
                           what=_RANDOM_WHAT + ", equal CPU quotas, SGD with momentum 0.9 instead of Adam"),
}
EMULATED = [s for s, spec in SCENARIOS.items() if "device" in spec]  # the rest: real heterogeneity, CPU quotas
MODES = ["horovod", "allreduce", "balanced", "ripples-static", "ripples-random", "ripples-smart", "eager-solo",
         "eager-majority", "hop", "esync", "od-sgd", "auto"]  # plain Horovod, then every hetsync mode
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_mpi_yield_when_idle": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cluster(spec):
    """The scenario's emulated hosts (scripts/cluster.sh), each host's cgroup at its ranks' quotas summed."""
    ranks, cpus = iter(spec["quotas"]), []
    for host, k in spec["hosts"].items():
        cpus.append(f"{host}={sum(next(ranks) for _ in range(k)):.4f}")
    return Cluster(len(spec["hosts"]), rate=spec["rate"], cpu=cpus)


def machine():
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version()}


def commit():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout
        return rev.strip() + ("+changes" if dirty.strip() else "")
    except OSError:
        return "unknown"


def variant(token):
    """``MODE`` or ``MODE/KEY=VALUE[/KEY=VALUE...]`` (a mode with options set: a paper's own rule where hetsync's
    default departs from it, or the reverse) -> (mode, options).  A VALUE is read as JSON when it parses
    (``false``, ``3``), else as a string.  The options are checked against the mode's declarations here, so a typo
    is refused before any job starts, with hetsync's own message."""
    mode, pairs = token_parts(token)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} in {token!r}; known: {', '.join(MODES)}")
    if mode == "horovod" and pairs:
        raise ValueError(f"{token!r}: plain Horovod takes no hetsync options")
    options = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"{token!r}: {pair!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    if options and mode == "auto":  # its own settings and its policy's, checked by DistributedOptimizer's rule
        auto_settings(options)
    elif options:
        if mode not in available_modes():
            raise ValueError(f"{token!r}: options are set here for the registered modes only ({mode} has none)")
        check_all(f"{token!r}", declared_options(mode), options)
    return mode, options


def _value(value):
    return value if isinstance(value, str) else json.dumps(value)


def paper_rules():
    """The tokens of every option whose default departs from its paper (``Option.paper_rule``): for each, the mode
    with the options the rule acts under (``acts_with``; none: its defaults) and the same with the paper's rule,
    one after the other, so that benchmarks/tables.py pairs them repeat by repeat."""
    tokens = []
    for mode, name, option in departures():
        base = "/".join([mode] + [f"{k}={_value(v)}" for k, v in option.acts_with.items()])
        tokens += [t for t in (base, f"{base}/{name}={_value(option.paper_rule)}") if t not in tokens]
    return tokens


def settings(mode, options):
    """Every option of ``mode`` as the run used it (its declared defaults with ``options`` over them; {} for plain
    Horovod), stored with the run: a run stays readable after a default changes (benchmarks/stored.py)."""
    if mode not in available_modes():
        return {}
    values = {name: option.default for name, option in declared_options(mode).items()}
    return json.loads(json.dumps({**values, **options}, default=repr))


def run_one(scenario, token, repeat, args, quotas, out, phases=None):
    spec = SCENARIOS[scenario]
    mode, options = variant(token)
    n = len(spec["quotas"])
    work = tempfile.mkdtemp(prefix="hetsync-bench-")
    epochs = spec.get("epochs", args.epochs)
    script = [sys.executable, os.path.join(HERE, "keras_example.py"), "--sync", mode, "--epochs", str(epochs),
              "--steps", str(args.steps), "--out", work, *spec.get("args", [])]
    if spec.get("seed_per_repeat"):
        script += ["--seed", str(repeat)]
    started = os.path.join(work, "started")  # rank 0 writes it when the training starts (the clock's zero)
    script += ["--started-file", started]
    # the quota changes count from the training's start (quota.Schedule), or from the launch
    zero_file = started if spec.get("changes_from") == "start" else None
    env = dict(os.environ, **MPI_ENV, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if "hosts" in spec:  # Open MPI across the emulated hosts, whose cgroups (cluster.sh up --cpu) hold the quotas
        cmd = launcher(n, ",".join(f"{h}:{k}" for h, k in spec["hosts"].items()), env) + script
    else:
        cmd = ["horovodrun", "--mpi", "-np", str(n), "-H", f"localhost:{n}", "sh", os.path.join(HERE, "in_cgroup.sh")]
        cmd += script
    if "device" in spec:  # sleep-emulated device time (keras_example.DeviceTime)
        cmd += ["--device-ms", str(spec["device"]["ms"]), "--device-factors",
                ",".join(str(f) for f in spec["device"]["factors"])]
        if "random" in spec["device"]:
            cmd += ["--device-random", ",".join(str(v) for v in spec["device"]["random"])]
    if options:  # a variant: its own row in the tables, under its token
        cmd += ["--sync-options", json.dumps(options, sort_keys=True)]
    if args.thread_cpu:  # every rank's threads sampled from /proc (benchmarks/thread_cpu.py), stored with the run
        cmd = [sys.executable, os.path.join(HERE, "thread_cpu.py"), "--per-rank", "--json",
               os.path.join(work, "threads.json"), "--"] + cmd
    if quotas is not None:
        env["HETSYNC_BENCH_CGROUP"] = quotas.path
        quotas.set(spec["quotas"])
    schedule = Schedule(quotas, spec.get("changes", []), zero_file, started_file=started)
    probe_before = probe(quotas)
    began = time.monotonic()
    schedule.start()
    timed_out = False
    try:
        proc = run_streamed(cmd, env=env, cwd=ROOT, timeout=args.job_timeout)
    except subprocess.TimeoutExpired as e:  # a failed run, stored as one; the next job goes on
        timed_out = True
        proc = subprocess.CompletedProcess(cmd, -9, stdout=e.output or "")
        print(f"    job killed after --job-timeout {args.job_timeout} s: stored as a failed run", flush=True)
    finally:
        schedule.stop()
    wall = time.monotonic() - began
    machine_probe = dict(difference(probe(quotas), probe_before), phases=phases)
    ranks = []
    for r in range(n):
        path = os.path.join(work, f"rank{r}.json")
        ranks.append(json.load(open(path)) if os.path.exists(path) else None)
    threads = os.path.join(work, "threads.json")
    thread_cpu = json.load(open(threads)) if os.path.exists(threads) else None
    shutil.rmtree(work, ignore_errors=True)
    record = {"scenario": scenario, "what": spec["what"], "mode": mode, "variant": token if options else None,
              "options": options,
              "settings": settings(mode, options),
              "repeat": repeat, "commit": commit(),
              "epochs": epochs, "steps": args.steps,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(cmd), "machine": machine(), "quotas": spec["quotas"],
              "device": spec.get("device"), "hosts": spec.get("hosts"),
              "quota_changes": schedule.applied, "quota_changes_from": "training start" if zero_file else "launch",
              "returncode": proc.returncode, "timed_out": timed_out,
              "job_wall_s": round(wall, 2), "training_start_s": schedule.started_s, "probe": machine_probe,
              "horovod_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HOROVOD_")},
              "ranks": ranks}
    if thread_cpu is not None:
        record["thread_cpu"] = thread_cpu
    if proc.returncode != 0 or None in ranks:
        record["output_tail"] = proc.stdout[-4000:]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{scenario}--{token.replace('/', '.')}--{repeat}.json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def run_repeat(scenario, repeat, jobs, args, progress):
    """Every mode of one repeat, in one set of new rank groups (none across emulated hosts: the hosts' own)."""
    spec = SCENARIOS[scenario]
    quotas = None if "hosts" in spec else Quotas(len(spec["quotas"]))
    try:
        phases = None
        if quotas is not None:
            quotas.set(spec["quotas"])
            phases = quotas.phases()
        for s, mode, k in jobs:
            progress.begin(f"{s} {mode} run {k}")
            rec = run_one(s, mode, k, args, quotas, args.out, phases)
            r0 = rec["ranks"][0] or {}
            progress.end(f"{s} {mode} run {k}: exit {rec['returncode']}, rank 0 trained "
                         f"{r0.get('train_s') or float('nan'):.1f} s, job {rec['job_wall_s']:.0f} s")
    finally:
        if quotas is not None:
            quotas.remove()


def probe(quotas):
    """The machine's state a job's record holds as differences over the job (docs/benchmarks.md, "Per-run
    probe"): the machine's CPU seconds (busy, idle, steal) and, with quotas, each rank group's throttling."""
    return {"machine": machine_cpu(), "groups": quotas.throttling() if quotas is not None else []}


def held_repeats(scenario, stored_runs):
    """The repeat numbers that stored runs of ``scenario`` hold (``stored_runs``: stored.load()).  A new job in one
    of them would be paired, repeat by repeat, with a Horovod run made at another time (or give a stored run a new
    one), and the machine's pace drifts over the day (docs/benchmarks.md): its ratio would mean nothing."""
    return sorted({r for runs in stored_runs.get(scenario, {}).values() for r in runs})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="slow-node",
                   help=f"comma list of {', '.join(SCENARIOS)} (sleep-emulated: {', '.join(EMULATED)}), or all")
    p.add_argument("--modes", default=",".join(MODES),
                   help="modes, each MODE or MODE/KEY=VALUE[/KEY=VALUE] (that mode with those options: a row of its "
                        "own, named by the token)")
    p.add_argument("--paper-rules", action="store_true",
                   help="also run, for every option whose default departs from its paper, the mode with the "
                        "paper's rule and without it (docs/paper-fidelity.md)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-repeat", type=int, default=None,
                   help="number of the first repeat (default: each scenario's first one that no stored run holds, "
                        "so new runs land beside the stored ones; 1 with --out elsewhere)")
    p.add_argument("--replace-repeats", action="store_true",
                   help="let --first-repeat name repeats that stored runs already hold (each new run replaces the "
                        "stored one of its mode; re-run every mode of the repeat, Horovod included, or the "
                        "pairing is lost)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per job (a scenario that sets its own keeps it)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--thread-cpu", action="store_true",
                   help="also store each rank's CPU seconds per thread (TensorFlow's, Horovod's, hetsync-engine): "
                        "where a slow rank's quota goes")
    p.add_argument("--out", default=os.path.join(HERE, "results", datetime.date.today().isoformat()))
    args = p.parse_args(argv)
    scenarios = list(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
    modes = args.modes.split(",")
    if args.paper_rules:
        modes += [t for t in paper_rules() if t not in modes]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    for token in modes:
        try:
            variant(token)
        except ValueError as e:
            p.error(str(e))
    results = os.path.join(HERE, "results")
    stored_out = os.path.commonpath([os.path.abspath(args.out), results]) == results
    stored_runs = load(results) if stored_out else {}
    held = {s: held_repeats(s, stored_runs) for s in scenarios}
    first = {s: args.first_repeat or max(held[s], default=0) + 1 for s in scenarios}
    clashes = {s: [r for r in held[s] if first[s] <= r < first[s] + args.repeats] for s in scenarios}
    if any(clashes.values()) and not args.replace_repeats:
        p.error("; ".join(f"{s} already has stored runs in repeat(s) {', '.join(map(str, r))} (first free: "
                          f"--first-repeat {max(held[s]) + 1})" for s, r in clashes.items() if r)
                + ". Pass --replace-repeats to re-run them, or --out elsewhere for runs not to store")
    jobs = [(s, m, k) for s in scenarios for k in range(first[s], first[s] + args.repeats) for m in modes]
    progress = Progress(len(jobs), estimate_s=90)
    for scenario in scenarios:
        spec = SCENARIOS[scenario]
        for repeat in sorted({k for s, _, k in jobs if s == scenario}):
            # new groups per repeat: new CFS period phases, the same for every mode of the repeat (quota.phases);
            # across emulated hosts, new hosts, whose cgroups hold the quotas
            with cluster(spec) if "hosts" in spec else contextlib.nullcontext():
                run_repeat(scenario, repeat, [j for j in jobs if j[0] == scenario and j[2] == repeat], args,
                           progress)
    print(f"results: {args.out} (benchmarks/tables.py makes the tables)")


if __name__ == "__main__":
    main()
