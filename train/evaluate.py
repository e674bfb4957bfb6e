#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Held-out numbers of an exported model, through the engine (issue 15's "Must show"):

    evaluate.py --ckpt RUN --f32 F32.gguf [--quant RELEASE.gguf] --x4-logits build/tools/x4-logits
                [--data train/data/tokens] [--windows 4] [--seq 128]

On fixed windows of the held-out prose and chat token files: PyTorch's fp32 logits from the
checkpoint against x4-logits on the F32 export (max relative difference per row: the parity on
held-out text), the cross-entropy of each (nats/token; bits per byte from the files' bytes per
token), and of the release-typed export, with the perplexity ratio quantized / unquantized (the
issue asks for at most 1.05). One JSON object on stdout.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import load_checkpoint  # noqa: E402


def engine(x4_logits, gguf, ids, work):
    out = os.path.join(work, 'l.bin')
    subprocess.run([x4_logits, '--model', gguf, '--prompt', ','.join(map(str, ids)), '--out', out],
                   check=True, capture_output=True)
    return np.fromfile(out, dtype='<f4').reshape(len(ids), -1)


def ce(logits, ids):
    lp = torch.log_softmax(torch.from_numpy(np.asarray(logits, np.float64)), -1)
    t = torch.tensor(ids[1:])
    return float(-lp[:-1].gather(1, t[:, None]).sum()), len(ids) - 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--ckpt', required=True)
    ap.add_argument('--f32', required=True)
    ap.add_argument('--quant')
    ap.add_argument('--x4-logits', required=True)
    ap.add_argument('--data', default=os.path.join(here, 'data', 'tokens'))
    ap.add_argument('--windows', type=int, default=4)
    ap.add_argument('--seq', type=int, default=128)
    a = ap.parse_args()
    model, idx = load_checkpoint(a.ckpt)
    meta = json.load(open(os.path.join(a.data, 'meta.json')))
    work = tempfile.mkdtemp(prefix='x4-eval-')
    res = dict(step=idx.get('step'), tokens_trained=idx.get('tokens'))
    worst = 0.0
    for kind in ('pretrain_heldout', 'chat_heldout'):
        p = os.path.join(a.data, kind + '.bin')
        if not os.path.exists(p):
            continue
        toks = np.fromfile(p, dtype=np.uint16)
        rng = np.random.default_rng(7)
        acc = dict(torch=[0.0, 0], f32=[0.0, 0], quant=[0.0, 0])
        for _ in range(a.windows):
            s = int(rng.integers(0, len(toks) - a.seq))
            ids = [int(x) for x in toks[s:s + a.seq]]
            with torch.no_grad():
                ref = model(torch.tensor([ids]))[0][0].double().numpy()
            ours = engine(a.x4_logits, a.f32, ids, work)
            worst = max(worst, float(max(np.abs(o - r).max() / np.abs(r).max() for o, r in zip(ours, ref))))
            for k, lg in (('torch', ref), ('f32', ours)):
                c, n = ce(lg, ids)
                acc[k][0] += c
                acc[k][1] += n
            if a.quant:
                c, n = ce(engine(a.x4_logits, a.quant, ids, work), ids)
                acc['quant'][0] += c
                acc['quant'][1] += n
        bpt = meta['files'][kind]['bytes_per_token']
        r = {}
        for k, (c, n) in acc.items():
            if n:
                r[k] = dict(nats_per_token=round(c / n, 4), bpb=round(c / n / math.log(2) / bpt, 4))
        if 'quant' in r:
            r['perplexity_ratio_quant_over_f32'] = round(math.exp(r['quant']['nats_per_token'] - r['f32']['nats_per_token']), 4)
        res[kind] = r
    res['parity_max_rel_engine_f32_vs_torch'] = float(f'{worst:.3e}')
    print(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
