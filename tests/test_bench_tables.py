"""The README's benchmark tables are generated from the stored runs (benchmarks/tables.py, benchmarks/results/), and
the tables read the runs as their page says: speedups per repeat against plain Horovod of the same repeat."""
import contextlib
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import figures  # noqa: E402
import probes  # noqa: E402
import run  # noqa: E402
import stored  # noqa: E402
import tables  # noqa: E402

from hetsync.algorithms import departures  # noqa: E402


def test_every_generated_table_matches_the_stored_runs():
    """A number typed into a generated block, a stored run changed without regenerating, or a measured figure typed
    by hand into the README or a mode page's Measured section, fails here."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tables.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "<!-- bench: slow-node -->" in readme, "the README's headline is the CPU-quota slow-node table"


def _record(mode, repeat, train_s, curve, returncode=0, epoch_ends=None):
    rank0 = {"rank": 0, "train_s": train_s, "curve": curve}
    if epoch_ends is not None:
        rank0["epoch_ends"] = epoch_ends
    return {"scenario": "s", "what": "test", "mode": mode, "repeat": repeat, "commit": "c", "quotas": [1, 1],
            "epochs": 3,
            "machine": {"cpus": 2, "cpu": "x"}, "returncode": returncode, "job_wall_s": train_s + 10,
            "ranks": [rank0, {"rank": 1}]}


def test_speedups_pair_each_repeat_with_horovods_and_failed_runs_are_named(tmp_path):
    """Repeat k of a mode is compared with repeat k of plain Horovod (they ran back to back), not median with
    median; time to target is the first curve point at the target accuracy; a failed run counts in no column and
    is named."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record("horovod", 1, 100.0, [(50.0, 0.5, 1.0), (90.0, 0.92, 0.3)], epoch_ends=[40.0, 70.0, 100.0]),
            _record("horovod", 2, 60.0, [(30.0, 0.91, 0.3)]),
            _record("esync", 1, 50.0, [(20.0, 0.95, 0.2)], epoch_ends=[20.0, 35.0, 50.0]),
            _record("esync", 2, 40.0, [(12.0, 0.93, 0.2)]),
            _record("esync", 3, 1.0, [(1.0, 0.99, 0.1)], returncode=1)]
    for rec in runs:
        (day / f"{rec['mode']}-{rec['repeat']}.json").write_text(json.dumps(rec))
    loaded = stored.load(str(tmp_path))
    rows = stored.summary(loaded["s"], target=0.9)
    assert rows["esync"]["speedup"] == [2.0, 1.5]          # 100/50 and 60/40; medians would give 80/45
    assert rows["esync"]["ttt"] == [20.0, 12.0]
    assert rows["esync"]["ttt_speedup"] == [4.5, 2.5]      # 90/20 and 30/12
    assert rows["esync"]["runs"] == 2 and rows["esync"]["failed"] == 1
    # the steady state: from the first epoch's end to the last's (no first trace); a run without epoch ends has none
    assert rows["esync"]["steady"] == [30.0, None] and rows["esync"]["steady_speedup"] == [2.0, None]
    text = tables.table("s", loaded["s"], target=0.9)
    assert "| `esync` (1 failed) | 45.0 (40.0-50.0) | 1.75x (1.50x-2.00x) | 30.0 | 2.00x |" in text, text
    assert "| epochs 2-3, s |" in text, text


