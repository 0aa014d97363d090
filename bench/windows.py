"""Shared by the bench scripts' Python summaries (imported with bench/ on sys.path): the
throughput of time windows inside one fio run, the windows of runs taking turns, and a bootstrap
interval for a median."""
import collections
import os
import random
import statistics
import sys


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


def turns(path, slots, where=""):
    """The windows `take_turns` wrote (bench/lib.sh: lines "round name t0 t1 cpu_ns") read
    against each name's 100 ms IOPS slots (`slots[name]`): {round: {name: (IOPS, CPU ns per
    I/O)}}. Exits naming the window when a log has no slot inside it, or the candidate when it
    completed nothing in a window (a ratio against it would divide by zero)."""
    w = collections.defaultdict(dict)
    for line in open(path):
        r, n, t0, t1, cpu = line.split()
        t0, t1 = float(t0), float(t1)
        iops = window_iops(slots[n], t0, t1)
        if iops is None:
            sys.exit(f"{where}no IOPS samples inside round {r}'s window of {n}: is its log empty?")
        if iops == 0:
            sys.exit(f"{where}{n} completed no I/O in round {r}'s window ({t1 - t0:.2f} s): hung or stalled?")
        w[r][n] = (iops, int(cpu) / (iops * (t1 - t0)))
    return w


def fio_turns(d, where=""):
    """`turns` of the folder `fio_turns` (bench/lib.sh) filled: DIR/windows and DIR/iops.NAME."""
    path = os.path.join(d, "windows")
    names = {line.split()[1] for line in open(path)}
    return turns(path, {n: fio_slots(os.path.join(d, f"iops.{n}")) for n in names}, where)


_rng = random.Random(7)


def interval(x, n=2000):
    """Bootstrap 90% interval of the median of x (how well the rounds pin it down)."""
    meds = sorted(statistics.median(_rng.choices(x, k=len(x))) for _ in range(n))
    return meds[n // 20], meds[n - 1 - n // 20]


def placement(windows_path):
    """The host placement `take_turns` recorded beside its windows (FILE.xcpu: "round ns", the
    cross-CPU cache-line round trip before the round): {round: ns}, {} where not recorded."""
    p = windows_path + ".xcpu"
    if not os.path.exists(p):
        return {}
    out = {}
    for line in open(p):
        f = line.split()
        if len(f) == 2 and f[1].isdigit():
            out[f[0]] = int(f[1])
    return out


def split_rounds(ns):
    """Rounds whose CPUs shared a cache and rounds whose CPUs did not, from `placement`: (near,
    far) lists of rounds. Far is a round trip above XCPU_FAR_NS (default 200: the VMs here
    read 50-90 ns near and 320-400 ns far; a relative cut fails on a run that is all far)."""
    cut = int(os.environ.get("XCPU_FAR_NS", "200"))
    return [r for r, v in ns.items() if v <= cut], [r for r, v in ns.items() if v > cut]
