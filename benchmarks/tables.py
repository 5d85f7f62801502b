"""The README's benchmark tables, generated from the stored runs (benchmarks/results/<date>/*.json, benchmarks/run.py).

    python benchmarks/tables.py            # rewrites every generated block and figure in README.md and docs/
    python benchmarks/tables.py --check    # exit 1 if one differs from what the stored runs give, or if a
                                           # measured figure was typed by hand into a page

A generated block sits between ``<!-- bench: SCENARIO -->`` and ``<!-- /bench -->``; nothing between the markers is
written by hand. A ``<!-- bench-rules: SCENARIO -->`` block holds the scenario's variants (``run.py --modes
MODE/KEY=VALUE``: a paper's own rule beside our default), each against its mode's defaults in the same repeat. A
``<!-- bench-modes: MODE,MODE -->`` block (a mode's page) holds those modes' rows of every stored scenario, each
against plain Horovod. A ``<!-- bench-threads: FOLDER -->`` block is made the same way from the runs stored with
``run.py --thread-cpu`` under benchmarks/thread-profiles/FOLDER/ (a subfolder names a condition of its runs, such as
an environment variable set for them): where each rank's CPU went, per thread. A ``<!-- bench-probe: SCENARIO
runs=A-B -->`` block holds each run's probe (benchmarks/probes.py). A figure in running text sits between
``<!-- fig: SCENARIO MODE COLUMN [vs=MODE] [runs=A-B] [stat=S] -->`` and ``<!-- /fig -->`` (benchmarks/figures.py;
MODE may be a variant's token). What each column reads off a run is in benchmarks/stored.py. Per mode, over the
scenario's repeats: rank 0's training time (fit's on_train_begin to on_train_end) as median and range; the speedup
against plain Horovod, per repeat (the modes of one repeat ran one after another) and then its median and range;
rank 0's time from the end of its first epoch to the end of its last (the steady state: no first-step tracing in
it), with the same speedup; the time until rank 0's model first reached the target accuracy on the held-out set (its
curve is sampled every 10 of its batches), with the same speedup; the final accuracy; the job's wall time (launch to
exit, the driver's clock: a teardown stall shows there, not in training). Under a table, each run that recorded its
live switches (``sync="auto"``) lists them.
"""
import argparse
import glob
import json
import os
import re
import sys

import probes
from figures import FIGURE, FORMATS, figure
from stored import (BASELINE, TARGET, after_first_epoch, former_default, load, ok, runs_label, spread, summary,
                    timed_alike, token_parts)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))),
         *sorted(glob.glob(os.path.join(ROOT, "docs", "modes", "*.md")))]
BLOCK = re.compile(r"(<!-- bench: (?P<scenario>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /bench -->)", re.S)
MODES_BLOCK = re.compile(r"(<!-- bench-modes: (?P<modes>[a-z0-9,/=_-]+) -->\n)(?P<body>.*?)(<!-- /bench-modes -->)",
                         re.S)  # MODES: modes or variants' tokens
THREADS = re.compile(r"(<!-- bench-threads: (?P<folder>[A-Za-z0-9._-]+) -->\n)(?P<body>.*?)(<!-- /bench-threads -->)",
                     re.S)
RULES = re.compile(r"(<!-- bench-rules: (?P<scenario>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /bench-rules -->)", re.S)
OWN_THREADS = ("main", "hetsync-engine")  # named threads; everything else of the rank's process is "other"
OLD_CLOCK = " (on_train_begin)"  # after a row's name: its runs predate the common start (_clock)


def _machines(modes):
    """Which machine ran which runs: medians of training seconds mix machines when a scenario ran on more than one,
    while a speedup always pairs runs of one machine (run k of a mode and of Horovod ran one after another)."""
    where = {}
    for repeats in modes.values():
        for k, rec in repeats.items():
            m = rec["machine"]
            where.setdefault(f"{m['cpus']} CPUs ({m['cpu']})", set()).add(k)
    if len(where) == 1:
        return next(iter(where))
    return "; ".join(f"{name}: runs {runs_label(ks)}" for name, ks in sorted(where.items(), key=lambda i: min(i[1])))


def _cells(row, *columns):
    """``| ``-joined cells of summary() ``row``'s ``columns``, each its median (range) in the column's format (a
    figure's, less the seconds, which the header names): every table writes a column alike."""
    return " | ".join(spread(row[c], FORMATS[c].replace(" s", "")) for c in columns)


