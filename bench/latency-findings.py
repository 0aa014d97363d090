#!/usr/bin/env python3
"""The published latency study's three findings, checked against the results of
examples/latency.yaml (one or more results directories, e.g. one per personality):

  1. writes slow down more than reads;
  2. burst hurts more than random at the same ratio (more so at 20%);
  3. ext4 ordered journaling is more sensitive than writeback.

Reads each directory's results.json and its `slowdown` rows (mean latency, paired t
intervals, docs/results.md) and prints the comparisons with their numbers.

  python3 bench/latency-findings.py results/latency-*/
"""
import json
import statistics
import sys
from collections import defaultdict

WRITE_FLOWOPS = {"writewholefile", "appendfilerand", "fsync", "createfile"}
READ_FLOWOPS = {"readwholefile"}


def load(dirs):
    rows = []  # (personality, fs, pattern, source, op, metric, row)
    for d in dirs:
        r = json.load(open(f"{d.rstrip('/')}/results.json"))
        for s in r["setups"]:
            axes = dict(s.get("axes", []))
            for x in s.get("slowdown", []):
                rows.append((axes.get("personality"), axes.get("fs"), axes.get("pattern"), x["source"], x["op"], x["metric"], x))
    return rows


def pct(v):
    return f"{v * 100:+.1f}%"


def main():
    rows = load(sys.argv[1:])
    if not rows:
        sys.exit("no slowdown rows: give results directories of a `baseline: true` run")
    mean = [r for r in rows if r[5] == "mean_us"]
    setups = {(p, f, pat) for p, f, pat, *_ in rows}
    sig = sum(1 for r in mean if r[6]["distinguishable"])
    print(f"{len(setups)} setups, {len(mean)} (setup, op) mean-latency slowdowns, {sig} distinguishable from zero")

    print("\n1. writes vs reads (mean-latency slowdown, mean over setups)")
    by_op = defaultdict(list)
    for p, f, pat, src, op, _, x in mean:
        by_op[(src, op)].append(x["slowdown"])
    for (src, op), v in sorted(by_op.items()):
        print(f"   {src:8} {op:15} {pct(statistics.mean(v)):>8}  median {pct(statistics.median(v)):>8}  n={len(v)}")
    w = [x["slowdown"] for p, f, pat, src, op, _, x in mean if src == "workload" and op == "write"]
    rd = [x["slowdown"] for p, f, pat, src, op, _, x in mean if src == "workload" and op == "read"]
    pairs = defaultdict(dict)
    for p, f, pat, src, op, _, x in mean:
        if src == "workload":
            pairs[(p, f, pat)][op] = x["slowdown"]
    both = [v for v in pairs.values() if "read" in v and "write" in v]
    more = sum(1 for v in both if v["write"] > v["read"])
    print(f"   workload syscalls: write median {pct(statistics.median(w))} (mean {pct(statistics.mean(w))}) vs read median {pct(statistics.median(rd))} (mean {pct(statistics.mean(rd))}); write > read in {more} of {len(both)} setups")
    fw = [x["slowdown"] for p, f, pat, src, op, _, x in mean if src == "flowop" and op in WRITE_FLOWOPS]
    fr = [x["slowdown"] for p, f, pat, src, op, _, x in mean if src == "flowop" and op in READ_FLOWOPS]
    if fw and fr:
        print(f"   flowops: write-side ({', '.join(sorted(WRITE_FLOWOPS))}) median {pct(statistics.median(fw))} vs readwholefile median {pct(statistics.median(fr))}")
    print("   distinguishable from zero (95% interval excludes 0):")
    for (src, op), _ in sorted(by_op.items()):
        d = [x for p, f, pat, s2, o2, _, x in mean if (s2, o2) == (src, op)]
        up = sum(1 for x in d if x["distinguishable"] and x["slowdown"] > 0)
        down = sum(1 for x in d if x["distinguishable"] and x["slowdown"] < 0)
        print(f"     {src:8} {op:15} slower in {up}, faster in {down} of {len(d)} setups")

    print("\n2. burst vs random at the same ratio (workload read+write and flowop mean-latency slowdowns)")
    idx = {(p, f, pat, src, op): x["slowdown"] for p, f, pat, src, op, _, x in mean}
    for ratio in ("10", "20"):
        diffs = []
        for (p, f, pat, src, op), v in idx.items():
            if pat == f"burst-{ratio}" and (p, f, f"random-{ratio}", src, op) in idx:
                diffs.append(v - idx[(p, f, f"random-{ratio}", src, op)])
        if diffs:
            more = sum(1 for d in diffs if d > 0)
            print(f"   {ratio}%: burst - random = {pct(statistics.mean(diffs))} on average (median {pct(statistics.median(diffs))}); burst worse in {more} of {len(diffs)}")
    for pat in ("random-10", "random-20", "burst-10", "burst-20", "interval-10", "interval-20"):
        v = [x for (p, f, pt, src, op), x in idx.items() if pt == pat]
        if v:
            print(f"   {pat:12} slowdown over setups and ops: median {pct(statistics.median(v))}, mean {pct(statistics.mean(v))}")

    print("\n3. ext4 ordered (ext4) vs writeback (ext4-writeback)")
    diffs = []
    for (p, f, pat, src, op), v in idx.items():
        if f == "ext4" and (p, "ext4-writeback", pat, src, op) in idx:
            diffs.append(v - idx[(p, "ext4-writeback", pat, src, op)])
    if diffs:
        more = sum(1 for d in diffs if d > 0)
        print(f"   ordered - writeback = {pct(statistics.mean(diffs))} on average (median {pct(statistics.median(diffs))}); ordered worse in {more} of {len(diffs)}")
    for fs in ("ext4", "ext4-writeback", "xfs", "btrfs"):
        v = [x for (p, f, pt, src, op), x in idx.items() if f == fs]
        if v:
            print(f"   {fs:15} slowdown over setups and ops: median {pct(statistics.median(v))}, mean {pct(statistics.mean(v))}")


if __name__ == "__main__":
    main()
