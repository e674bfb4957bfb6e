#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Compare two float32 logits files of rows x vocab: max |a - b| / max |b| per file and per row.

usage: compare.py A.bin B.bin VOCAB TOL [LABEL]
Exit 0 when the whole-file ratio is <= TOL. Used by tests/gpu/run.sh to check x4-logits output.
"""
import sys

import numpy as np


def main():
    a_path, b_path, vocab, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    label = sys.argv[5] if len(sys.argv) > 5 else a_path
    a = np.fromfile(a_path, dtype="<f4")
    b = np.fromfile(b_path, dtype="<f4")
    if a.size != b.size or a.size % vocab:
        print(f"{label}: sizes differ or are not rows of {vocab}: {a.size} vs {b.size} floats")
        return 1
    a = a.reshape(-1, vocab).astype(np.float64)
    b = b.reshape(-1, vocab).astype(np.float64)
    if not np.isfinite(a).all():
        print(f"{label}: non-finite values")
        return 1
    err = np.abs(a - b).max()
    ref = np.abs(b).max()
    worst_row = (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()
    rel = err / ref
    ok = rel <= tol
    print(f"{label}: {a.shape[0]} rows, max abs {err:.3g}, max |ref| {ref:.3g}, rel {rel:.3g} "
          f"(<= {tol:g}), worst row rel {worst_row:.3g}, argmax agree "
          f"{int((a.argmax(1) == b.argmax(1)).sum())}/{a.shape[0]} {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
