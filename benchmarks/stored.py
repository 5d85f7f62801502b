"""The stored benchmark runs (benchmarks/results/<date>/*.json, written by benchmarks/run.py) and what every table and
figure reads off them: which runs completed, rank 0's training time, its steady state, its time to the target
accuracy, and each mode's speedups against a baseline paired repeat by repeat."""
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = 0.9  # held-out accuracy of "time to target"
BASELINE = "horovod"


def token_parts(token):
    """``MODE`` or ``MODE/KEY=VALUE[/KEY=VALUE...]`` -> (MODE, ["KEY=VALUE", ...]): the one reading of a run's
    token, which run.py launches and the tables name (a variant: a mode with options set)."""
    mode, *pairs = token.split("/")
    return mode, pairs


# Defaults that changed after runs were stored: {mode: {option: (the former default, today's)}}.  A stored run of
# the mode that ran with the former value -- its ``settings`` say so; a run stored before runs recorded their
# settings ran with it -- is read as the variant ``MODE/OPTION=FORMER``, as if run.py had been given that token, and
# a variant run of today's value as the mode itself: a mode's own row holds only runs of its defaults of today
# (tests/test_bench_tables.py checks today's value against the mode's declaration).
FORMER_DEFAULTS = {"od-sgd": {"local_updater": ("sgd", "optimizer")}}


def token_of(rec):
    """The token a stored run is read under: its variant's (``run.py --modes MODE/KEY=VALUE``) or its mode's, with
    ``FORMER_DEFAULTS`` applied."""
    token = rec.get("variant") or rec["mode"]
    mode, pairs = token_parts(token)
    changed = FORMER_DEFAULTS.get(mode, {})
    if not changed:
        return token
    settings = rec.get("settings") or {}
    options = dict(pair.partition("=")[::2] for pair in pairs)
    for name, (former, today) in changed.items():
        ran = options.get(name, settings.get(name, former))
        if ran == former:
            options[name] = former
        elif ran == today:
            options.pop(name, None)
    return "/".join([mode] + [f"{k}={v}" for k, v in options.items()])


def former_default(token):
    """Whether ``token`` is a mode with one option at a former default (``MODE/OPTION=FORMER``): the mode's runs of
    before the change, which its scenario tables keep as a row of their own."""
    mode, pairs = token_parts(token)
    return len(pairs) == 1 and any(pairs[0] == f"{name}={former}"
                                   for name, (former, _) in FORMER_DEFAULTS.get(mode, {}).items())


def load(results=os.path.join(HERE, "results")):
    """Every stored run, newest date folder last: {scenario: {mode: {repeat: record}}} (a later date's run of the same
    scenario, mode and repeat replaces an earlier one).  A variant (``run.py --modes MODE/KEY=VALUE``: a mode with
    an option set, such as a paper's own rule) is keyed by its token, and a run of a former default as its variant
    (``token_of``)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(results, "*", "*.json"))):
        rec = json.load(open(path))
        runs.setdefault(rec["scenario"], {}).setdefault(token_of(rec), {})[rec["repeat"]] = rec
    return runs


COMMON_START = "common-start"  # keras_example.py's clock: zero after an allreduce every rank makes just before fit


def common_start(rec):
    """Whether the run was timed from the common start (keras_example.py); runs stored before it timed from Keras'
    ``on_train_begin``, where plain Horovod's time held the ranks' start-up skew and hetsync's did not."""
    r0 = rec["ranks"][0] if rec.get("ranks") else None
    return bool(r0) and r0.get("clock") == COMMON_START


def timed_alike(repeats):
    """The runs of one mode that a table reads: those timed from the common start when it has any, else all."""
    fair = {k: r for k, r in repeats.items() if common_start(r)}
    return fair or repeats


def time_to(curve, target):
    """Seconds since the run's clock zero of the first point whose accuracy is at least ``target`` (None: never)."""
    return next((t for t, accuracy, _ in curve if accuracy >= target), None)


def after_first_epoch(rank):
    """Seconds from the end of the first epoch to the end of the last: the steady state, without the first step's
    tracing (None: the run recorded no epoch ends, or one epoch)."""
    ends = rank.get("epoch_ends") or []
    return ends[-1] - ends[0] if len(ends) >= 2 else None


