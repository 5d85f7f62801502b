"""``sync="auto"``'s policy: classify the job from its workers' compute times and name the mode for the class.

A plain state machine (no clock of its own, no gRPC): the Switch Board (switchboard.py) feeds it every rank's
samples and asks it after each report; tests/test_auto_policy.py checks it alone with hypothesis.

**Samples.**  One per step and rank: seconds of *compute* per iteration -- from the start of the rank's step to
the moment its gradients were ready (hetsync/training/step_clock.py), so time spent waiting for peers, in hetsync's
collectives or Horovod's, is not in it.  An injected SlowdownCallback runs inside the step, as a slower GPU would.  In
ESync, whose Keras step is a round of local iterations, each local iteration is a sample (a round's mean would
dilute one slow iteration among a fast rank's many, and random slowdowns were recognised late).

**Classes** (README "sync='auto'"), over the samples of the last ``window`` seconds, every rank having at least
``min_samples``:

* m_r = the lower quartile of rank r's samples (the sample a quarter of the way up, no interpolation), or, while a
  straggler is in force, their median (see Hysteresis); *typical* = the median of all ranks' samples pooled (the
  usual iteration: the median of the ranks' medians let two ranks whose small windows held many slow samples by
  chance raise it, and the slow samples then fell below the random test's cut).  A rank without any sample in the
  window is left out when the job says it stopped training (the Job Clock: a time budget, EarlyStopping); one that
  has not stopped is in a step longer than the window, and nothing is decided until it reports again.  Likewise,
  until every rank has reported once, nothing is decided (a throttled host's ranks, tracing their first step at a
  fraction of a core, sent nothing for the first window, and a job of the fast ranks alone read as homogeneous and
  moved to allreduce at the slow host's pace).  Without word of stops (``stopped=None``) a silent rank is left out.
* **straggler**: some rank has m_r >= ``straggler_ratio`` x typical (1.5): it is slow in three iterations of four.
  (With the median, a rank whose window held slightly more than half slow samples by chance -- a quarter of steps 4x
  slow, on every rank, 25-30 samples a window -- read as a straggler now and then, and moved a job out of eager-SGD
  for a few steps, a switch each way; in 500 seeded simulated jobs of 30 s, 23 did, against none with the
  quartile.)  Or, with compute samples that look even, some rank's *step period* (its seconds between steps, from
  its own sample times) is >= ``straggler_ratio`` x the median period of the other ranks (of all ranks, it let a
  throttled host of two read as even: half the ranks slow put the median between the hosts), and so is its period
  less its mean compute sample, at the entry ratio even while a straggler is in force (a group mode's waits for
  partners' random slow steps lengthen periods by a third by chance, which the exit ratio read as a straggler), and,
  where run-delay is measured, its median run-delay rate is ``straggler_ratio`` x the other ranks' median.  A CPU
  quota freezes a slow node anywhere in its step, waits included, so its compute samples can look like everyone's
  while it takes a fraction of the others' steps -- runnable, not running; a rank that waits (for a P-Reduce
  partner, for answers from rank 0's coordinator) is blocked and accrues no run-delay: in a ripples-smart job with
  random slow device steps a fast rank's period came to 1.5x the others' that way, read as a straggler by the
  period alone, and the job left for eager-solo at step 88 instead of 32.  A period made long by slow compute
  samples alone is random slowness; in a lockstep mode every rank has the same period and the compute samples
  decide alone.  Periods are the mode in force's: from its samples since every rank came out of the last switch
  (``switched``).
* **random**: no straggler, but at least ``random_fraction`` (6%) of all samples are >= ``slow_sample_ratio`` x
  typical (2.5): slowdowns come and go, on any rank, and they leave the CPU alone (a GPU shared with another job,
  variable input lengths).  At least ``MIN_SLOW`` (8) slow samples are needed to call them random or throttled
  (fewer: undecided): in a CPU-quota job's first second two slow samples of twelve, neither starved, read as random.
* **throttled**: the same random slowdowns, but CPU-starved: in at least ``starved_share`` (30%) of the slow samples
  step's *run-delay rate* (seconds the rank's threads were runnable but not running -- CFS throttling by a CPU
  quota, other jobs on the node; hetsync/training/run_delay.py -- per second of the step) is at least 0.25 above the
  rank's usual rate (its median).  A sleep or a device wait adds none of its own; under a quota, polling threads
  accrue run-delay at a steady rate whatever the step does, hence "above the usual rate".  Measured with
  ``HETSYNC_LOG_LEVEL=DEBUG`` (one job each): 0-11% of the slow samples starved with random slow GPU steps
  (emulated, every rank at a 0.45-core quota), 50-59% with a random rank throttled to 0.09 of a core for 4 s in 8.
  Samples without run-delay (not measured) count for neither, and with none measured the slowdowns are "random", as
  the papers read them.
* **homogeneous**: none of these.

**Hysteresis**: the class in force (from the start, the class whose candidate auto started in) is left only when its
own test fails by a margin -- a straggler stays one while its *median* m_r >= ``straggler_exit`` x typical (1.25),
slow in half its iterations (with the quartile, a straggler that recovered left the class while a third of its
window was still slow, and those samples read as random slowdowns while they drained from the window; a long step
period takes ``straggler_ratio`` in any case; against random or throttled slowdowns only once a straggler was seen, see
Start), random or throttled slowdowns stay while the slow fraction >= ``random_exit`` (3%), and between random and
throttled the share of CPU-starved slow samples must rise 0.15 above ``starved_share`` to move from random to
throttled and fall 0.05 below it to move back (random slow device steps read 14% starved: a way back under 15% was a
coin toss, and a job that read throttled early, on a few slow samples, could hold ripples-smart for long; throttled
nodes read 50-59%) -- and a new class must be seen in every evaluation for ``settle`` seconds (2) before it is acted
on; switches are at least ``min_interval`` seconds apart (10).  Evaluations run at most every 0.25 s,
except that an undecided one (too few samples) is repeated at the next report: reports come in bursts, one per rank
every ``report_every`` steps, and the burst's last report is the one that completes the window; each change of the
class seen is logged (DEBUG, "hetsync.switching.auto", on rank 0) with its evidence.

**Modes** (``candidates``): homogeneous -> "allreduce" (nothing to hide, nothing beats Horovod), straggler ->
"ripples-smart" (the fast ranks P-Reduce among themselves while the slow one computes: the highest median speedup
against plain Horovod in both stored CPU-quota straggler scenarios, docs/benchmarks.md; "esync", the default
before, trained 1.2x and 2.1x longer than it there, medians of runs 1-3), random -> "eager-solo" (eager-SGD's solo
partial allreduce, the paper's answer: the fastest fixed mode with random slow GPU steps), throttled ->
"ripples-smart".  A CPU quota (a throttled or shared node) freezes a rank for part of every scheduler period, and
its compute samples then look like random slowdowns on every rank; "eager-solo" waits in each round for the
throttled ranks' progress threads, and at speeds 1:2:3:5 a run that switched to it trained 1.69x longer than
ripples-smart in the same repeat.  Each value is a mode name or ``(mode, options)``.

**Start** (``start``, a class, default "straggler"): auto trains in that class's candidate until the policy has
seen enough to decide.  Starting in the straggler mode loses nothing while the job is measured when one rank is
slow; the straggler class is then in force, so the job moves to allreduce once no rank's median iteration is
``straggler_exit`` x typical, nor its step period ``straggler_ratio`` x the other ranks', for ``settle`` seconds.
That exit test holds the class against random or throttled slowdowns only once a straggler has been seen by the
entry test in the mode in force (``straggler_seen``; kept when the policy itself moved into the straggler mode):
at the start nothing has been, and with random slow device steps some rank's median read 1.3x typical in small
windows by chance (or stayed there, a rank a little slower in every step), so the class seen went straggler,
random, straggler, random, each change restarting ``settle``, and one job switched at step 80 instead of 40.  In
seeded jobs (tests/test_auto_start.py) random slowdowns now move the job in 4.2 s at the median, against 5.9 s.
The former start, ``start="homogeneous"``, trains at Horovod's pace until a straggler is recognised.
"""
import logging
import statistics