def test_runs_timed_from_the_common_start_replace_a_modes_earlier_runs_and_pair_only_with_their_own_clock(tmp_path):
    """Runs stored before the benchmark's common start (keras_example.py) timed from on_train_begin, where plain
    Horovod's time held the ranks' start-up and hetsync's did not.  A mode with runs on the common start is read from
    those alone; a speedup never pairs runs of two clocks; a row still on the old clock says so."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    fair = [_record("horovod", 3, 80.0, [(40.0, 0.95, 0.2)]), _record("esync", 3, 40.0, [(20.0, 0.95, 0.2)]),
            _record("esync", 4, 30.0, [(10.0, 0.95, 0.2)])]  # esync 4 has no Horovod run of its clock
    for rec in fair:
        rec["ranks"][0]["clock"] = stored.COMMON_START
    old = [_record("horovod", 1, 100.0, [(50.0, 0.95, 0.2)]), _record("esync", 1, 25.0, [(20.0, 0.95, 0.2)]),
           _record("hop", 1, 50.0, [(20.0, 0.95, 0.2)]), _record("hop", 3, 40.0, [(20.0, 0.95, 0.2)])]
    for rec in fair + old:
        (day / f"{rec['mode']}-{rec['repeat']}.json").write_text(json.dumps(rec))
    loaded = stored.load(str(tmp_path))
    rows = stored.summary(loaded["s"], target=0.9)
    assert rows["esync"]["train"] == [40.0, 30.0] and rows["esync"]["speedup"] == [2.0]  # not 100/25, not 80/30
    assert rows["horovod"]["train"] == [80.0] and rows["horovod"]["common_start"]
    assert rows["hop"]["speedup"] == [2.0] and not rows["hop"]["common_start"]  # 100/50: hop 3 meets no old Horovod
    text = tables.table("s", loaded["s"], target=0.9)
    assert "| `hop` (on_train_begin) |" in text and "| `esync` |" in text, text
    assert "but for the rows marked (on_train_begin)" in text, text
    # a figure against another mode reads the repeats both ran on one clock: esync's run 1 against hop's (not 3)
    assert figures.figure("s esync speedup vs=hop stat=each", loaded, target=0.9) == "2.00x"


def test_a_scenario_run_on_two_machines_says_which_runs_ran_where(tmp_path):
    """Training seconds of different machines must not pass as one machine's: the header names each machine with
    its runs, and a scenario of one machine names only that one."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record(mode, k, 10.0 * k, [(1.0, 0.95, 0.1)]) for mode in ("horovod", "esync") for k in (1, 2, 3, 7)]
    for rec in runs:
        if rec["repeat"] == 7:
            rec["machine"] = {"cpus": 2, "cpu": "y"}
        (tmp_path / "2026-01-01" / f"{rec['mode']}-{rec['repeat']}.json").write_text(json.dumps(rec))
    text = tables.table("s", stored.load(str(tmp_path))["s"], target=0.9)
    assert "2 CPUs (x): runs 1-3; 2 CPUs (y): runs 7." in text, text
    one = {m: {k: r for k, r in reps.items() if k != 7} for m, reps in stored.load(str(tmp_path))["s"].items()}
    assert "2 CPUs (x).  Median" in tables.table("s", one, target=0.9)


