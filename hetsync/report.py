"""``hetsync report LOGDIR``: the heterogeneity report of a run as a PNG and a Markdown summary.

Reads the records hetsync.callbacks.HeterogeneityReportCallback wrote (``LOGDIR/hetsync/rank<R>.jsonl``, or
``LOGDIR/rank<R>.jsonl``) and writes ``LOGDIR/hetsync_report.png`` (each worker's step rate and compute rate over
time, smoothed by a rolling mean; the mode in force shaded, the switches marked with the mode they went to; the
injected slowdown phases hatched when the job recorded them with ``write_phases``) and ``LOGDIR/hetsync_report.md``
(per worker: iterations, rates, time waiting in hetsync; the switches with their reasons -- sync="auto"'s evidence;
the mode's counters as last reported).
"""
import glob
import json
import os
import re

HATCHES = ("//", "\\\\", "xx", "..")  # injected phases: one pattern each, in order

def load(logdir):
    """{rank: [records]} from LOGDIR; FileNotFoundError names where it looked."""
    paths = sorted(glob.glob(os.path.join(logdir, "hetsync", "rank*.jsonl"))) or \
        sorted(glob.glob(os.path.join(logdir, "rank*.jsonl")))
    if not paths:
        raise FileNotFoundError(f"no hetsync report records (hetsync/rank<R>.jsonl) under {logdir!r}: train with "
                                "hetsync.callbacks.HeterogeneityReportCallback(log_dir)")
    out = {}
    for path in paths:
        rank = int(re.search(r"rank(\d+)\.jsonl$", path).group(1))
        with open(path, encoding="utf-8") as f:
            out[rank] = [json.loads(line) for line in f if line.strip()]
    return out


def write_phases(logdir, phases):
    """Records the slowdown phases a job injects, for the report to hatch: ``phases`` = [(first step, end step,
    label)] in hetsync's step count (hetsync.testing.PhasedSlowdownCallback's); written to ``LOGDIR/hetsync/phases.json``."""
    os.makedirs(os.path.join(logdir, "hetsync"), exist_ok=True)
    with open(os.path.join(logdir, "hetsync", "phases.json"), "w", encoding="utf-8") as f:
        json.dump([{"start": int(a), "end": int(b), "label": str(label)} for a, b, label in phases], f)


def load_phases(logdir):
    """[(first step, end step, label)] from ``write_phases``; [] when the job recorded none."""
    for path in (os.path.join(logdir, "hetsync", "phases.json"), os.path.join(logdir, "phases.json")):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return [(p["start"], p["end"], p["label"]) for p in json.load(f)]
    return []


def rolling_mean(values, window):
    """Centred rolling mean of ``window`` points (fewer at the ends)."""
    half, out = window // 2, []
    for i in range(len(values)):
        part = values[max(0, i - half):i - half + window]
        out.append(sum(part) / len(part))
    return out


def _time_of_step(steps, x, end):
    """When step ``x`` ran, interpolated between the records' (position, time) points; ``end`` after the last."""
    for k, (pos, t) in enumerate(steps):
        if pos >= x:
            if k == 0 or pos == steps[k - 1][0]:
                return t
            p0, t0 = steps[k - 1]
            return t0 + (t - t0) * (x - p0) / (pos - p0)
    return end


def summarize(records):
    """Per-rank totals, the switches (from the lowest rank that logged them) and the time origin."""
    t0 = min(r["time"] for recs in records.values() for r in recs if "time" in r)
    ranks = {}
    for rank, recs in sorted(records.items()):
        rates = [r for r in recs if r["kind"] == "rate"]
        interval = sum(r["interval_s"] for r in rates)
        iterations = sum(r["iterations"] for r in rates)
        compute = sum(r["compute_s"] for r in rates)
        wait = sum(r["wait_s"] for r in rates)
        ranks[rank] = {"records": len(rates), "iterations": iterations, "seconds": interval,
                       "rate": iterations / interval if interval else 0.0,
                       "compute_rate": iterations / compute if compute else 0.0,
                       "wait_s": wait, "wait_fraction": wait / interval if interval else 0.0,
                       "last_metrics": rates[-1]["metrics"] if rates else {},
                       "last_mode": rates[-1]["mode"] if rates else None}
    first = min(records)
    switches = [r for r in records[first] if r["kind"] == "switch"]
    return t0, ranks, switches