from hetsync.algorithms.options import Option, check_all, defaults, did_you_mean

CLASSES = ("homogeneous", "straggler", "random", "throttled")
DEFAULT_CANDIDATES = {"homogeneous": "allreduce", "straggler": "ripples-smart", "random": "eager-solo",
                      "throttled": "ripples-smart"}
STARVED_RATE = 0.25      # run-delay per second above its rank's usual rate that makes a slow iteration CPU-starved
THROTTLED_ENTRY = 0.15   # starved_share + this: random -> throttled (hysteresis, see the module docstring)
THROTTLED_EXIT = 0.05    # starved_share - this: throttled -> random
SETTINGS = {
    "window": Option(10.0, "number", minimum=0, above=True, doc="seconds of samples the policy looks at"),
    "min_interval": Option(10.0, "number", minimum=0, doc="seconds between two switches"),
    "settle": Option(2.0, "number", minimum=0, doc="seconds a new class must be seen before it is acted on"),
    "min_samples": Option(5, "int", minimum=1, doc="samples every training rank needs in the window"),
    "straggler_ratio": Option(1.5, "number", minimum=1, doc="m_r / typical that makes rank r a straggler"),
    "straggler_exit": Option(1.25, "number", minimum=1, doc="m_r / typical below which a straggler is one no more"),
    "random_fraction": Option(0.06, "number", minimum=0, maximum=1, doc="share of slow samples that is random"),
    "random_exit": Option(0.03, "number", minimum=0, maximum=1, doc="share of slow samples below which it ends"),
    "slow_sample_ratio": Option(2.5, "number", minimum=1, doc="sample / typical that makes a sample slow"),
    "starved_share": Option(0.3, "number", minimum=0, maximum=1,
                            doc="share of CPU-starved slow samples that makes random slowdowns throttled"),
}
DEFAULTS = defaults(SETTINGS)
EVALUATE_EVERY_S = 0.25
MIN_SLOW = 8             # slow samples needed before slowdowns are called random or throttled
log = logging.getLogger("hetsync.switching.auto")


