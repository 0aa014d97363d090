#!/usr/bin/env python3
"""The published latency study's findings (../shared/docs/SEEDS.md §3, issue #38), checked
against the results of examples/latency.yaml (paired windows or paired runs):

  1. writes slow down more than reads (9.4% vs 3.3%), write-intensive personalities more than
     the read-intensive one;
  2. per flowop: writefile highest (~13%), append/create/delete 4.8-8.9%, open/close unaffected;
  3. the fio read:write sweep: more writes, more slowdown;
  4. ext4 ordered more sensitive than writeback (jbd2 commit +53.2%, the wait between data
     submission and the metadata write +51% mean / +239% p95), and the ext4 tuples;
  5. bursts hurt more than random at the same ratio, more so at 20%;
  6. the block layer's queue time rises and falls with each burst.

Before the findings, what decides whether a 10 us effect can be seen at all, from the same
results: device requests per run (the monitor's block layer), the realized share of slowed
requests, the requests that waited behind a held delay, and how late the simulated device
answered against its own schedule (the delay precision of the run).

Reads each directory's results.json: `slowdown` rows (mean latency, 95% t intervals over the
pairs, docs/results.md), per repetition `latency_model`, `rules`, `monitor`.

  python3 bench/latency-findings.py RESULTS_DIR [RESULTS_DIR...]
"""
import json
import math
import re
import statistics
import sys
from collections import defaultdict

WRITE_FLOWOPS = ("writewholefile", "appendfilerand", "createfile", "deletefile", "fsync")
READ_FLOWOPS = ("readwholefile",)
META_FLOWOPS = ("openfile", "closefile", "statfile")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000}


def t975(df):
    if df <= 0:
        return float("nan")
    k = max(k for k in T975 if k <= df)
    return T975[k] if df < 120 else 1.96


def pct(v):
    return "nan" if v is None or math.isnan(v) else f"{v * 100:+.1f}%"


def ci(values):
    """Mean of per-setup slowdowns with a 95% t interval across the setups."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    m = statistics.mean(values)
    if n < 2:
        return m, float("nan"), float("nan"), n
    h = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return m, m - h, m + h, n


def show(values):
    m, lo, hi, n = ci(values)
    return f"{pct(m)} [{pct(lo)}, {pct(hi)}] (n={n})"


def row_text(x):
    return f"{pct(x['slowdown'])} [{pct(x['ci_low'])}, {pct(x['ci_high'])}]"


class Setup:
    def __init__(self, s):
        self.name = s["name"]
        self.axes = dict(s.get("axes", []))
        ax = self.axes
        self.personality = ax.get("workload") or ax.get("tuple-workload")
        self.fs = ax.get("fs") or ax.get("fio-fs")
        self.pattern = ax.get("pattern") or ax.get("tuple-pattern") or ax.get("fio-pattern")
        self.rw = ax.get("rw")
        self.tuple = tuple(ax[k] for k in ("block", "inode", "journal") if k in ax) or None
        self.rows = {(x["source"], x["op"], x["metric"]): x for x in s.get("slowdown", [])}
        self.reps = s.get("repetitions", [])

    def mean(self, source, op):
        return self.rows.get((source, op, "mean_us"))

    def device_requests(self):
        out = []
        for r in self.reps:
            m = r.get("monitor") or {}
            out.append(sum(l["count"] for d in m.get("devices", []) for l in d.get("layers", []) if l["layer"] == "block_service"))
        return out

    def model(self):
        """(reply lateness p50, p99, held, waited) of the first disk's model, per repetition."""
        out = []
        for r in self.reps:
            for lm in r.get("latency_model") or []:
                late = lm.get("reply_lateness") or {}
                held = lm.get("held") or {}
                out.append((late.get("p50_us"), late.get("p99_us"), held.get("held", 0), held.get("waited", 0)))
        return out

    def realized(self):
        out = []
        for r in self.reps:
            for rule in r.get("rules") or []:
                if rule.get("realized_ratio") is not None:
                    out.append(rule["realized_ratio"])
        return out

    def queue_swing(self, op="write"):
        """Standard deviation and mean of the block layer's per-interval queue time (µs)."""
        for r in self.reps:
            m = r.get("monitor") or {}
            for d in m.get("devices", []):
                v = [iv["ops"][op]["queue_mean_us"] for iv in d.get("series", []) if op in iv.get("ops", {}) and iv["ops"][op]["count"] > 0]
                if len(v) >= 2:
                    return statistics.stdev(v), statistics.mean(v)
        return None


