#!/usr/bin/env python3
"""Percentiles (p50/p90/p99, µs) of each phase in `batch phases` debug lines, and of
`commit log written`, from a Tidemark server log."""
import re, sys
def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else 0
for path in sys.argv[1:]:
    ph, commit = {}, []
    for line in open(path, errors="replace"):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if "batch phases" in line:
            total = 0
            for name, us in re.findall(r"(\w+)=(\d+)us", line):
                ph.setdefault(name, []).append(int(us))
                if name not in ("walCommit", "ofWhichPlanning"):
                    total += int(us)
            ph.setdefault("wholeBatch", []).append(total)
        elif "commit log written" in line:
            m = re.search(r"us=(\d+)", line)
            if m: commit.append(int(m.group(1)))
    print(path)
    for name, xs in list(ph.items()) + [("commitLogBackground", commit)]:
        print(f"  {name:22} n={len(xs):6} p50={pct(xs,50):7} p90={pct(xs,90):7} p99={pct(xs,99):7}")
