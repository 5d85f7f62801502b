"""Seeded jobs for sync="auto"'s policy (auto_policy.AutoPolicy) alone: ranks stepping at their own pace with random
slow device steps, reported in bursts as the Switch Board gets them.  Used by test_auto_after_switch.py and
test_auto_start.py."""
from hetsync.training.step_clock import WARMUP_STEPS

EVERY = 8  # sync="auto"'s report cadence


def rank_steps(rng, until, switch_at=None, resume=None, slower=1.0, slow_share=0.25):
    """One rank's steps as (end time, compute s or None: a warm-up step, whose sample is dropped): a device step of
    64 ms x ``slower``, 4x that at a random ``slow_share`` of steps (a coin per step), after a 30 ms exchange.
    Before ``switch_at`` (ripples-smart, where auto starts) each step also waits for a partner's device step, as a
    P-Reduce group waits for its slowest member; the switch resumes every rank at ``resume`` in eager-solo, whose
    first steps give no sample.  ``switch_at=None``: the whole job in ripples-smart."""
    def device():
        return 0.064 * slower * (4 if rng.random() < slow_share else 1) * rng.uniform(0.95, 1.05)

    switch_at = float("inf") if switch_at is None else switch_at
    out, t, after = [], 0.0, 0
    while t <= until:
        compute = device()
        before = t < switch_at
        t += 0.03 * rng.uniform(0.9, 1.1) + (max(compute, device()) if before else compute)
        if before and t >= switch_at:  # this rank's last step before the switch: it resumes with everyone
            t = resume
            continue
        if not before:
            after += 1
        out.append((t, None if 0 < after <= WARMUP_STEPS else compute))
    return out


def reported(n, steps_of):
    """Every rank's steps (``steps_of(r)``), in time order, as the Switch Board hears them: yields (time, rank,
    [(sample time, compute s), ...]) at each rank's report, every ``EVERY`` steps, with the samples since its last."""
    events = sorted((t, r, c) for r in range(n) for t, c in steps_of(r))
    pending, positions = [[] for _ in range(n)], [0] * n
    for t, r, compute in events:
        if compute is not None:
            pending[r].append((t, compute))
        positions[r] += 1
        if positions[r] % EVERY == 0:
            yield t, r, pending[r]
            pending[r] = []