def switch_steps(rank):
    """(p, when step p began, seconds of steps p and p + 1, seconds of the steps after them) from the rank's
    ``batch_ends`` for its first switch, which ends step p (None: no switch, or a run without step ends).  hetsync's
    callback runs before the user's, so step p's recorded end comes after the switch, and step p + 1 is the new
    mode's first (its trace, if it was never used)."""
    ends, switches = rank.get("batch_ends") or [], rank.get("switches") or []
    p = switches[0]["position"] if switches else None
    if p is None or not 2 <= p < len(ends):
        return None
    return p, ends[p - 2], ends[p] - ends[p - 2], ends[-1] - ends[p]


def changed_share(rec):
    """The share of rank 0's training time in which some rank's quota was off its launch quota (a node shared, a
    transient slowdown), from the changes as applied (none: 0, as for a job over before the first) and, where they
    count from the launch, from when the training began (``training_start_s``, the driver's clock); None for a run
    stored before that time was recorded.  Launch-timed, it says how much of the scenario a job met: a job whose start-up
    or pace moved its training away from a change met less of it."""
    changes, r0 = rec.get("quota_changes") or [], rec["ranks"][0]
    start = 0.0 if rec.get("quota_changes_from") == "training start" else rec.get("training_start_s")
    if start is None or not r0.get("train_s"):
        return None
    launch, now, inside = list(rec["quotas"]), list(rec["quotas"]), 0.0
    end = start + r0["train_s"]
    changes = sorted(changes)
    for (at, rank, quota), until in zip(changes, [c[0] for c in changes[1:]] + [float("inf")]):
        now[rank] = quota
        if now != launch:  # from this change to the next, some rank is off its launch quota
            inside += max(0.0, min(until, end) - max(at, start))
    return inside / r0["train_s"]


def ok(rec):
    return rec["returncode"] == 0 and rec["ranks"] and all(rec["ranks"]) and rec["ranks"][0]["curve"]


def spread(values, fmt):
    """``median (min-max)`` of the values, or ``--`` when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return "--"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def summary(modes, target=TARGET, baseline=BASELINE):
    """Per mode: the columns' values, each a list over the repeats that both it and the baseline completed (the
    speedups: the baseline's time over the mode's, repeat by repeat, both runs on the same clock).  A mode with runs
    timed from the common start is read from those alone (``timed_alike``); ``common_start`` says which clock."""
    base = modes.get(baseline, {})
    rows = {}
    for mode, repeats in modes.items():
        repeats = timed_alike(repeats)
        done = {k: r for k, r in repeats.items() if ok(r)}
        row = {"runs": len(done), "failed": len(repeats) - len(done), "train": [], "speedup": [], "ttt": [],
               "ttt_speedup": [], "steady": [], "steady_speedup": [], "accuracy": [], "wall": [],
               "switch": [], "switch_lag": [], "after_switch": [], "after_switch_speedup": [], "changed": [],
               "common_start": any(common_start(r) for r in done.values())}
        for k, rec in sorted(done.items()):
            r0 = rec["ranks"][0]
            row["train"].append(r0["train_s"])
            row["accuracy"].append(r0["curve"][-1][1])
            row["wall"].append(rec["job_wall_s"])
            row["changed"].append(changed_share(rec))
            ttt, steady = time_to(r0["curve"], target), after_first_epoch(r0)
            row["ttt"].append(ttt)
            row["steady"].append(steady)
            if k in base and ok(base[k]) and common_start(base[k]) == common_start(rec):
                b0 = base[k]["ranks"][0]
                row["speedup"].append(b0["train_s"] / r0["train_s"])
                b_ttt, b_steady = time_to(b0["curve"], target), after_first_epoch(b0)
                row["ttt_speedup"].append(b_ttt / ttt if b_ttt and ttt else None)
                row["steady_speedup"].append(b_steady / steady if b_steady and steady else None)
                _switch_columns(row, switch_steps(r0), b0.get("batch_ends") or [])
        rows[mode] = row
    return rows


def _switch_columns(row, steps, base_ends):
    """A run's first switch against the baseline's run of the same repeat, step by step (``batch_ends``): the step
    that ends in the switch and the new mode's first; how much later the run began the first of them; the steps
    after them, and the baseline's time over the same steps divided by the run's."""
    if steps is None:
        return
    p, began, switch, after = steps
    if p >= len(base_ends):
        return
    row["switch"].append(switch)
    row["switch_lag"].append(began - base_ends[p - 2])
    row["after_switch"].append(after)
    base_after = base_ends[-1] - base_ends[p]
    row["after_switch_speedup"].append(base_after / after if after > 0 else None)


def runs_label(repeats):
    """``1-3, 7`` for repeats 1, 2, 3 and 7."""
    spans = []
    for k in sorted(repeats):
        if spans and k == spans[-1][1] + 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