def _lower_quartile(xs):
    """The sample a quarter of the way up ``xs`` (no interpolation: with slow samples 4x the others, an interpolated
    quartile of a small window lands between the two and reads as 1.5x-2x)."""
    xs = sorted(xs)
    return xs[(len(xs) - 1) // 4]


def _others_median(values, rank):
    """The median of ``values`` (a dict by rank) over every rank but ``rank``: what the rest of the job does.  With
    the median of all ranks, a throttled host of two (two slow ranks of four) met a median halfway between the
    hosts' step periods, and a host 2.5x slower than the other read as 1.4x, under the cut."""
    return statistics.median(v for r, v in values.items() if r != rank)


def _frozen(rank, delays, ratio):
    """Whether a rank whose step period is long lost that time runnable but not running: its median run-delay rate
    ``ratio`` x the other ranks' median, and ``STARVED_RATE`` above it.  A CPU quota freezes it; a rank that waits
    -- for a P-Reduce partner, for an answer from rank 0's coordinator -- is blocked, not runnable, and accrues no
    more than its polling threads do.  Measured with random slow device steps (every rank at a 0.45-core quota):
    rates of 1.5-2.25 a second, rank 0's the highest (its coordinator's threads), 1.3x the others' median; across
    2 hosts, the throttled host's ranks 4.1-5.1 against 2.1.  Not measured (for it or for every other rank): the
    period alone decides, as before run-delay was read."""
    others = _others_rate(rank, delays)
    return others is None or (delays[rank] >= ratio * others and delays[rank] - others >= STARVED_RATE)


def _others_rate(rank, delays):
    """The other ranks' median run-delay rate, or None when it or theirs is not measured."""
    return _others_median(delays, rank) if rank in delays and len(delays) >= 2 else None


def _delay_text(rank, delays):
    others = _others_rate(rank, delays)
    return "" if others is None else f", run-delay rate {delays[rank]:.2f} vs the others' {others:.2f}"


def normalize_candidates(candidates):
    """{class: (mode, options dict)} from the user's mapping; ValueError names what is wrong."""
    merged = dict(DEFAULT_CANDIDATES)
    if candidates is not None:
        if not isinstance(candidates, dict):
            raise ValueError(f"candidates must be a dict {{class: mode}} with classes {CLASSES}, got {candidates!r}")
        unknown = sorted(set(candidates) - set(CLASSES))
        if unknown:
            raise ValueError(f"unknown class(es) {unknown} in candidates; valid: {', '.join(CLASSES)}")
        merged.update(candidates)
    out = {}
    for cls, value in merged.items():
        pair = isinstance(value, (tuple, list)) and len(value) == 2
        mode, options = (value, {}) if isinstance(value, str) else tuple(value) if pair else (None, None)
        if not isinstance(mode, str) or not isinstance(options, dict):
            raise ValueError(f"candidates[{cls!r}] must be a mode name or (mode, options dict), got {value!r}")
        out[cls] = (mode.replace("_", "-"), dict(options))  # "eager_solo" is "eager-solo" (algorithms.canonical)
    return out


class AutoPolicy:
    """Classifies the job and proposes the candidate mode of its class (see the module docstring)."""

    def __init__(self, size, candidates=None, **settings):
        unknown = sorted(set(settings) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown auto setting(s) {unknown}; valid: {', '.join(sorted(DEFAULTS))}"
                             f"{did_you_mean(unknown, DEFAULTS)}")
        self.size = int(size)
        self.candidates = normalize_candidates(candidates)
        self.s = check_all("sync='auto'", SETTINGS, settings)
        self.samples = [[] for _ in range(self.size)]   # per rank: (time, compute s, run-delay rate or None)
        self.reported = [False] * self.size  # ever: a rank that has not reported yet is starting, not idle
        self.state = None          # the class in force (from the first evaluation: the class of the mode in force)
        self.seen = None           # (class, since): the class every evaluation has returned since ``since``
        self.last_switch = None    # time of the last switch
        self.mode_since = None     # when the mode in force began on every rank: step periods are that mode's
        self.straggler_seen = False  # the straggler entry test passed in the mode in force (see Start)
        self.last_evaluation = None
        self.last = None           # (class, evidence) of the last evaluation, for reports

    def add(self, rank, t, compute_s, run_delay=None):
        """One iteration of ``rank`` at ``t``: its compute and its step's run-delay rate (None: not measured)."""
        if 0 <= rank < self.size and compute_s >= 0:
            rate = float(run_delay) if run_delay is not None and run_delay >= 0 else None
            self.samples[rank].append((float(t), float(compute_s), rate))
            self.reported[rank] = True

    def _trim(self, now):
        horizon = now - self.s["window"]
        for rank, xs in enumerate(self.samples):
            if xs and xs[0][0] < horizon:
                self.samples[rank] = [p for p in xs if p[0] >= horizon]

    def classify(self, now, stopped=None):
        """(class or None, evidence text) from the samples of the last window; ``stopped``: the ranks the job says
        stopped training (None: not known)."""
        starting = [r for r, seen in enumerate(self.reported) if not seen]
        if starting:  # its first steps (tracing, a throttled node's start) are still to come: nothing to compare
            return None, f"no samples yet from rank(s) {starting}"
        self._trim(now)
        counts = [len(xs) for xs in self.samples]
        silent = [r for r, n in enumerate(counts) if n == 0]
        in_step = [r for r in silent if stopped is not None and r not in stopped]
        if in_step:  # a step longer than the window: the fast ranks alone must not decide
            return None, f"rank(s) {in_step} took no step in the last {self.s['window']:g} s and have not stopped"
        # A rank with no sample in the window that stopped training (or, not knowing, any) is left out.  Every
        # other rank needs min_samples, so a slow rank is waited for, not missed.
        active = [r for r, n in enumerate(counts) if n > 0]
        if len(active) < 2 or min(counts[r] for r in active) < self.s["min_samples"]:
            return None, f"too few samples (per rank {counts}, need {self.s['min_samples']})"
        computes = {r: [c for _, c, _ in self.samples[r]] for r in active}  # each rank's, read once
        pooled = [c for cs in computes.values() for c in cs]
        typical = statistics.median(pooled)  # of all samples, not of the m_r: see the module docstring
        if typical <= 0:
            return None, "no compute time measured"
        quartiles = {r: _lower_quartile(cs) for r, cs in computes.items()}
        periods, away = self._periods(active)
        rates = self._delay_rates(active)
        entered = self._straggler_entry(quartiles, typical, periods, away, rates)
        if entered:
            self.straggler_seen = True
            return "straggler", entered
        held = self._straggler_held(computes, typical) if self.state == "straggler" else None
        if held and self.straggler_seen:
            return "straggler", held
        cls, detail = self._slowdowns(active, counts, quartiles, pooled, typical, periods, rates)
        if held and cls not in ("random", "throttled"):  # a straggler in force by the start only: see Start
            return "straggler", held
        return cls, detail

    def _straggler_entry(self, quartiles, typical, periods, away, delays):
        """The evidence that some rank is a straggler by the entry test (its lower-quartile iteration, or its step
        period, its time outside compute and -- where measured -- its run-delay rate ``straggler_ratio`` x the others':
        frozen, not waiting), or None."""
        cut = self.s["straggler_ratio"]
        slow = [r for r, m in quartiles.items() if m >= cut * typical]
        if slow:
            parts = ", ".join(f"rank {r} {quartiles[r] * 1e3:.1f} ms ({quartiles[r] / typical:.1f}x)" for r in slow)
            return f"lower-quartile iteration {parts} vs typical {typical * 1e3:.1f} ms"
        if not periods:
            return None
        usual = {r: _others_median(periods, r) for r in periods}
        slow = [r for r, p in periods.items()
                if usual[r] > 0 and p >= cut * usual[r] and away[r] >= cut * max(_others_median(away, r), 0.0)
                and _frozen(r, delays, cut)]
        if not slow:
            return None
        parts = ", ".join(f"rank {r} {periods[r] * 1e3:.1f} ms ({periods[r] / usual[r]:.1f}x the others' "
                          f"{usual[r] * 1e3:.1f} ms{_delay_text(r, delays)})" for r in slow)
        return f"step period {parts}"

    def _straggler_held(self, computes, typical):
        """The evidence that a straggler in force still is one by the exit test (its median iteration
        ``straggler_exit`` x typical), or None."""
        medians = {r: statistics.median(cs) for r, cs in computes.items()}
        slow = [r for r, m in medians.items() if m >= self.s["straggler_exit"] * typical]
        if not slow:
            return None
        parts = ", ".join(f"rank {r} {medians[r] * 1e3:.1f} ms ({medians[r] / typical:.1f}x)" for r in slow)
        return f"median iteration {parts} vs typical {typical * 1e3:.1f} ms"

    def _slowdowns(self, active, counts, quartiles, pooled, typical, periods, rates):
        """No straggler: "random", "throttled" or "homogeneous" from the share of slow samples (None: too few slow
        samples to tell random from throttled), with the evidence."""
        threshold = self.s["slow_sample_ratio"] * typical
        slow_n = sum(c >= threshold for c in pooled)
        fraction = slow_n / len(pooled)
        needed = self.s["random_exit"] if self.state in ("random", "throttled") else self.s["random_fraction"]
        periods_ms = {r: round(p * 1e3) for r, p in periods.items()}
        detail = (f"{fraction:.0%} of {len(pooled)} iterations >= {self.s['slow_sample_ratio']:g}x typical "
                  f"{typical * 1e3:.1f} ms; slowest rank {max(quartiles.values()) / typical:.2f}x; samples per rank "
                  f"{counts}; step periods (ms, by rank) {periods_ms}")
        if rates:
            detail += f"; run-delay rates (by rank) { {r: round(d, 2) for r, d in rates.items()} }"
        if fraction < needed:
            return "homogeneous", detail
        if slow_n < MIN_SLOW:
            return None, f"{detail}; too few slow iterations to tell random from throttled ({slow_n}, need {MIN_SLOW})"
        return self._starved_or_not(active, threshold, detail)

    def _starved_or_not(self, active, threshold, detail):
        """Random slowdowns: "throttled" when most slow iterations lost their time waiting for a CPU, else "random".

        A slow iteration is CPU-starved when its step's run-delay rate (run-delay seconds, summed over threads, per
        second of the step) is at least ``STARVED_RATE`` above its rank's usual rate (the median over its samples).
        The usual rate is not zero under a CPU quota: polling threads (Horovod's background loop, the engine's
        progress thread) are runnable whenever the quota runs out, at every step, and a rank that sleeps through a
        slow device step accrues their run-delay at that same rate.  A throttled step accrues it faster.  Samples
        without run-delay count for neither; with none measured the slowdowns are "random", the papers' reading."""
        starved, known = 0, 0
        for r in active:
            rates = [(c, d) for _, c, d in self.samples[r] if d is not None]
            if not rates:
                continue
            usual = statistics.median(d for _, d in rates)
            slow = [d for c, d in rates if c >= threshold]
            known += len(slow)
            starved += sum(d - usual >= STARVED_RATE for d in slow)
        if not known:
            return "random", detail + "; run-delay not measured"
        share = starved / known
        margin = {"random": THROTTLED_ENTRY, "throttled": -THROTTLED_EXIT}.get(self.state, 0.0)
        cut = min(max(self.s["starved_share"] + margin, 0.0), 1.0)
        detail += f"; {share:.0%} of {known} slow iterations CPU-starved (run-delay rate above the rank's usual)"
        return ("throttled" if share >= cut else "random"), detail

    def _delay_rates(self, active):
        """{rank: the median run-delay rate of its samples in the window}, for the ranks whose run-delay is
        measured."""
        rates = {}
        for r in active:
            measured = [d for _, _, d in self.samples[r] if d is not None]
            if measured:
                rates[r] = statistics.median(measured)
        return rates

    def _periods(self, active):
        """({rank: seconds between its steps}, {rank: that less its mean compute sample}) over the window's samples
        of the mode in force, from each rank's own sample times (differences of one rank's clock, never compared
        across ranks).  In a mode whose ranks step at their own pace this is the rank's whole speed: a CPU quota
        freezes a slow node anywhere in its step, also while it waits, so its compute samples may look normal while
        it takes fewer steps.  Lockstep modes give every rank the same period, and leave the decision to the compute
        samples.

        ``classify`` also asks that the rank's time per step *outside* its compute (the second dict, over the same
        samples) be ``ratio`` x the usual: a period made long by its own slow compute samples is random slowness, not
        a frozen node.  At a random quarter of steps 4x slow, ranks stepping at their own pace differ by chance in
        how many slow steps a window holds, and their periods by up to a third: with the period alone such a job
        read as a straggler long after the compute samples had shown random slowdowns."""
        periods, away = {}, {}
        since = self.mode_since if self.mode_since is not None else float("-inf")
        for r in active:
            own = [(t, c) for t, c, _ in self.samples[r] if t >= since]  # the mode in force's (see switched)
            if len(own) >= self.s["min_samples"] and own[-1][0] > own[0][0]:
                periods[r] = (own[-1][0] - own[0][0]) / (len(own) - 1)
                ends = [c for _, c in own[1:]]  # the steps those intervals end (a list: fmean counts a generator
                away[r] = periods[r] - statistics.fmean(ends)  # item by item, a third of the policy's time)
        return (periods, away) if len(periods) >= 2 else ({}, {})

    def evaluate(self, now, current_mode, stopped=None):
        """None, or (mode, options, evidence) to switch to; ``stopped``: as for :meth:`classify`."""
        recent = self.last_evaluation is not None and now - self.last_evaluation < EVALUATE_EVERY_S
        if recent and self.last is not None and self.last[0] is not None:
            return None
        self.last_evaluation = now
        if self.state is None:  # the class whose mode auto started in is the class in force: its hysteresis holds
            self.state = self._class_of(current_mode)
        cls, evidence = self.classify(now, stopped)
        if self.last is None or self.last[0] != cls:  # what the policy sees, as it changes (HETSYNC_LOG_LEVEL=DEBUG)
            log.debug("auto: class %s in %s (in force: %s): %s", cls, current_mode, self.state, evidence)
        self.last = (cls, evidence)
        if cls is None:
            self.seen = None
            return None
        if self.seen is None or self.seen[0] != cls:
            self.seen = (cls, now)
        if now - self.seen[1] < self.s["settle"]:
            return None
        mode, options = self.candidates[cls]
        if mode == current_mode:
            self.state = cls
            return None
        if self.last_switch is not None and now - self.last_switch < self.s["min_interval"]:
            return None
        self.state = cls
        return mode, options, f"{cls}: {evidence}"

    def _class_of(self, mode):
        """The first class whose candidate is ``mode`` (None: a mode of no class, such as a user's request)."""
        return next((cls for cls, (m, _) in self.candidates.items() if m == mode), None)

    def switched(self, mode, t, done=None):
        """The board carried out a switch (by the policy or a user) decided at time ``t``; every rank had come out of
        it by ``done`` (None: ``t``).  Step periods are read from the new mode's samples only: across the switch a
        rank's samples span the switch's pause, its new step's trace and its warm-up steps (seconds without a
        sample), and a rank with few samples in the window then read as one whose steps take twice the others'
        (ripples-smart -> eager-solo -> ripples-smart within 25 steps, random slow device steps); and an own-pace
        mode's periods say nothing about a lockstep one's."""
        self.last_switch = t
        self.mode_since = t if done is None else done
        self.state = self._class_of(mode) or self.state
        # kept into the straggler class: the entry test passed since the last switch (the policy's own evidence)
        self.straggler_seen = self.straggler_seen and self.state == "straggler"