def plot(records, t0, switches, path, phases=()):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    shares = any("share" in r.get("metrics", {}) for recs in records.values() for r in recs)
    fig, axes = plt.subplots(3 if shares else 2, 1, figsize=(10, 9 if shares else 6.5), sharex=True)
    first = min(records)
    rates = {rank: [r for r in recs if r["kind"] == "rate" and r["steps"] > 0 and r["interval_s"] >= 0.1]
             for rank, recs in records.items()}
    intervals = sorted(r["interval_s"] for rs in rates.values() for r in rs) or [1.0]
    every = intervals[len(intervals) // 2]
    fewest = min((len(rs) for rs in rates.values()), default=0)
    window = max(1, min(9, round(4.0 / every), fewest // 10))  # ~4 s of records; none when there are few
    end = max((r["time"] - t0 for rs in rates.values() for r in rs), default=1.0)
    # the mode in force: the first record's mode, then each switch's target (background bands)
    modes = [(0.0, next((r["mode"] for r in rates[first]), None))] + [(s["time"] - t0, s["to"]) for s in switches]
    colours = {}
    for k, (start, mode) in enumerate(modes):
        if mode is None:
            continue
        colour = colours.setdefault(mode, plt.get_cmap("Pastel2")(len(colours) % 8))
        stop = modes[k + 1][0] if k + 1 < len(modes) else end
        for ax in axes:
            ax.axvspan(start, stop, color=colour, alpha=0.45, lw=0, zorder=0)
    # the injected slowdown phases (write_phases: steps), placed in time by the first rank's records
    steps = [(r["position"], r["time"] - t0) for r in rates[first]]
    hatched = []  # (label, hatch): one pattern per phase, so that two adjacent phases stay apart
    for a, b, label in phases:
        if not steps:
            break
        when = [_time_of_step(steps, x, end) for x in (a, b)]
        pattern = HATCHES[len(hatched) % len(HATCHES)]
        for ax in axes:
            ax.axvspan(*when, facecolor="none", edgecolor="0.55", hatch=pattern, lw=0, zorder=0.5)
        hatched.append((label, pattern))
    for rank, rs in sorted(rates.items()):
        t = [r["time"] - t0 for r in rs]
        for ax, key in ((axes[0], "rate"), (axes[1], "compute_rate")):
            raw = [r[key] for r in rs]
            line, = ax.plot(t, rolling_mean(raw, window), lw=1.4, label=f"rank {rank}" if ax is axes[0] else None)
            if window > 1:
                ax.plot(t, raw, lw=0.6, alpha=0.2, color=line.get_color())
        if shares:  # sync="balanced": each worker's share of the global batch (1 = Horovod's even split)
            points = [(r["time"] - t0, r["metrics"]["share"]) for r in records[rank]
                      if r["kind"] == "rate" and "share" in r.get("metrics", {})]
            axes[2].step([p[0] for p in points], [p[1] for p in points], where="post", lw=1.2)
    for ax in axes:
        for s in switches:
            ax.axvline(s["time"] - t0, color="k", ls="--", lw=0.8)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    top = axes[0].get_ylim()[1]
    for s in switches:
        axes[0].text(s["time"] - t0, top, f" {s['to']}", rotation=90, va="top", fontsize=8)
    axes[0].set_ylabel("step rate (iterations / s)")
    axes[1].set_ylabel("compute rate (iterations / s of compute)")
    if shares:
        axes[2].set_ylabel("balanced: share (1 = Horovod's)")
    axes[-1].set_xlabel("time since start (s)")
    axes[0].legend(fontsize=7, ncol=4, loc="lower left")
    background = [Patch(color=c, alpha=0.45, label=f"mode: {m}") for m, c in colours.items()]
    background += [Patch(facecolor="none", edgecolor="0.55", hatch=h, label=f"injected: {x}") for x, h in hatched]
    if background:
        axes[1].legend(handles=background, fontsize=7, ncol=2, loc="lower left")
    smoothed = (f"rolling mean of {window} records (~{window * every:.0f} s; faint: raw)" if window > 1 else
                f"one point per record (every ~{every:.1f} s; too few to smooth)")
    axes[0].set_title(f"hetsync heterogeneity report: per-worker rates, {smoothed}\nshaded: the mode in force; "
                      "dashed: switches"
                      + ("; hatched: injected slowdown" if hatched else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(logdir, t0, ranks, switches):
    lines = [f"# hetsync heterogeneity report: `{logdir}`", "", "## Workers", "",
             "| rank | iterations | step rate (it/s) | compute rate (it/s) | waiting in hetsync | mode at the end |",
             "|---|---|---|---|---|---|"]
    for rank, s in ranks.items():
        lines.append(f"| {rank} | {s['iterations']} | {s['rate']:.1f} | {s['compute_rate']:.1f} | "
                     f"{s['wait_s']:.1f} s ({s['wait_fraction']:.0%}) | {s['last_mode']} |")
    lines += ["", "## Sync modes", ""]
    if not switches:
        lines.append("No switch: one mode for the whole run.")
    else:
        lines += ["| time (s) | step | from | to | reason | took (s) |", "|---|---|---|---|---|---|"]
        for s in switches:
            reason = str(s.get("reason", "")).replace("|", "/")
            lines.append(f"| {s['time'] - t0:.1f} | {s['position']} | {s['from']} | {s['to']} | {reason} | "
                         f"{s.get('seconds', 0):.2f} |")
    lines += ["", "## Mode counters (last record of each worker)", ""]
    for rank, s in ranks.items():
        counters = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in sorted(s["last_metrics"].items()))
        lines.append(f"- rank {rank} ({s['last_mode']}): {counters or '(none)'}")
    return "\n".join(lines) + "\n"


def write_report(logdir, out_dir=None):
    """Writes the PNG and the Markdown; returns their paths."""
    records = load(logdir)
    t0, ranks, switches = summarize(records)
    out_dir = out_dir or logdir
    os.makedirs(out_dir, exist_ok=True)
    png, md = os.path.join(out_dir, "hetsync_report.png"), os.path.join(out_dir, "hetsync_report.md")
    plot(records, t0, switches, png, load_phases(logdir))
    with open(md, "w", encoding="utf-8") as f:
        f.write(markdown(logdir, t0, ranks, switches))
    return png, md
