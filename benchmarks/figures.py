"""A figure in running text, generated from the stored runs: ``<!-- fig: SCENARIO MODE COLUMN [vs=MODE] [runs=A-B]
[stat=S] -->`` ... ``<!-- /fig -->`` (benchmarks/tables.py rewrites each one's body from :func:`figure`)."""
import re
import statistics

from stored import BASELINE, TARGET, common_start, spread, summary

FIGURE = re.compile(r"<!-- fig: (?P<spec>[^>]*?) -->(?P<body>(?:(?!<!--).)*?)<!-- /fig -->", re.S)
FORMATS = {"train": "{:.1f} s", "steady": "{:.1f} s", "ttt": "{:.1f} s", "wall": "{:.0f} s", "accuracy": "{:.3f}",
           "speedup": "{:.2f}x", "steady_speedup": "{:.2f}x", "ttt_speedup": "{:.2f}x",
           "switch": "{:.1f} s", "switch_lag": "{:.1f} s", "after_switch": "{:.1f} s",
           "after_switch_speedup": "{:.2f}x", "changed": "{:.0%}"}
STATS = ("spread", "median", "range", "each", "min", "max")
def figure(spec, runs, target=TARGET):
    """One figure in running text, from ``<!-- fig: SCENARIO MODE COLUMN [vs=MODE] [runs=A-B] [stat=S] -->``.

    COLUMN is one of :func:`summary`'s (``train``, ``steady``, ``ttt``, ``wall``, ``accuracy``, or a speedup:
    ``speedup``, ``steady_speedup``, ``ttt_speedup``; or, for runs that switched and stored each step's end, against
    the baseline's run of the same repeat: ``switch``, the step that ends in the first switch and the new mode's
    first step, ``switch_lag``, how much later the run began them, ``after_switch``, the steps after them, and
    ``after_switch_speedup``, the baseline's time over those steps divided by the run's; ``changed``, the share of
    the training in which a quota change was in force, stored.changed_share); a speedup is against
    plain Horovod of the same repeat, or against ``vs=MODE`` in the repeats both ran on one clock; ``runs=A-B``
    keeps repeats A..B; S is ``spread`` (median and range, the default), ``median``, ``range``, ``each`` (every
    run, in repeat order), ``min`` or ``max``.  A spec naming anything not stored raises, so a page cannot keep a
    figure whose runs are gone."""
    words = spec.split()
    if len(words) < 3:
        raise ValueError(f"figure {spec!r}: needs SCENARIO MODE COLUMN")
    scenario, mode, column = words[:3]
    opts = dict(w.split("=", 1) for w in words[3:])
    stat = opts.get("stat", "spread")
    for what, value, known in (("option", sorted(set(opts) - {"vs", "runs", "stat"}), []),
                               ("column", column, FORMATS), ("stat", stat, STATS), ("scenario", scenario, runs)):
        if value and value not in known:
            raise ValueError(f"figure {spec!r}: unknown {what} {value} (known: {', '.join(known) or 'vs, runs, stat'})")
    modes = runs[scenario]
    if "runs" in opts:
        first, _, last = opts["runs"].partition("-")
        keep = range(int(first), int(last or first) + 1)
        modes = {m: {k: r for k, r in reps.items() if k in keep} for m, reps in modes.items()}
    if "vs" in opts:  # two modes compared: the repeats both ran on one clock, the common start's if any
        base, own = modes.get(opts["vs"], {}), modes.get(mode, {})
        both = [k for k in base if k in own and common_start(base[k]) == common_start(own[k])]
        keep = set([k for k in both if common_start(base[k])] or both)
        modes = {m: {k: r for k, r in reps.items() if k in keep} for m, reps in modes.items()}
    rows = summary(modes, target, baseline=opts.get("vs", BASELINE))
    values = [v for v in rows.get(mode, {}).get(column, []) if v is not None]
    if not values:
        raise ValueError(f"figure {spec!r}: no stored run gives it")
    return _formatted(values, FORMATS[column], stat)


def _formatted(values, fmt, stat):
    """``values`` (in repeat order) as ``stat`` says, each number as ``fmt``, its unit written once."""
    number, unit = fmt[:fmt.index("}") + 1], fmt[fmt.index("}") + 1:]
    if stat == "spread" and unit.startswith(" ") and len(values) > 1:  # seconds: "52.2 s (41.7-53.0 s)"
        return f"{fmt.format(statistics.median(values))} ({_formatted(values, fmt, 'range')})"
    if stat == "spread":  # a ratio, as the tables write it: "2.12x (1.84x-2.27x)"
        return spread(values, fmt)
    if stat == "range" and len(values) > 1:
        return f"{number.format(min(values))}-{number.format(max(values))}{unit}"
    if stat == "each":
        return " / ".join(number.format(v) for v in values) + unit
    pick = {"median": statistics.median, "range": statistics.median, "min": min, "max": max}[stat]
    return fmt.format(pick(values))