def test_the_switches_a_run_recorded_are_listed_under_its_table(tmp_path):
    """An auto run's time means little without the modes it trained in: each run that recorded its switches is
    listed with them ("none" when it stayed); a run from before switches were recorded is not."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record("horovod", 1, 100.0, [(1.0, 0.95, 0.1)]), _record("auto", 1, 50.0, [(1.0, 0.95, 0.1)]),
            _record("auto", 2, 60.0, [(1.0, 0.95, 0.1)]), _record("auto", 3, 70.0, [(1.0, 0.95, 0.1)])]
    runs[1]["ranks"][0]["switches"] = [{"position": 32, "from": "ripples-smart", "to": "eager-solo",
                                        "reason": "auto: random", "seconds": 4.8}]
    runs[2]["ranks"][0]["switches"] = []
    runs[0]["ranks"][0]["switches"] = []
    for rec in runs:
        (day / f"{rec['mode']}-{rec['repeat']}.json").write_text(json.dumps(rec))
    text = tables.table("s", stored.load(str(tmp_path))["s"], target=0.9)
    assert "- `auto` run 1, switches: step 32: ripples-smart -> eager-solo (auto: random)" in text, text
    assert "- `auto` run 2, switches: none" in text and "run 3" not in text, text
    assert "`horovod` run" not in text, text  # a fixed mode that did not switch is not listed


def test_thread_tables_split_each_rank_by_thread_and_tell_fast_from_slow(tmp_path, monkeypatch):
    """The thread-CPU block: a rank's unnamed threads add up as "other", system time in brackets, the fast ranks'
    mean against the slowest rank's own numbers; a subfolder names its runs' condition."""
    rec = _record("eager-solo", 1, 50.0, [(20.0, 0.95, 0.2)], epoch_ends=[20.0, 35.0, 50.0])
    rec["quotas"] = [0.45, 0.45, 0.09]
    rec["ranks"].append({"rank": 2})
    rec["thread_cpu"] = [{"rank": -1, "thread": "mpirun", "user_s": 9.0, "system_s": 9.0},
                         {"rank": 0, "thread": "main", "user_s": 4.0, "system_s": 0.0},
                         {"rank": 0, "thread": "python", "user_s": 1.0, "system_s": 5.0},
                         {"rank": 0, "thread": "tf_data", "user_s": 2.0, "system_s": 0.0},
                         {"rank": 1, "thread": "main", "user_s": 2.0, "system_s": 0.0},
                         {"rank": 1, "thread": "hetsync-engine", "user_s": 1.0, "system_s": 1.0},
                         {"rank": 2, "thread": "main", "user_s": 1.0, "system_s": 0.5}]
    folder = tmp_path / "thread-profiles" / "day" / "some-knob"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(rec))
    monkeypatch.setattr(tables, "HERE", str(tmp_path))
    text = tables.threads_table("day")
    # fast ranks 0 and 1: main (4+2)/2, engine (0+2)/2, other (6+2+0)/2; system (5+0 + 0+1+0)/2
    assert "| `s` | `eager-solo` | some-knob | 30.0 | 3.0 / 1.0 / 4.0 (3.0) | 1.5 / -- / -- (0.5) |" in text, text


def test_a_figure_in_running_text_is_read_off_the_stored_runs(tmp_path):
    """``<!-- fig: ... -->`` picks a column of one mode, pairs it run by run with plain Horovod or with ``vs=``,
    keeps only ``runs=A-B``; a figure whose runs are not stored fails instead of keeping its old text."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record("horovod", k, t, [(1.0, 0.95, 0.1)]) for k, t in ((1, 100.0), (2, 90.0), (3, 80.0))]
    runs += [_record("esync", k, t, [(1.0, 0.95, 0.1)]) for k, t in ((1, 50.0), (2, 60.0), (3, 40.0))]
    runs += [_record("auto", k, t, [(1.0, 0.95, 0.1)]) for k, t in ((1, 25.0), (2, 20.0), (3, 80.0))]
    for rec in runs:
        (day / f"{rec['mode']}-{rec['repeat']}.json").write_text(json.dumps(rec))
    loaded = stored.load(str(tmp_path))
    assert figures.figure("s esync speedup", loaded) == "2.00x (1.50x-2.00x)"      # 100/50, 90/60, 80/40
    assert figures.figure("s esync speedup stat=each", loaded) == "2.00 / 1.50 / 2.00x"
    assert figures.figure("s auto speedup vs=esync stat=median", loaded) == "2.00x"  # 2.0, 3.0, 0.5
    assert figures.figure("s esync train runs=2-3 stat=range", loaded) == "40.0-60.0 s"
    assert figures.figure("s horovod train runs=2", loaded) == "90.0 s"
    assert figures.figure("s horovod train", loaded) == "90.0 s (80.0-100.0 s)"
    page = "a <!-- fig: s esync speedup stat=median -->9.99x<!-- /fig --> b"
    assert tables.render(page, loaded) == "a <!-- fig: s esync speedup stat=median -->2.00x<!-- /fig --> b"
    unclosed = "<!-- fig: s esync speedup -->1x<!-- /fig--> and <!-- fig: s auto speedup -->2x<!-- /fig -->"
    try:
        tables.render(unclosed, loaded)
    except ValueError:
        pass
    else:
        raise AssertionError("a figure without its closing marker swallowed the next one")
    for gone in ("s hop speedup", "other esync speedup", "s esync speedup runs=7-9", "s esync fastness"):
        try:
            figures.figure(gone, loaded)
        except ValueError:
            continue
        raise AssertionError(f"{gone!r} gave a figure without loaded runs")