def table(scenario, modes, target=TARGET):
    rows = summary(modes, target)
    order = [BASELINE] + sorted(m for m in rows if m != BASELINE and (not paired_with(m) or former_default(m)))
    some = next(iter(next(iter(modes.values())).values()))
    commits = ", ".join(sorted({rec["commit"] for repeats in modes.values() for rec in repeats.values()}))
    pct = int(round(target * 100))
    epochs = some.get("epochs") or re.search(r"--epochs (\d+)", some["command"]).group(1)
    lines = [f"Scenario `{scenario}`: {some['what']}; quotas {some['quotas']} of a core per rank; "
             f"runs per mode in the last column (speedups pair run k with plain Horovod's run k), commits {commits}, "
             f"{_machines(modes)}.  Median (range).{_former(order)}{_clock(rows)}",
             "",
             f"| mode | training s | vs Horovod | epochs 2-{epochs}, s | vs Horovod | time to {pct}% accuracy, s | "
             "vs Horovod | final accuracy | job s | runs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mode in order:
        if mode not in rows:
            continue
        r = rows[mode]
        name = "plain Horovod" if mode == BASELINE else f"`{mode}`"
        if r["failed"]:
            name += f" ({r['failed']} failed)"
        if not r["common_start"] and any(row["common_start"] for row in rows.values()):
            name += OLD_CLOCK
        lines.append(f"| {name} | {_cells(r, 'train', 'speedup', 'steady', 'steady_speedup', 'ttt', 'ttt_speedup')} "
                     f"| {_cells(r, 'accuracy', 'wall')} | {r['runs']} |")
    return "\n".join(lines + _switches(modes)) + "\n"


def _clock(rows):
    """The caption's words for the clock of the table's runs (keras_example.py; docs/benchmarks.md, "The clock")."""
    fair = [row["common_start"] for row in rows.values() if row["runs"]]
    old = ("timed from Keras' on_train_begin, before the benchmark's common start: plain Horovod's training time "
           "holds its wait for the ranks' start-up, and hetsync's leaves out that wait and its own set-up, so their "
           "training and time-to-accuracy speedups lean toward hetsync (epochs 2-N do not)")
    if all(fair):
        return "  Timed from an allreduce every rank makes just before fit."
    if not any(fair):
        return f"  Runs {old}."
    return (f"  Timed from an allreduce every rank makes just before fit, but for the rows marked (on_train_begin): "
            f"runs {old}.")


def _former(tokens):
    """The caption's words for the rows of a mode's runs made under a former default."""
    return "".join(f"  `{t}`: `{token_parts(t)[0]}`'s runs made when `{token_parts(t)[1][0]}` was its default."
                   for t in tokens if former_default(t))


def paired_with(token):
    """``MODE/KEY=VALUE...`` -> (its base, the last "KEY=VALUE") for a variant's token; None for a mode's own name.
    The base is the token less its last option (``esync/non_blocking=true/on_ready=abort`` is ``on_ready=abort`` on
    ``esync/non_blocking=true``): an option that acts only beside another is compared where it acts."""
    mode, pairs = token_parts(token)
    return ("/".join([mode, *pairs[:-1]]), pairs[-1]) if pairs else None


def rules_table(scenario, modes, target=TARGET):
    """Each variant stored in ``scenario`` (a mode with an option set: a paper's own rule beside our default, or
    ours beside the paper's) against its base (the same mode with its defaults, or with the variant's other options)
    paired repeat by repeat: how much sooner the base reached the target accuracy and finished training (the
    variant's time over the base's, so above 1 the base is faster), and both final accuracies."""
    pct = int(round(target * 100))
    lines = [f"Scenario `{scenario}`, generated from the stored runs (benchmarks/results/): each row a mode run with "
             "one option changed from its default (the mode column names any other option both runs set), and the "
             "same mode without that change in the same repeat.  Median (range) over the runs; \"default faster by\" "
             "is the changed run's time over the default's, so below 1 the changed option was faster.",
             "",
             f"| mode | option changed | time to {pct}% accuracy, s: default / changed | default faster by, to "
             f"{pct}% | training, default faster by | final accuracy: default / changed | runs |",
             "|---|---|---|---|---|---|---|"]
    for token in sorted(m for m in modes if paired_with(m)):
        base, option = paired_with(token)
        paired = {k: r for k, r in modes.get(base, {}).items() if k in modes[token]}  # the base's runs of its repeats
        if not paired:
            continue
        rows = summary({base: paired, token: modes[token]}, target, baseline=token)
        default, changed = rows[base], rows[token]
        lines.append(f"| `{base}` | `{option}` | {_cells(default, 'ttt')} / {_cells(changed, 'ttt')} | "
                     f"{_cells(default, 'ttt_speedup', 'speedup', 'accuracy')} / {_cells(changed, 'accuracy')} | "
                     f"{len(default['speedup'])} |")
    if len(lines) == 4:
        return f"No stored variant run in `{scenario}` yet.\n"
    return "\n".join(lines) + "\n"


def _switches(modes):
    """Below a table: the live switches of each ``sync="auto"`` run that recorded them ("none" when it stayed), and
    of any other run that switched, rank 0's view, so that a run's time can be read against the modes it trained
    in."""
    out = []
    for mode in sorted(modes):
        for k, rec in sorted(timed_alike(modes[mode]).items()):  # the runs the mode's row reads
            r0 = rec["ranks"][0] if ok(rec) else None
            if r0 is None or "switches" not in r0 or (mode != "auto" and not r0["switches"]):
                continue
            moves = "; ".join(f"step {s['position']}: {s['from']} -> {s['to']} ({s['reason']})"
                              for s in r0["switches"]) or "none"
            out.append(f"- `{mode}` run {k}, switches: {moves}")
    return ["", *out] if out else []


def _emulated(modes):
    """`` (emulated)`` after a sleep-emulated scenario's name, so that its rows are not read as real heterogeneity."""
    return " (emulated)" if any(rec.get("device") for repeats in modes.values() for rec in repeats.values()) else ""


def modes_table(modes, runs, target=TARGET):
    """The rows of ``modes`` in every stored scenario (a mode's page): its speedups against plain Horovod, paired run
    by run as in :func:`table`, and its accuracy beside Horovod's."""
    pct = int(round(target * 100))
    lines = ["Generated from the stored runs: CPU quotas (real heterogeneity), and sleep-emulated device time where "
             "the scenario says *emulated* (docs/benchmarks.md has each scenario's full table, machine and commits).  "
             "Median (range) over the runs.  Rows marked (on_train_begin): runs timed from Keras' on_train_begin, "
             "before the benchmark's common start, whose training and time-to-accuracy speedups lean toward hetsync "
             "(docs/benchmarks.md, \"The clock\"; epochs 2-N do not).",
             "",
             f"| scenario | mode | training, vs Horovod | epochs 2-N, vs Horovod | time to {pct}% accuracy, vs Horovod "
             "| final accuracy | Horovod's accuracy | runs |",
             "|---|---|---|---|---|---|---|---|"]
    for scenario in sorted(runs):
        rows = summary(runs[scenario], target)
        base = rows.get(BASELINE, {}).get("accuracy", [])
        name = f"`{scenario}`{_emulated(runs[scenario])}"
        for mode in modes:
            if mode not in rows:
                continue
            r = rows[mode]
            clock = "" if r["common_start"] else OLD_CLOCK
            cells = _cells(r, "speedup", "steady_speedup", "ttt_speedup", "accuracy")
            lines.append(f"| {name} | `{mode}`{clock} | {cells} "
                         f"| {spread(base, FORMATS['accuracy'])} | {r['runs']} |")
    if len(lines) == 4:
        return f"No stored run of {', '.join(f'`{m}`' for m in modes)} yet.\n"
    return "\n".join(lines) + "\n"


# Integer ratios (``5x slower``) describe a scenario, not a result.
HAND_TYPED = re.compile(r"\b\d+\.\d+x\b|\b\d+\.\d+(?:-\d+\.\d+)? s\b")
# Where no figure may be typed by hand: every page but testing.md, which records the suite's own timings run by run
# (a run of the suite is no benchmark result).
UNCHECKED = {os.path.join(ROOT, "docs", "testing.md")}


FENCED = re.compile(r"^```.*?^```", re.S | re.M)  # a program's printed output, shown as an example of it
CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)  # inline code: a log line, an error message, a value
SETTING = re.compile(r"\bdefault:? \d+\.\d+ s\b")  # a default is a setting, not a result


