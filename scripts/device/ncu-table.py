#!/usr/bin/python3
"""One line per kernel launch of an `ncu --csv --metrics ...` run: time, DRAM bytes read and
written, their rate, and the launch shape where the run asked for those metrics."""
import collections
import csv
import sys

by_name = len(sys.argv) > 2 and sys.argv[2] == "--sum"  # one line per kernel name: launches, total time
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows:
    sys.exit(f"{sys.argv[1]}: no ncu rows")
hdr, rows = rows[0], rows[1:]
ki, ni, mi, vi = (hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value"))
per = collections.OrderedDict()
for r in rows:
    per.setdefault((r[ki], r[ni][:70]), {})[r[mi]] = r[vi]


def f(m, k):
    return float(m.get(k, "0").replace(",", ""))


if by_name:
    tot = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for (k, n), m in per.items():
        e = tot[n.split("(")[0]]
        e[0] += 1
        e[1] += f(m, "gpu__time_duration.sum") / 1000
        e[2] += (f(m, "dram__bytes_read.sum") + f(m, "dram__bytes_write.sum")) / 1e6
    for n, (c, t, mb) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        print(f"{t:10.1f}us {c:5d} launches {t / c:8.1f}us each {mb:9.1f}MB {mb * 1e3 / t if t else 0:6.0f}GB/s  {n}")
    sys.exit(0)

for (k, n), m in per.items():
    t = f(m, "gpu__time_duration.sum")
    rd, wr = f(m, "dram__bytes_read.sum"), f(m, "dram__bytes_write.sum")
    print(f"{k:>5} {n:70} t={t / 1000:8.1f}us rdMB={rd / 1e6:8.1f} wrMB={wr / 1e6:7.1f} "
          f"GB/s={(rd + wr) / t if t else 0:6.0f} "
          f"sm%={m.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', '-'):>6} "
          f"grid={m.get('launch__grid_size', '-'):>6} blk={m.get('launch__block_size', '-'):>4} "
          f"regs={m.get('launch__registers_per_thread', '-'):>4}")