def test_a_switch_is_read_step_by_step_against_the_baseline_of_the_same_repeat(tmp_path):
    """``switch``, ``switch_lag``, ``after_switch`` and ``after_switch_speedup`` come from each run's step ends
    (``batch_ends``): step p (1-based), which ends in the switch (hetsync's callback runs before the user's), and
    step p + 1, the new mode's first; how much later the run began step p than the baseline's run of its repeat;
    the steps after them.  A run without a switch has none of them."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    base = _record("eager-solo", 1, 10.0, [(1.0, 0.95, 0.1)])
    base["ranks"][0]["batch_ends"] = [1.0 * k for k in range(1, 11)]             # one step a second
    switched = _record("auto", 1, 16.0, [(1.0, 0.95, 0.1)])
    switched["ranks"][0]["batch_ends"] = [2.0, 4.0, 6.0, 7.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    switched["ranks"][0]["switches"] = [{"position": 4, "from": "ripples-smart", "to": "eager-solo",
                                         "reason": "auto", "seconds": 3.5}]
    unswitched = _record("auto", 2, 9.0, [(1.0, 0.95, 0.1)])
    unswitched["ranks"][0]["batch_ends"] = [1.0 * k for k in range(1, 10)]
    base2 = _record("eager-solo", 2, 9.0, [(1.0, 0.95, 0.1)])
    base2["ranks"][0]["batch_ends"] = [1.0 * k for k in range(1, 10)]
    for rec in (base, switched, unswitched, base2):
        (day / f"{rec['mode']}-{rec['repeat']}.json").write_text(json.dumps(rec))
    loaded = stored.load(str(tmp_path))
    row = stored.summary(loaded["s"], target=0.9, baseline="eager-solo")["auto"]
    assert row["switch"] == [5.0]              # steps 4 and 5: 6.0 -> 11.0 s
    assert row["switch_lag"] == [3.0]          # step 4 began at 6.0 s, the baseline's at 3.0 s
    assert row["after_switch"] == [5.0]        # steps 6-10: 11.0 -> 16.0 s
    assert row["after_switch_speedup"] == [1.0]  # the baseline's steps 6-10 took 5 s too
    assert figures.figure("s auto switch_lag vs=eager-solo", loaded) == "3.0 s"
    assert len(row["switch"]) == 1             # run 2 never switched


def test_a_measured_figure_typed_by_hand_is_found_and_a_generated_one_is_not():
    """No page may hold a measured figure (a ratio such as 2.44x, or decimal seconds) that was not generated; a
    scenario's integer ratio (5x slower), a program's text (a fenced block, inline code, also across a line break)
    and an option's default are not figures -- but a figure outside the code span that sits beside one is."""
    text = ("one 5x slower node; ripples-smart 2.44x Horovod, epochs in 12.8-22.5 s and 9.0 s.\n"
            "<!-- fig: s m speedup -->3.10x<!-- /fig -->\n<!-- bench: s -->\n| m | 1.20x | 33.0 s |\n<!-- /bench -->\n"
            "```text\nloop 9.3 s, 1.50x\n```\n"
            "`away_after` (default 0.2 s) fails with `timed out after\n2.0 s` and ``a `b` 1.5 s``; it took 4.1 s.\n")
    assert tables.hand_typed(text) == ["2.44x", "12.8-22.5 s", "9.0 s", "4.1 s"]


