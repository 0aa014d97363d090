#!/usr/bin/env python3
"""Rules that never match the benchmark's I/O: N content rules with random hashes and N offset
rules placed beyond the first 512 MiB (fio-points.sh only touches the first 512 MiB)."""
import random, sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
rng = random.Random(1)
out = ["rules:"]
for i in range(n):
    out.append('  - {type: bitflip, op: write, target: {hash: "%032x"}}' % rng.getrandbits(128))
for i in range(n):
    out.append("  - {type: error, op: read, target: {block: %d}}" % (131072 + i))
print("\n".join(out))