def load(dirs):
    out = []
    for d in dirs:
        r = json.load(open(f"{d.rstrip('/')}/results.json"))
        out += [Setup(s) for s in r["setups"]]
    return out


def main():
    setups = load(sys.argv[1:])
    if not any(s.rows for s in setups):
        sys.exit("no slowdown rows: give results directories of a `baseline: windows` or `baseline: true` run")
    mean_rows = [x for s in setups for k, x in s.rows.items() if k[2] == "mean_us"]
    sig_up = sum(1 for x in mean_rows if x["distinguishable"] and x["slowdown"] > 0)
    sig_down = sum(1 for x in mean_rows if x["distinguishable"] and x["slowdown"] < 0)
    pairs = sorted({x["pairs"] for x in mean_rows})
    print(f"{len(setups)} setups; {len(mean_rows)} (setup, source, op) mean-latency slowdowns from {pairs} pairs each;")
    print(f"  95% interval above 0 in {sig_up}, below 0 in {sig_down}")
    widths = [x["ci_high"] - x["ci_low"] for x in mean_rows if x["ci_high"] is not None and not math.isnan(x["ci_high"])]
    if widths:
        print(f"  interval width: median {pct(statistics.median(widths))} (the smallest {pct(min(widths))})")

    print("\n0. what the runs could resolve")
    req = [n for s in setups for n in s.device_requests()]
    if req:
        print(f"  device requests per run: min {min(req)}, median {int(statistics.median(req))}, max {max(req)}; {sum(1 for n in req if n >= 100000)} of {len(req)} runs >= 100,000")
    mod = [m for s in setups for m in s.model()]
    if mod:
        p50 = [m[0] for m in mod if m[0] is not None]
        p99 = [m[1] for m in mod if m[1] is not None]
        print(f"  simulated device's reply lateness against its schedule: p50 median {statistics.median(p50):.0f} us (range {min(p50)}-{max(p50)}), p99 median {statistics.median(p99):.0f} us")
        print(f"  held delays {sum(m[2] for m in mod)}, requests that waited behind one {sum(m[3] for m in mod)}")
    real = [v for s in setups for v in s.realized()]
    if real:
        print(f"  realized share of slowed requests: {min(real) * 100:.1f}-{max(real) * 100:.1f}% (rules over all patterns)")

    pers = [s for s in setups if s.personality and s.fs and s.pattern and not s.tuple]

    print("\n1. writes vs reads (mean-latency slowdown; mean over setups, 95% t interval across setups)")
    w = [s.mean("workload", "write")["slowdown"] for s in pers if s.mean("workload", "write")]
    r = [s.mean("workload", "read")["slowdown"] for s in pers if s.mean("workload", "read")]
    print(f"  write syscalls {show(w)}; read syscalls {show(r)}   (published 9.4% vs 3.3%)")
    both = [(s.mean("workload", "write")["slowdown"], s.mean("workload", "read")["slowdown"]) for s in pers if s.mean("workload", "write") and s.mean("workload", "read")]
    print(f"  write > read in {sum(1 for a, b in both if a > b)} of {len(both)} setups")
    for p in sorted({s.personality for s in pers}):
        ops = [x["slowdown"] for s in pers if s.personality == p for k, x in s.rows.items() if k[0] == "flowop" and k[2] == "mean_us"]
        print(f"  {p:11} all flowops {show(ops)}")

    print("\n2. per flowop (random 10%, the published default; over file systems and personalities)")
    by = defaultdict(list)
    for s in pers:
        if s.pattern != "random-10":
            continue
        for (src, op, met), x in s.rows.items():
            if src == "flowop" and met == "mean_us":
                by[op].append(x)
    for op in sorted(by):
        v = [x["slowdown"] for x in by[op]]
        up = sum(1 for x in by[op] if x["distinguishable"] and x["slowdown"] > 0)
        down = sum(1 for x in by[op] if x["distinguishable"] and x["slowdown"] < 0)
        kind = "write" if op in WRITE_FLOWOPS else "read" if op in READ_FLOWOPS else "metadata"
        print(f"  {op:15} {kind:8} {show(v)}; interval above 0 in {up}, below in {down}")

    print("\n3. the fio read:write sweep (ext4, random 10%)")
    def read_share(s):
        m = re.search(r"r(\d+)", s.rw)
        return int(m.group(1)) if m else s.rw

    for s in sorted((s for s in setups if s.rw), key=read_share):
        cells = [f"{op} {row_text(s.mean('workload', op))}" for op in ("read", "write") if s.mean("workload", op)]
        print(f"  {s.rw:12} " + "; ".join(cells))

    print("\n4. ext4 ordered vs writeback (same personality and pattern)")
    idx = {(s.personality, s.fs, s.pattern): s for s in pers}
    diffs = []
    for (p, f, pat), s in idx.items():
        o = idx.get((p, "ext4-writeback", pat))
        if f == "ext4" and o:
            for k, x in s.rows.items():
                if k[2] == "mean_us" and k[0] in ("workload", "flowop") and k in o.rows:
                    diffs.append(x["slowdown"] - o.rows[k]["slowdown"])
    if diffs:
        print(f"  ordered - writeback: {show(diffs)}; ordered worse in {sum(1 for d in diffs if d > 0)} of {len(diffs)}")
    for fs in ("ext4", "ext4-writeback", "ext4-journal", "xfs", "btrfs"):
        v = [x["slowdown"] for s in pers if s.fs == fs for k, x in s.rows.items() if k[2] == "mean_us" and k[0] in ("workload", "flowop")]
        if v:
            print(f"  {fs:15} all ops {show(v)}")
    jr = defaultdict(list)
    for s in pers:
        for (src, op, met), x in s.rows.items():
            if src == "journal" and met in ("mean_us", "p95_us"):
                jr[(s.fs, op, met)].append(x["slowdown"])
    if jr:
        print("  the journal layer (monitor):")
        for (fs, op, met), v in sorted(jr.items()):
            print(f"    {fs:15} {op:18} {met:7} {show(v)}")
    else:
        print("  the journal layer: no per-layer rows in these results")
    tup = [s for s in setups if s.tuple]
    if tup:
        print("  ext4 tuples (fileserver, random 10%): block inode journal -> write, read")
        for s in sorted(tup, key=lambda s: s.tuple):
            cells = [row_text(s.mean("workload", op)) if s.mean("workload", op) else "-" for op in ("write", "read")]
            print(f"    {' '.join(s.tuple):22} {cells[0]:28} {cells[1]}")

    print("\n5. burst vs random at the same ratio (same personality, file system, op)")
    for ratio in ("10", "20"):
        d = []
        for (p, f, pat), s in idx.items():
            o = idx.get((p, f, f"random-{ratio}"))
            if pat == f"burst-{ratio}" and o:
                for k, x in s.rows.items():
                    if k[2] == "mean_us" and k[0] in ("workload", "flowop") and k in o.rows:
                        d.append(x["slowdown"] - o.rows[k]["slowdown"])
        if d:
            print(f"  {ratio}%: burst - random {show(d)}; burst worse in {sum(1 for v in d if v > 0)} of {len(d)}")
    for pat in ("random-10", "random-20", "burst-1", "burst-10", "burst-20", "interval-10", "interval-20"):
        v = [x["slowdown"] for s in pers if s.pattern == pat for k, x in s.rows.items() if k[2] == "mean_us" and k[0] in ("workload", "flowop")]
        if v:
            print(f"  {pat:12} all ops {show(v)}")

    print("\n6. the block layer's queue time over the run (write requests, per monitor interval)")
    for pat in ("random-10", "random-20", "burst-1", "burst-10", "burst-20", "interval-10", "interval-20"):
        sw = [s.queue_swing() for s in pers if s.pattern == pat]
        sw = [x for x in sw if x]
        if sw:
            print(f"  {pat:12} per-interval sd {statistics.median([a for a, _ in sw]):8.1f} us around a mean of {statistics.median([b for _, b in sw]):8.1f} us (medians over {len(sw)} setups)")


if __name__ == "__main__":
    main()