def test_a_variant_token_names_a_mode_and_its_options_or_is_refused():
    """``MODE/KEY=VALUE`` runs MODE with that option (JSON values typed, others strings); a typo, in the mode, the
    option's name or its value, is refused before any job starts, with the mode's own declarations."""
    assert run.variant("esync/on_ready=abort") == ("esync", {"on_ready": "abort"})
    assert run.variant("ripples-random/group_buffer=false/seed=3") == ("ripples-random",
                                                                       {"group_buffer": False, "seed": 3})
    assert run.variant("hop") == ("hop", {})
    assert run.variant("auto/report_every=4/settle=1") == ("auto", {"report_every": 4, "settle": 1})  # its own
    for bad, says in (("hopp", "unknown mode"), ("horovod/x=1", "no hetsync options"), ("esync/abort", "KEY=VALUE"),
                      ("esync/onready=abort", "did you mean 'on_ready'"), ("esync/on_ready=abrt", "'finish' or 'abort'"),
                      ("ripples-random/group_buffer=0", "True or False"), ("auto/late=latest", "unknown option(s) ['late']"),
                      ("auto/report_every=0", "report_every"), ("auto/setle=1", "did you mean 'settle'")):
        try:
            run.variant(bad)
        except ValueError as e:
            assert says in str(e), e
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_a_variant_is_compared_with_its_own_mode_in_the_same_repeat_and_kept_out_of_the_scenario_table(tmp_path):
    """A paper's rule and our default are compared run k with run k of the same mode (not with Horovod, and not
    median with median); the variant is no row of the scenario's own table."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record("horovod", 1, 100.0, [(90.0, 0.92, 0.3)]),
            _record("esync", 1, 50.0, [(20.0, 0.95, 0.2)]),
            _record("esync", 2, 40.0, [(10.0, 0.93, 0.2)]),
            _record("esync", 3, 45.0, [(15.0, 0.93, 0.2)]),
            dict(_record("esync", 1, 80.0, [(60.0, 0.91, 0.2)]), variant="esync/on_ready=abort",
                 options={"on_ready": "abort"}),
            dict(_record("esync", 2, 44.0, [(15.0, 0.92, 0.2)]), variant="esync/on_ready=abort",
                 options={"on_ready": "abort"})]
    for i, rec in enumerate(runs):
        (day / f"{i}.json").write_text(json.dumps(rec))
    loaded = stored.load(str(tmp_path))["s"]
    assert set(loaded) == {"horovod", "esync", "esync/on_ready=abort"}
    text = tables.rules_table("s", loaded, target=0.9)
    # to 90%: 60/20 and 15/10 -> 3.00x and 1.50x; training 80/50 and 44/40; repeat 3 has no variant to pair with
    assert "| `esync` | `on_ready=abort` | 15.0 (10.0-20.0) / 37.5 (15.0-60.0) | 2.25x (1.50x-3.00x) | " \
           "1.35x (1.10x-1.60x) | 0.940 (0.930-0.950) / 0.915 (0.910-0.920) | 2 |" in text, text
    assert "on_ready" not in tables.table("s", loaded, target=0.9)
    assert figures.figure("s esync ttt_speedup vs=esync/on_ready=abort stat=median", {"s": loaded}) == "2.25x"


def test_paper_rules_run_each_departing_option_both_ways_where_it_acts():
    """``--paper-rules`` comes from the declarations (Option.paper_rule): every option whose default is ours runs
    with the paper's value right after the same mode without it, and an option that acts only beside another
    (ESync's on_ready, non-blocking mode only) is compared with that other option set in both runs -- in blocking
    mode the two runs would be the same code, and their difference noise."""
    tokens = run.paper_rules()
    assert "esync/non_blocking=true/on_ready=abort" in tokens and "esync/on_ready=abort" not in tokens
    assert {"eager-solo/late=algorithm5", "ripples-random/group_buffer=false",
            "ripples-smart/exclude_laggards=false"} <= set(tokens)
    for token in tokens:
        run.variant(token)  # each is valid for its mode: the paper's value passes the option's own check
    compared = [t for t in tokens if tables.paired_with(t) and tables.paired_with(t)[0] in tokens]
    assert len(compared) == len(departures()), compared  # one comparison per departing option
    for token in compared:
        base = tables.paired_with(token)[0]
        assert tokens.index(base) < tokens.index(token), (base, token)


def test_a_variant_is_paired_with_its_token_less_its_last_option(tmp_path):
    """``esync/non_blocking=true/on_ready=abort`` is compared with ``esync/non_blocking=true`` of the same repeat,
    not with ``esync``'s defaults."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record("esync", 2, 10.0, [(5.0, 0.95, 0.2)]),
            dict(_record("esync", 1, 50.0, [(20.0, 0.95, 0.2)]), variant="esync/non_blocking=true"),
            dict(_record("esync", 1, 60.0, [(30.0, 0.93, 0.2)]), variant="esync/non_blocking=true/on_ready=abort")]
    for i, rec in enumerate(runs):
        (day / f"{i}.json").write_text(json.dumps(rec))
    text = tables.rules_table("s", stored.load(str(tmp_path))["s"], target=0.9)
    assert "| `esync/non_blocking=true` | `on_ready=abort` | 20.0 / 30.0 | 1.50x | 1.20x |" in text, text
    assert "| `esync` |" not in text, text  # esync's defaults ran in another repeat: nothing to pair