def hand_typed(text):
    """The measured figures of ``text`` that no generated block or figure made: each one a number nobody can
    regenerate from the stored runs.  A fenced block or inline code is a program's text shown as such (its output,
    an error message, an option's value), and a default is a setting: neither is a figure."""
    for pattern in (BLOCK, MODES_BLOCK, RULES, THREADS, FIGURE, FENCED, CODE, SETTING):
        text = pattern.sub("", text)
    return HAND_TYPED.findall(text)


def thread_rows(folder):
    """(condition, record) of every run stored under benchmarks/thread-profiles/``folder``: the condition is the
    subfolder's name ("" for runs at the folder's top)."""
    top = os.path.join(HERE, "thread-profiles", folder)
    out = []
    for path in sorted(glob.glob(os.path.join(top, "**", "*.json"), recursive=True)):
        condition = os.path.relpath(os.path.dirname(path), top)
        out.append(("" if condition == "." else condition, json.load(open(path))))
    return out


def thread_cpu(rec):
    """{rank: {"main" | "hetsync-engine" | "other": [CPU s, of which system s]}} of a run stored with --thread-cpu."""
    per = {}
    for t in rec.get("thread_cpu") or []:
        if t["rank"] is None or t["rank"] < 0:
            continue
        kind = t["thread"] if t["thread"] in OWN_THREADS else "other"
        cell = per.setdefault(t["rank"], {}).setdefault(kind, [0.0, 0.0])
        cell[0] += t["user_s"] + t["system_s"]
        cell[1] += t["system_s"]
    return per


