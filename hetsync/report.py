"""``hetsync report LOGDIR``: the heterogeneity report of a run as a PNG and a Markdown summary.

Reads the records keras_callbacks.HeterogeneityReport wrote (``LOGDIR/hetsync/rank<R>.jsonl``, or
``LOGDIR/rank<R>.jsonl``) and writes ``LOGDIR/hetsync_report.png`` (each worker's step rate and compute rate over
time, the switches marked with the mode they went to) and ``LOGDIR/hetsync_report.md`` (per worker: iterations,
rates, time waiting in hetsync; the switches with their reasons -- sync="auto"'s evidence; the mode's counters as
last reported).
"""
import glob
import json
import os
import re


def load(logdir):
    """{rank: [records]} from LOGDIR; FileNotFoundError names where it looked."""
    paths = sorted(glob.glob(os.path.join(logdir, "hetsync", "rank*.jsonl"))) or \
        sorted(glob.glob(os.path.join(logdir, "rank*.jsonl")))
    if not paths:
        raise FileNotFoundError(f"no hetsync report records (hetsync/rank<R>.jsonl) under {logdir!r}: train with "
                                "keras_callbacks.HeterogeneityReport(log_dir) or a TensorBoard callback")
    out = {}
    for path in paths:
        rank = int(re.search(r"rank(\d+)\.jsonl$", path).group(1))
        with open(path, encoding="utf-8") as f:
            out[rank] = [json.loads(line) for line in f if line.strip()]
    return out


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


def plot(records, t0, switches, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = any("share" in r.get("metrics", {}) for recs in records.values() for r in recs)
    fig, axes = plt.subplots(3 if shares else 2, 1, figsize=(10, 9 if shares else 6.5), sharex=True)
    for rank, recs in sorted(records.items()):
        rates = [r for r in recs if r["kind"] == "rate" and r["steps"] > 0 and r["interval_s"] >= 0.1]
        t = [r["time"] - t0 for r in rates]
        axes[0].plot(t, [r["rate"] for r in rates], label=f"rank {rank}", lw=1.2)
        axes[1].plot(t, [r["compute_rate"] for r in rates], lw=1.2)
        if shares:  # sync="balanced": each worker's share of the global batch (1 = Horovod's even split)
            points = [(r["time"] - t0, r["metrics"]["share"]) for r in recs
                      if r["kind"] == "rate" and "share" in r.get("metrics", {})]
            axes[2].step([p[0] for p in points], [p[1] for p in points], where="post", lw=1.2)
    for ax in axes:
        for s in switches:
            ax.axvline(s["time"] - t0, color="k", ls="--", lw=0.8)
    top = axes[0].get_ylim()[1]
    for s in switches:
        axes[0].text(s["time"] - t0, top, f" {s['to']}", rotation=90, va="top", fontsize=8)
    axes[0].set_ylabel("step rate (iterations / s)")
    axes[1].set_ylabel("compute rate (iterations / s of compute)")
    if shares:
        axes[2].set_ylabel("balanced: share (1 = Horovod's)")
    axes[-1].set_xlabel("time since start (s)")
    axes[0].legend(fontsize=7, ncol=4, loc="lower left")
    axes[0].set_title("hetsync heterogeneity report: per-worker rates; dashed lines: sync mode switches")
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
    plot(records, t0, switches, png)
    with open(md, "w", encoding="utf-8") as f:
        f.write(markdown(logdir, t0, ranks, switches))
    return png, md