def test_a_record_stores_every_option_as_the_run_used_it():
    """``settings``: the mode's declared defaults with the token's options over them, so a stored run says what it
    ran even after a default changes; plain Horovod has none."""
    defaults = run.settings("eager-solo", {})
    assert set(defaults) == set(run.declared_options("eager-solo")) and defaults["late"] == "accumulate"
    assert run.settings("eager-solo", {"late": "algorithm5"})["late"] == "algorithm5"
    assert json.loads(json.dumps(run.settings("esync", {"non_blocking": True})))["non_blocking"] is True
    assert run.settings("horovod", {}) == {}


def test_a_probe_row_reads_the_fast_ranks_by_quota_and_leaves_out_runs_without_a_probe():
    """The slow rank is the one with the smallest quota wherever it sits, the fast ranks those with the largest (a
    rank in between is neither); phases are in ms after group 0's.  A run stored before the probe has no row."""
    rec = _record("horovod", 7, 50.0, [(5.0, 0.5, 1.0)], epoch_ends=[20.0, 35.0, 50.0])
    rec.update(quotas=[0.45, 0.09, 0.45, 0.2], probe={
        "machine": {"busy": 1, "idle": 1, "steal": 0}, "phases": [0.0, 0.0374, 0.0991, 0.0006],
        "groups": [{"periods": 100, "throttled": 50, "throttled_s": 1}, {"periods": 90, "throttled": 90,
                                                                         "throttled_s": 5},
                   {"periods": 100, "throttled": 70, "throttled_s": 1}, {"periods": 9, "throttled": 0,
                                                                         "throttled_s": 0}]})
    rec["ranks"] = [dict(rec["ranks"][0], cpu_s=10.0), {"rank": 1, "cpu_s": 2.5}, {"rank": 2, "cpu_s": 14.0},
                    {"rank": 3, "cpu_s": 99.0}]
    assert probes.row(rec) == ["7", "plain Horovod", "50.0", "30.0", "12.0 / 2.5", "60% / 100%", "0 37 99 1"]
    old = _record("esync", 7, 40.0, [(5.0, 0.5, 1.0)])
    table = probes.probe_table("s", {"horovod": {7: rec}, "esync": {7: old}}, 1, 9)
    assert "| 7 | plain Horovod |" in table and "`esync`" not in table
    assert "No stored run of `s` with a probe in runs 8-9" in probes.probe_table("s", {"horovod": {7: rec}}, 8, 9)
    page = "a\n<!-- bench-probe: s runs=7-7 -->\n<!-- /bench-probe -->\nb\n<!-- bench-probe: s runs=8-9 -->\nold\n" \
           "<!-- /bench-probe -->\n"
    once = probes.render(page, {"s": {"horovod": {7: rec}}})
    assert probes.render(once, {"s": {"horovod": {7: rec}}}) == once  # its markers kept: rendered again, the same
    assert once.count("<!-- /bench-probe -->") == 2 and "| 7 | plain Horovod |" in once and "old" not in once


class _Groups:
    """Stands in for benchmarks/quota.Quotas (root needed): each made gets its own number, as its phases."""
    made = 0

    def __init__(self):
        _Groups.made += 1
        self.number, self.removed, self.quotas = _Groups.made, False, None

    def set(self, quotas):
        self.quotas = quotas

    def phases(self):
        return [self.number]

    def remove(self):
        self.removed = True


def test_each_repeat_runs_its_modes_in_new_groups_whose_phases_its_records_hold(tmp_path, monkeypatch):
    """The groups' CFS period phases decide plain Horovod's pace under quotas and stay fixed for a group's life:
    one set of groups for a whole run of run.py made every repeat one draw.  Each repeat gets new groups, set to the
    scenario's quotas before their phases are read, and every mode of the repeat runs in them with those phases."""
    calls = []
    monkeypatch.setattr(run, "run_one", lambda *a: calls.append((a[1], a[2], a[4], a[6])) or {
        "ranks": [None], "returncode": 0, "job_wall_s": 0})
    monkeypatch.setattr(run, "Quotas", lambda n: _Groups())
    run.main(["--scenarios", "slow-node", "--modes", "horovod,esync", "--repeats", "2", "--out", str(tmp_path)])
    assert [(mode, repeat) for mode, repeat, _, _ in calls] == [("horovod", 1), ("esync", 1), ("horovod", 2),
                                                               ("esync", 2)]
    first, second = calls[0][2], calls[2][2]
    assert first is calls[1][2] and second is calls[3][2] and first is not second
    assert [c[3] for c in calls] == [[first.number]] * 2 + [[second.number]] * 2
    assert first.removed and second.removed and first.quotas == run.SCENARIOS["slow-node"]["quotas"]


