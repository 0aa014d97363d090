"""Shared by the bench scripts' Python summaries (imported with bench/ on sys.path): the
throughput of time windows inside one fio run, and a bootstrap interval for a median."""
import collections
import random
import statistics


def fio_slots(path):
    """fio's IOPS log ("epoch ms, IOPS over the 100 ms ending there, ..." per job thread, with
    --log_avg_msec=100 --log_unix_epoch=1; the logs of several threads may be concatenated):
    summed IOPS per stamp."""
    slots = collections.Counter()
    for line in open(path):
        f = line.split(",")
        if len(f) >= 2:
            slots[int(f[0])] += float(f[1])
    return slots


def window_iops(slots, t0, t1):
    """Mean IOPS over the 100 ms slots lying wholly inside the window [t0, t1] (epoch seconds);
    None when no slot does."""
    lo, hi = t0 * 1000 + 100, t1 * 1000
    inside = [v for t, v in slots.items() if lo <= t <= hi]
    return sum(inside) / len(inside) if inside else None


_rng = random.Random(7)


def interval(x, n=2000):
    """Bootstrap 90% interval of the median of x (how well the rounds pin it down)."""
    meds = sorted(statistics.median(_rng.choices(x, k=len(x))) for _ in range(n))
    return meds[n // 20], meds[n - 1 - n // 20]
