"""``sync="balanced"``'s plan: how many samples of the global batch each worker computes per update.

Pure arithmetic (no TensorFlow, no MPI): every rank calls :func:`plan` with the same inputs -- the sums of one
Horovod allreduce -- and so takes the same decision (tests/test_balanced_plan.py checks it with hypothesis).

The global batch is Horovod's: ``sum_r B_r`` samples per update (``B_r`` = rank r's batch size, times
``backward_passes_per_step``).  Rank r's share is proportional to its measured throughput (samples per second of
compute at its current share), within ``[min_share, max_share]`` x ``B_r`` and at least one sample.  Throughput at
the current share, not a per-sample cost, so a fixed per-step overhead is balanced too: the plan's fixed point is the
one where every rank's compute time per update is the same.  (A rank whose share fell to a few samples, its time
mostly that overhead, looks slower than it is: when it speeds up again its share grows by a factor per plan, not at
once.)  A new plan is adopted only when some rank's share moves
by more than ``hysteresis`` (relative), or when the set of ranks that train changed (a rank stopped).
"""
import math


def bounds(batch, min_share, max_share):
    """(fewest, most) samples a rank with batch size ``batch`` may take per update."""
    return max(1, math.ceil(min_share * batch - 1e-9)), max(1, math.floor(max_share * batch + 1e-9))


def ideal(batches, rates, active, min_share, max_share):
    """Real-valued shares (samples per update) proportional to ``rates`` among ``active`` ranks, summing to
    ``sum(batches)`` where the bounds allow (water-filling: a rank past a bound is fixed there and the rest is
    shared again).  Inactive ranks get 0."""
    total = float(sum(batches))
    limits = [bounds(b, min_share, max_share) for b in batches]
    fixed = {}
    free = [r for r, a in enumerate(active) if a]
    while free:
        left = total - sum(fixed.values())
        weight = sum(rates[r] for r in free)
        share = {r: left * rates[r] / weight for r in free}
        low = [r for r in free if share[r] < limits[r][0]]
        high = [r for r in free if share[r] > limits[r][1]]
        if not low and not high:
            break
        # fix the side that is further out of bounds first: fixing both at once could overshoot the total
        if sum(limits[r][0] - share[r] for r in low) >= sum(share[r] - limits[r][1] for r in high):
            fixed.update({r: float(limits[r][0]) for r in low})
        else:
            fixed.update({r: float(limits[r][1]) for r in high})
        free = [r for r in free if r not in fixed]
    else:
        share = {}
    out = [0.0] * len(batches)
    for r, v in {**share, **fixed}.items():
        out[r] = v
    return out


def integer_shares(real, batches, min_share, max_share, active):
    """Whole samples: floors, then the remainder to the largest fractions (ties: lower rank), within the bounds."""
    limits = [bounds(b, min_share, max_share) for b in batches]
    target = round(sum(real))
    out = [min(max(math.floor(v), limits[r][0]), limits[r][1]) if active[r] else 0 for r, v in enumerate(real)]
    order = sorted((r for r in range(len(real)) if active[r]), key=lambda r: (-(real[r] - math.floor(real[r])), r))
    while sum(out) != target:
        step = 1 if sum(out) < target else -1
        movable = [r for r in (order if step > 0 else reversed(order))
                   if (out[r] < limits[r][1] if step > 0 else out[r] > limits[r][0])]
        if not movable:
            break  # the bounds do not allow the global batch (e.g. max_share=1 with a rank stopped)
        for r in movable[:abs(target - sum(out))]:
            out[r] += step
    return out


def plan(batches, rates, active, current, min_share, max_share, hysteresis):
    """The samples each rank computes per update from now on (a list of ints, one per rank).

    Args:
      batches: each rank's Horovod share of the global batch (its batch size x backward_passes_per_step).
      rates: each rank's measured samples per second of compute (0: not measured yet).
      active: whether each rank trains (a stopped rank takes nothing; its share goes to the others).
      current: the plan in force.
      min_share, max_share, hysteresis: the mode's options.
    """
    active = [bool(a) for a in active]
    if not any(active):
        return list(current)
    changed_set = any(a != (c > 0) for a, c in zip(active, current))
    if any(a and r <= 0 for a, r in zip(active, rates)):  # someone not measured yet: keep the plan in force, or
        if not changed_set:                                  # share by batch size when the set of ranks changed
            return list(current)
        rates = [b if a else 0.0 for a, b in zip(active, batches)]
    real = ideal(batches, rates, active, min_share, max_share)
    new = integer_shares(real, batches, min_share, max_share, active)
    if changed_set:
        return new
    moved = max(abs(n - c) / max(c, 1) for n, c in zip(new, current))
    return new if moved > hysteresis else list(current)