def test_across_emulated_hosts_each_repeat_runs_its_modes_on_new_hosts(tmp_path, monkeypatch):
    """The hosts' cgroups hold the quotas there, with phases of their own: one set of hosts per run of run.py made
    every repeat one draw, as rank groups did."""
    events = []

    @contextlib.contextmanager
    def hosts(spec):
        events.append("up")
        yield
        events.append("down")

    monkeypatch.setattr(run, "cluster", hosts)
    monkeypatch.setattr(run, "run_one", lambda *a: events.append((a[1], a[2], a[4])) or {
        "ranks": [None], "returncode": 0, "job_wall_s": 0})
    run.main(["--scenarios", "2-hosts", "--modes", "horovod,esync", "--repeats", "2", "--out", str(tmp_path)])
    assert events == ["up", ("horovod", 1, None), ("esync", 1, None), "down",
                      "up", ("horovod", 2, None), ("esync", 2, None), "down"]


def test_a_new_run_lands_in_a_repeat_no_stored_run_holds(tmp_path, monkeypatch, capsys):
    """Repeat k of a mode is paired with repeat k of plain Horovod: a job added to a held repeat would pair with a
    Horovod run made at another time.  By default run.py numbers each scenario's new repeats past its stored ones;
    a --first-repeat that names a held repeat is refused before any job starts, naming the held repeats and the
    first free one; --replace-repeats and an --out outside the stored results let it through."""
    day = tmp_path / "2026-01-01"
    day.mkdir()
    for rec in [_record("horovod", 1, 10.0, []), _record("esync", 2, 10.0, []),
                dict(_record("esync/on_ready=abort", 4, 10.0, []), mode="esync", variant="esync/on_ready=abort")]:
        token = rec.get("variant") or rec["mode"]
        (day / f"{token.replace('/', '.')}-{rec['repeat']}.json").write_text(json.dumps(rec))
    assert run.held_repeats("s", stored.load(str(tmp_path))) == [1, 2, 4]
    assert run.held_repeats("t", stored.load(str(tmp_path))) == []

    jobs = []
    monkeypatch.setattr(run, "run_one", lambda *a: jobs.append(a[:3]) or {"ranks": [None], "returncode": 0,
                                                                          "job_wall_s": 0})
    monkeypatch.setattr(run, "Quotas", lambda n: _Groups())
    held = run.held_repeats("slow-node", stored.load())
    assert held, "the stored slow-node runs"
    argv = ["--scenarios", "slow-node", "--modes", "horovod", "--repeats", "1"]
    run.main(argv)
    assert jobs == [("slow-node", "horovod", max(held) + 1)]
    with pytest.raises(SystemExit):
        run.main(argv + ["--first-repeat", str(held[0])])
    assert f"slow-node already has stored runs in repeat(s) {held[0]} (first free: --first-repeat {max(held) + 1})" \
        in capsys.readouterr().err
    assert len(jobs) == 1
    run.main(argv + ["--first-repeat", str(held[0]), "--out", str(tmp_path / "elsewhere")])
    run.main(argv + ["--first-repeat", str(held[0]), "--replace-repeats"])
    run.main(argv + ["--out", str(tmp_path / "elsewhere")])
    assert jobs[1:] == [("slow-node", "horovod", held[0])] * 2 + [("slow-node", "horovod", 1)]


