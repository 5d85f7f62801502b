"""The per-run probe's table (benchmarks/run.py stores it with every run since it had one): what the machine and each
rank's cgroup did during the job, so that a run's pace can be read against the state it ran in.

A ``<!-- bench-probe: SCENARIO runs=A-B -->`` block in a page (benchmarks/tables.py writes it) holds one row per
stored run of the scenario in those repeats, every mode: rank 0's training and epochs 2..N, each rank's CPU
seconds over its training (the fast ranks' mean and the slowest rank: what its quota let it use), the share of
scheduler periods in which a group ran out of quota, and the groups' CFS period phases, in milliseconds after group
0's (``quota.Quotas.phases``: measured before the repeat's first job, the same for each mode of the repeat).
"""
import re
import statistics

from stored import BASELINE, after_first_epoch, ok

PROBE = re.compile(r"(?P<begin><!-- bench-probe: (?P<scenario>[a-z0-9-]+) runs=(?P<first>\d+)-(?P<last>\d+) -->\n)"
                   r"(?P<body>.*?)(?P<end><!-- /bench-probe -->)", re.S)


def _ranks(rec):
    """(fast ranks, the slowest rank) by the run's quotas: the fast ones hold the largest quota."""
    quotas = rec["quotas"]
    fast = [r for r, q in enumerate(quotas) if q == max(quotas)]
    return fast, min(range(len(quotas)), key=lambda r: (quotas[r], -r))


def _throttled(group):
    return 100.0 * group["throttled"] / group["periods"] if group["periods"] else 0.0


def row(rec):
    """One run's cells, or None for a failed run or one stored without a probe."""
    probe = rec.get("probe")
    if not probe or not ok(rec) or not probe.get("groups"):
        return None
    fast, slow = _ranks(rec)
    cpu = [r.get("cpu_s") for r in rec["ranks"]]
    groups = probe["groups"]
    steady = after_first_epoch(rec["ranks"][0])
    phases = probe.get("phases")
    name = "plain Horovod" if rec["mode"] == BASELINE else f"`{rec.get('variant') or rec['mode']}`"
    return [str(rec["repeat"]), name,
            f"{rec['ranks'][0]['train_s']:.1f}", "--" if steady is None else f"{steady:.1f}",
            f"{statistics.mean(cpu[r] for r in fast):.1f} / {cpu[slow]:.1f}",
            f"{statistics.mean(_throttled(groups[r]) for r in fast):.0f}% / {_throttled(groups[slow]):.0f}%",
            "--" if not phases else " ".join(str(round(1000 * p)) for p in phases)]


def probe_table(scenario, modes, first, last):
    """The block's body for ``scenario``'s stored runs ``modes`` ({mode: {repeat: record}}) in repeats first..last."""
    recs = sorted((rec for repeats in modes.values() for k, rec in repeats.items() if first <= k <= last),
                  key=lambda rec: (rec["repeat"], rec["mode"] != BASELINE, rec.get("variant") or rec["mode"]))
    rows = [cells for cells in map(row, recs) if cells is not None]
    if not rows:
        return f"No stored run of `{scenario}` with a probe in runs {first}-{last} yet.\n"
    lines = [f"Scenario `{scenario}`, runs {first}-{last}, per run: rank 0's training and epochs 2-N in seconds; "
             "each rank's CPU seconds over its training and the share of scheduler periods in which its group ran "
             "out of quota (the fast ranks' mean / the slow rank); the groups' CFS period phases, ms after group "
             "0's (the same for every mode of a repeat).", "",
             "| run | mode | training s | epochs 2-N, s | CPU s, fast / slow | throttled, fast / slow | phases, ms |",
             "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def render(text, runs):
    """``text`` with every probe block rewritten from ``runs`` ({scenario: {mode: {repeat: record}}})."""
    return PROBE.sub(lambda m: m.group("begin") + probe_table(m.group("scenario"), runs.get(m.group("scenario"), {}),
                                                              int(m.group("first")), int(m.group("last")))
                     + m.group("end"), text)
