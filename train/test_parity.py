#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""train-parity: a small random-init train/model.py model, exported at F32, run by x4-logits (CPU
backend) must agree with PyTorch's fp32 logits: max|engine - torch| <= 1e-2 * max|torch| per row
(issue 15's bound; the run measures ~1e-6). Also checks the release-type quantizers against the
dequantizer of tests/oracle/reference.py, and that a release-typed export loads and stays close.

    test_parity.py X4-LOGITS [WORKDIR]

Exit 77 (skipped) when PyTorch is not installed (python3-torch on Debian).
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print('SKIP: python3-torch is not installed (apt-get install python3-torch)')
    sys.exit(77)
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'tests', 'oracle'))
import export  # noqa: E402
import gguf_write as gw  # noqa: E402
from model import Config, Xing4  # noqa: E402

BOUND = 1e-2
CFG = Config(vocab=512, hidden=256, layers=3, dense=1, nextn=1, heads=4, q_lora=64, kv_lora=64,
             qk_nope=32, qk_rope=32, v_head=32, ff=256, experts=8, experts_used=2, shared=1, expert_ff=64)
PROMPT = [1, 7, 300, 45, 99, 410, 2, 5, 17, 256, 333, 4, 87, 100, 12, 480, 6, 9, 200, 301]


def randomize(m, seed):
    """Weights that exercise every path: norms, HC base/scale and the routing bias away from their
    init values, larger residual projections than training starts with."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            leaf = name.rsplit('.', 1)[-1]
            if p.dim() == 1 and 'norm' in leaf or leaf in ('enorm', 'hnorm'):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == 'base':
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif leaf == 'scale':
                p.copy_(torch.tensor([0.75, 1.25, -0.6]) * (1 + 0.1 * torch.randn(3, generator=g)))
            elif leaf in ('tok_embd', 'embed_tokens'):
                p.copy_(torch.randn(p.shape, generator=g))
            elif leaf == 'fn':
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        for moe in m.moe_layers():
            moe.bias.copy_(0.05 * torch.randn(moe.bias.shape, generator=g))


def engine_logits(x4_logits, gguf, ids, work):
    out = os.path.join(work, 'logits.bin')
    subprocess.run([x4_logits, '--model', gguf, '--prompt', ','.join(map(str, ids)), '--threads', '2',
                    '--out', out], check=True)
    return np.fromfile(out, dtype='<f4').reshape(len(ids), -1)


def worst(ours, ref):
    return max(np.abs(o - r).max() / np.abs(r).max() for o, r in zip(ours, ref))


def check_quantizers():
    import reference
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 512)) * rng.uniform(0.01, 2, (8, 1))).astype(np.float32)
    res = {}
    for name, ty, bound in (('IQ4_NL', gw.T_IQ4_NL, 0.12), ('Q6_K', gw.T_Q6_K, 0.03),
                            ('BF16', gw.T_BF16, 0.005)):
        b = np.frombuffer(gw.encode(x, ty), dtype=np.uint8)
        y = reference.dequant(b, ty, 512, 8)
        err = np.sqrt(((y - x) ** 2).mean(1) / (x ** 2).mean(1)).max()
        res[name] = err
        if not err <= bound:
            print(f'FAIL: {name} round trip relative rms error {err:.4f} > {bound}')
            return None
    return res


def main():
    x4_logits = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix='x4-train-parity-')
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    m = Xing4(CFG).float().eval()
    randomize(m, 11)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = m(ids)[0][0].numpy()
    gguf = os.path.join(work, 'model.gguf')
    export.export(m, gguf, types='f32', name='train-parity')
    ours = engine_logits(x4_logits, gguf, PROMPT, work)
    err = worst(ours, ref)
    print(f'f32 export: max |engine - torch| / max |torch| over {len(PROMPT)} rows = {err:.3e} (bound {BOUND})')
    ok = err <= BOUND

    q = check_quantizers()
    if q is None:
        ok = False
    else:
        print('quantizer round trips (relative rms):', ', '.join(f'{k} {v:.4f}' for k, v in q.items()))

    # the release's types: the engine on the quantized file against PyTorch with the same weights
    # quantized and dequantized (tests/oracle/reference.py's dequantizer), so the bound checks the
    # encoding, not the quantization error; the distance from fp32 is reported
    import reference
    gguf_q = os.path.join(work, 'model-release.gguf')
    size = export.export(m, gguf_q, types='release', name='train-parity')
    mq = Xing4(CFG).float().eval()
    mq.load_state_dict(m.state_dict())
    sd = mq.state_dict()
    with torch.no_grad():
        for _, key, ty in export.tensor_plan(CFG, 'release'):
            if ty == gw.T_F32 or key not in sd:
                continue
            t = sd[key]
            k = t.shape[-1]
            n = t.numel() // k
            b = np.frombuffer(gw.encode(t.numpy(), ty), dtype=np.uint8)
            t.copy_(torch.from_numpy(reference.dequant(b, ty, k, n).reshape(t.shape)))
        ref_q = mq(ids)[0][0].numpy()
    ours_q = engine_logits(x4_logits, gguf_q, PROMPT, work)
    errq = worst(ours_q, ref_q)
    errf = worst(ours_q, ref)
    print(f'release types ({size} B): max |engine - torch(dequantized weights)| / max = {errq:.3e} '
          f'(bound {BOUND}); vs the fp32 weights {errf:.3e} (random weights: a worst case for IQ4_NL)')
    if not errq <= BOUND:
        ok = False
    print('PASS' if ok else 'FAIL')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