def test_runs_of_a_former_default_are_read_as_its_variant_and_keep_a_row_of_their_own(tmp_path, monkeypatch):
    """After a default changes, a mode's row must hold only runs of today's default: a stored run made with the
    former value (its recorded settings say so, or it predates recorded settings) reads as ``MODE/OPTION=FORMER``,
    a variant run of today's value as the mode itself, and the scenario table shows the former default's row
    beside the mode's, named in its caption.  Today's value is the mode's declared default."""
    from hetsync.algorithms import declared_options

    for mode, changed in stored.FORMER_DEFAULTS.items():
        for name, (former, today) in changed.items():
            assert declared_options(mode)[name].default == today != former, (mode, name)
    monkeypatch.setattr(stored, "FORMER_DEFAULTS", {"esync": {"on_ready": ("wait", "abort")}})
    day = tmp_path / "2026-01-01"
    day.mkdir()
    runs = [_record("horovod", 1, 100.0, [(90.0, 0.92, 0.3)]),
            _record("esync", 1, 50.0, [(20.0, 0.95, 0.2)]),                       # before settings were recorded
            dict(_record("esync", 2, 40.0, [(10.0, 0.93, 0.2)]), settings={"on_ready": "wait", "local": 1}),
            dict(_record("esync", 3, 45.0, [(15.0, 0.93, 0.2)]), settings={"on_ready": "abort", "local": 1}),
            dict(_record("esync", 4, 44.0, [(15.0, 0.92, 0.2)]), variant="esync/on_ready=abort",
                 options={"on_ready": "abort"}),
            dict(_record("esync", 5, 44.0, [(15.0, 0.92, 0.2)]), variant="esync/local=2/on_ready=wait",
                 options={"local": 2, "on_ready": "wait"})]
    for i, rec in enumerate(runs):
        (day / f"{i}.json").write_text(json.dumps(rec))
    loaded = stored.load(str(tmp_path))["s"]
    assert {k: sorted(v) for k, v in loaded.items()} == {
        "horovod": [1], "esync": [3, 4], "esync/on_ready=wait": [1, 2], "esync/local=2/on_ready=wait": [5]}
    assert stored.former_default("esync/on_ready=wait") and not stored.former_default("esync/local=2/on_ready=wait")
    text = tables.table("s", loaded, target=0.9)
    assert "| `esync` |" in text and "| `esync/on_ready=wait` |" in text and "local=2" not in text, text
    assert "`esync/on_ready=wait`: `esync`'s runs made when `on_ready=wait` was its default." in text, text


def _changed(train_s, changes, start=None, quotas=(0.45, 0.45, 0.45, 0.45)):
    rec = {"quotas": list(quotas), "quota_changes": [list(c) for c in changes], "ranks": [{"train_s": train_s}],
           "quota_changes_from": "launch" if start is not None else "training start"}
    if start is not None:
        rec["training_start_s"] = start
    return stored.changed_share(rec)


def test_the_share_of_training_under_a_quota_change_counts_from_where_the_training_began(tmp_path):
    """``changed``: how much of rank 0's training a changed quota was in force -- launch-timed changes placed by
    when the training began (the driver saw rank 0's start file), any rank off its launch quota counting once."""
    shared = [(30.0, 3, 0.09), (60.0, 3, 0.45)]
    assert _changed(30.0, shared, start=20.0) == pytest.approx(20 / 30)  # training 20-50 s, shared from 30 s
    assert _changed(20.0, shared, start=5.0) == 0.0  # over before the node was shared
    assert _changed(30.0, shared[:1], start=20.0) == pytest.approx(20 / 30)  # the job ended before the restore
    assert _changed(32.0, [(8.0, 3, 0.09), (24.0, 3, 0.45)]) == pytest.approx(0.5)  # counted from the training
    overlapping = [(1.0, 0, 0.09), (2.0, 1, 0.09), (3.0, 0, 0.45), (4.0, 1, 0.45)]
    assert _changed(10.0, overlapping) == pytest.approx(0.3)  # 1-4 s: rank 1 still slow after rank 0's restore
    old = {"quotas": [0.45] * 4, "quota_changes": [list(c) for c in shared], "quota_changes_from": "launch",
           "ranks": [{"train_s": 30.0}]}
    assert stored.changed_share(old) is None  # stored before the training start was recorded
    assert _changed(30.0, []) == 0.0 and _changed(15.0, [], start=8.0) == 0.0  # none applied: over before 30 s
    day = tmp_path / "2026-01-01"
    day.mkdir()
    for k, start in ((1, 20.0), (2, 5.0)):
        rec = _record("auto", k, 30.0 if k == 1 else 20.0, [(1.0, 0.95, 0.1)])
        rec.update(quotas=[0.45] * 4, quota_changes=[list(c) for c in shared], quota_changes_from="launch",
                   training_start_s=start)
        (day / f"auto-{k}.json").write_text(json.dumps(rec))
    assert figures.figure("s auto changed stat=each", stored.load(str(tmp_path))) == "67% / 0%"