def _cpu(cells, kinds):
    return " / ".join(f"{cells[k][0]:.1f}" if k in cells else "--" for k in kinds) + \
        f" ({sum(c[1] for c in cells.values()):.1f})"


def threads_table(folder):
    """Per stored run: rank 0's epochs 2..N, and each rank kind's CPU per thread (the fast ranks' mean, the slowest
    rank), with the system time (spinning in sched_yield shows there) in brackets."""
    rows = thread_rows(folder)
    if not rows:
        return f"No stored run under benchmarks/thread-profiles/{folder} yet.\n"
    kinds = ("main",) + OWN_THREADS[1:] + ("other",)
    lines = ["CPU seconds per thread over the whole job: " + " / ".join(kinds) + " (of which system time).  Fast "
             "ranks: the mean of the ranks with the largest quota; slow rank: the one with the smallest.  Commits "
             + ", ".join(sorted({rec["commit"] for _, rec in rows})) + ".",
             "",
             "| scenario | mode | condition | epochs 2-N, s | fast ranks | slow rank |",
             "|---|---|---|---|---|---|"]
    for condition, rec in rows:
        per, quotas = thread_cpu(rec), rec["quotas"]
        fast = [r for r, q in enumerate(quotas) if q == max(quotas) and r in per]
        slow = min((r for r in per), key=lambda r: (quotas[r], -r))
        mean = {k: [sum(per[r].get(k, [0.0, 0.0])[i] for r in fast) / len(fast) for i in (0, 1)]
                for k in kinds if any(k in per[r] for r in fast)}
        steady = after_first_epoch(rec["ranks"][0]) if ok(rec) else None
        env = ", ".join(f"{k}={v}" for k, v in (rec.get("horovod_env") or {}).items())
        name = "plain Horovod" if rec["mode"] == BASELINE else f"`{rec['mode']}`"
        lines.append(f"| `{rec['scenario']}` | {name}"
                     f" | {condition or env or 'defaults'} | {'--' if steady is None else f'{steady:.1f}'} | "
                     f"{_cpu(mean, kinds)} | {_cpu(per[slow], kinds)} |")
    return "\n".join(lines) + "\n"


def render(text, runs):
    """``text`` with every generated block rewritten from ``runs``; a block whose scenario has no stored run says so."""
    def block(m):
        scenario = m.group("scenario")
        body = table(scenario, runs[scenario]) if scenario in runs else f"No stored run of `{scenario}` yet.\n"
        return m.group(1) + body + m.group(4)

    text = BLOCK.sub(block, text)
    text = RULES.sub(lambda m: m.group(1) + rules_table(m.group("scenario"), runs.get(m.group("scenario"), {}))
                     + m.group(4), text)
    if text.count("<!-- fig:") != len(FIGURE.findall(text)):
        raise ValueError("a <!-- fig: ... --> without its own <!-- /fig --> (a figure may not hold another)")
    text = FIGURE.sub(lambda m: f"<!-- fig: {m.group('spec')} -->{figure(m.group('spec'), runs)}<!-- /fig -->", text)
    text = MODES_BLOCK.sub(lambda m: m.group(1) + modes_table(m.group("modes").split(","), runs) + m.group(4), text)
    text = probes.render(text, runs)
    return THREADS.sub(lambda m: m.group(1) + threads_table(m.group("folder")) + m.group(4), text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a generated block differs from the stored runs, or a measured figure was typed "
                        "by hand")
    args = p.parse_args(argv)
    runs, stale, typed = load(), [], {}
    for page in PAGES:
        if not os.path.exists(page):
            continue
        text = open(page).read()
        new = render(text, runs)
        if new != text:
            stale.append(os.path.relpath(page, ROOT))
            if not args.check:
                open(page, "w").write(new)
        figures = [] if page in UNCHECKED else hand_typed(text)
        if figures:
            typed[os.path.relpath(page, ROOT)] = figures
    if args.check and (stale or typed):
        if stale:
            print(f"generated benchmark tables out of date in {', '.join(stale)}: run python benchmarks/tables.py")
        for page, figures in typed.items():
            print(f"{page}: measured figures typed by hand, not generated from a stored run: {', '.join(figures)}")
        return 1
    print("benchmark tables " + ("up to date" if args.check else f"written ({', '.join(stale) or 'no change'})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
