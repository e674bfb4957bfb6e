#!/usr/bin/python3
"""Where a replayed decode step's time goes between its kernels (issue 11: the launch structure).

Usage: nsys-gaps.py TRACE.csv [--steps N]

TRACE.csv is `nsys stats -r cuda_gpu_trace -f csv` of an x4-bench decode run profiled with
`nsys profile --cuda-graph-trace=node` (each graph node a row). A step is the kernels from one
k_embed to the next; the last N steps (default 8) are read. Printed: kernels a step, the step's
span (first start to last end), the time some kernel ran (the union of the kernels' intervals:
with programmatic dependent launch they overlap), the idle rest, and by kernel name the mean
duration, the mean idle time before it (its start minus the latest end so far, when positive)
and how often it started before the previous kernel ended (overlap)."""
import csv
import statistics
import sys


def col(header, *keys):
    for i, h in enumerate(header):
        if all(k.lower() in h.lower() for k in keys):
            return i
    raise SystemExit(f"nsys-gaps: no column with {keys} in {header}")


def short(name):
    name = name.split("(")[0]
    if "<" in name:
        name = name.split("<")[0] + "<" + name.split("<", 1)[1].split(">")[0][:40] + ">"
    return name.replace("void ", "")[:70]


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    n_steps = 8
    if "--steps" in args:
        i = args.index("--steps")
        n_steps = int(args[i + 1])
        del args[i:i + 2]
    with open(args[0], newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    cs, cd, cn = col(header, "start"), col(header, "duration"), col(header, "name")
    ks = [(int(float(r[cs])), int(float(r[cd])), r[cn]) for r in rows if r[cn] and "[CUDA" not in r[cn]]
    ks.sort()
    starts = [i for i, k in enumerate(ks) if "k_embed" in k[2]]
    if len(starts) < 2:
        raise SystemExit(f"nsys-gaps: {len(starts)} steps (k_embed launches) in {len(ks)} kernels")
    bounds = list(zip(starts, starts[1:] + [len(ks)]))[-n_steps:]
    spans, busy, counts = [], [], []
    per = {}
    for a, b in bounds:
        step = ks[a:b]
        end_so_far = step[0][0]
        union = 0
        for i, (st, du, nm) in enumerate(step):
            en = st + du
            lead = st - end_so_far if i else 0
            e = per.setdefault(short(nm), {"dur": [], "idle": [], "overlap": 0})
            e["dur"].append(du)
            e["idle"].append(max(lead, 0))
            e["overlap"] += lead < 0
            union += max(0, en - max(st, end_so_far))
            end_so_far = max(end_so_far, en)
        spans.append(end_so_far - step[0][0])
        busy.append(union)
        counts.append(b - a)
    span, run = statistics.median(spans), statistics.median(busy)
    print(f"steps read: {len(bounds)}; kernels a step: {statistics.median(counts):.0f}")
    print(f"step span {span / 1e3:.1f} us; some kernel running {run / 1e3:.1f} us; idle {(span - run) / 1e3:.1f} us "
          f"({100 * (span - run) / span:.1f}%)")
    print(f"{'kernel':70s} {'n/step':>7s} {'mean us':>8s} {'idle before':>11s} {'overlaps':>8s}")
    n = len(bounds)
    for name, e in sorted(per.items(), key=lambda kv: -sum(kv[1]["dur"]) - sum(kv[1]["idle"])):
        print(f"{name:70s} {len(e['dur']) / n:7.1f} {statistics.mean(e['dur']) / 1e3:8.2f} "
              f"{statistics.mean(e['idle']) / 1e3:11.2f} {e['overlap'] / n:8.1f}")


if __name__ == "__main__":
    main()
