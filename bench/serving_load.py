#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Serving under load, measured from the client side: two long streams (max_tokens 131072) run
while short requests with random prompt lengths and output limits arrive at a fixed concurrency.
Prints queue wait (the daemon's Done timings), time to first token and the gaps between tokens
(of the long streams and of the short requests), as the "Serving under load" table of
bench/RESULTS.md reports them.

Usage: X4_XING4D=PATH/xing4d python3 bench/serving_load.py MODEL.gguf [N_REQUESTS] [CONCURRENCY]
           [DAEMON FLAGS...]
(run from the source tree; binaries default to build/). A request not answered within 60 s
counts as "no answer"."""
import os
import random
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import x4wire as w  # noqa: E402
from conftest import Daemon  # noqa: E402

CONF = "[xing4d]\ncache-pages = 64\npage_tokens = 256\nmax-running = 8\n"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def run_request(sock, ids, max_tokens, out, timeout=60):
    c = w.Conn(sock, timeout=timeout)
    c.hello()
    t0 = time.monotonic()
    c.send(w.frame(1, w.GENERATE, w.generate_tokens(ids, max_tokens=max_tokens, ignore_eos=True)))
    times, queue_ms = [], None
    try:
        while True:
            f = c.recv()
            if f is None or w.ERROR in f:
                break
            if w.CHUNK in f:
                times.append(time.monotonic())
            elif w.DONE in f:
                d = w.parse(f[w.DONE][0])
                t = w.parse(d[3][0]) if 3 in d else {}
                if 1 in t:
                    queue_ms = struct.unpack("<d", t[1][0])[0]
                break
    except OSError:
        pass
    c.close()
    out.append({"t0": t0, "times": times, "queue_ms": queue_ms, "n_prompt": len(ids),
                "max_tokens": max_tokens})


def main():
    model = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    conc = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    rng = random.Random(7)
    d = Daemon(Path(tempfile.mkdtemp()) / "d", CONF, args=("--model", model, *sys.argv[4:]))
    try:
        longs, short = [], []
        stop = threading.Event()

        def long_stream(k):
            c = w.Conn(d.sock, timeout=120)
            c.hello()
            c.send(w.frame(1, w.GENERATE, w.generate_tokens([5 + k] * 20, max_tokens=131072,
                                                            ignore_eos=True)))
            times = []
            while not stop.is_set():
                f = c.recv()
                if f is None or w.CHUNK not in f:
                    break
                times.append(time.monotonic())
            c.close()
            longs.append(times)
        lt = [threading.Thread(target=long_stream, args=(k,)) for k in range(2)]
        for t in lt:
            t.start()
        time.sleep(1.0)
        jobs = []
        for i in range(n):
            plen = int(round(2 ** rng.uniform(4, 11)))  # 16 .. 2048 prompt tokens
            ids = [5 + (i * 131 + j * 17) % 500 for j in range(plen)]
            jobs.append((ids, rng.randint(16, 128)))
        sem = threading.Semaphore(conc)
        threads = []
        t_load = time.monotonic()
        for ids, mt in jobs:
            sem.acquire()

            def go(ids=ids, mt=mt):
                try:
                    run_request(d.sock, ids, mt, short)
                finally:
                    sem.release()
            th = threading.Thread(target=go)
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        t_end = time.monotonic()
        stop.set()
        for t in lt:
            t.join(timeout=130)
        answered = [r for r in short if r["times"]]
        ttft = [r["times"][0] - r["t0"] for r in answered]
        gaps = [b - a for r in answered for a, b in zip(r["times"], r["times"][1:])]
        lgaps = [b - a for times in longs for a, b in zip(times, times[1:]) if t_load <= a <= t_end]
        qw = [r["queue_ms"] / 1e3 for r in answered if r["queue_ms"] is not None]
        print(f"{len(answered)}/{n} short requests answered in {t_end - t_load:.1f} s "
              f"(concurrency {conc}), 2 long streams")
        print(f"queue wait s: p50 {pct(qw, 50):.2f} p95 {pct(qw, 95):.2f} max {max(qw or [0]):.2f}")
        print(f"TTFT s:       p50 {pct(ttft, 50):.2f} p95 {pct(ttft, 95):.2f} max {max(ttft or [0]):.2f}")
        print(f"short gaps s: p50 {pct(gaps, 50):.3f} p99 {pct(gaps, 99):.3f} max {max(gaps or [0]):.3f}")
        print(f"long-stream gaps during the load s: p50 {pct(lgaps, 50):.3f} p99 {pct(lgaps, 99):.3f} "
              f"max {max(lgaps or [0]):.3f} ({len(lgaps)} tokens)")
        pre = sum("preempted (cache full)" in x for x in d.log)
        print(f"preemptions logged: {pre}")
    finally:
        d.close()


if __name__ == "__main__":
    main()
