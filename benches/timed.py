"""Wall time, CPU time and peak RSS from the output of `/usr/bin/time -v`; shared by the
scripts.

    python3 benches/timed.py TIME_TXT      prints "<seconds> <peak RSS in KiB>"
"""
import re
import sys


def wall_and_rss(path):
    """(wall seconds, peak RSS in KiB) of the run whose `time -v` output is in `path`."""
    t = open(path).read()
    wall = t.split("Elapsed (wall clock) time (h:mm:ss or m:ss):")[1].split()[0]
    secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall.split(":"))))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
    return secs, rss


def cpu_seconds(path):
    """User plus system CPU seconds of the run whose `time -v` output is in `path`."""
    t = open(path).read()
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", t).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", t).group(1))
    return user + system


if __name__ == "__main__":
    secs, rss = wall_and_rss(sys.argv[1])
    print(secs, rss)
