#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""oracle-release-dims: x4-logits (CPU backend) against the independent float64 reference.py on a
synthetic model with the release's head dimensions (see README.md).

    run_oracle.py X4-MKMODEL X4-LOGITS [WORKDIR]

Bound per case and per output row: max|ours - ref| <= 1e-4 * max|ref|. The same bound must FAIL for
two deliberately broken references (comb transposed; YaRN ramp off), so a reference that stopped
exercising those paths cannot pass silently.

The model has its NextN block (docs/model.md section 8): x4-logits --nextn-out writes the block's draft
logits of every position but the last (MTP on), compared with reference.nextn on the reference's own
trunk hidden under the same bound; the other reading of U4 (pre-norm h) and the concat order (hidden
half first) must fail it. The other reading of U5 (position id t + 1 for every row) must PASS it: RoPE
scores depend only on position differences, so a uniform shift of the block's position ids is
invisible up to rounding (U5 does not change the drafts).
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference  # noqa: E402

BOUND = 1e-4
MKMODEL_ARGS = ['--preset', 'full', '--layers', '4', '--dense', '2', '--nextn', '1', '--vocab', '4096',
                '--seed', '7', '--quiet']
PROMPT = [1, 7, 3, 100, 2000, 4095, 17, 256, 999, 3000, 42, 5, 77, 1234, 3333, 8]
DECODE = [4, 5, 600]

# what makes this model "release dims" (spec section 1 and 2.4); checked so a preset change cannot
# quietly shrink what the test covers
RELEASE = {
    'embedding_length': 3584, 'attention.head_count': 32, 'attention.q_lora_rank': 768,
    'attention.kv_lora_rank': 512, 'attention.key_length_mla': 192, 'attention.value_length_mla': 128,
    'rope.dimension_count': 64, 'expert_count': 64, 'expert_used_count': 4, 'expert_shared_count': 1,
    'expert_feed_forward_length': 1024, 'feed_forward_length': 9216, 'leading_dense_block_count': 2,
    'hyper_connection.count': 4, 'hyper_connection.sinkhorn_iterations': 20, 'rope.scaling.factor': 64.0,
}
TYPES = {'token_embd.weight': 30, 'output.weight': 14, 'blk.0.attn_q_b.weight': 30,
         'blk.0.ffn_gate.weight': 20, 'blk.2.ffn_gate_exps.weight': 20, 'blk.2.ffn_down_shexp.weight': 20,
         'blk.2.ffn_gate_inp.weight': 0, 'blk.3.hc_ffn_fn.weight': 30}


def worst(ours, ref):
    """(worst ratio, row) of max|ours-ref| / max|ref| over rows."""
    rows = [np.abs(ours[t] - ref[t]).max() / np.abs(ref[t]).max() for t in range(ref.shape[0])]
    t = int(np.argmax(rows))
    return rows[t], t, rows


def main():
    if len(sys.argv) < 3:
        sys.exit('usage: run_oracle.py X4-MKMODEL X4-LOGITS [WORKDIR]')
    mkmodel, logits = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory(prefix='x4-oracle-', dir=sys.argv[3] if len(sys.argv) > 3 else None) as d:
        model = os.path.join(d, 'm.gguf')
        t0 = time.time()
        subprocess.run([mkmodel, *MKMODEL_ARGS, '--out', model], check=True)
        print(f'model: x4-mkmodel {" ".join(MKMODEL_ARGS)}: {os.path.getsize(model)} bytes, {time.time() - t0:.1f} s')

        g = reference.Gguf(model)
        for k, v in RELEASE.items():
            got = g.meta(k)
            if got != v:
                failures.append(f'xing4_0.{k} = {got}, release value {v} expected')
        for name, ty in TYPES.items():
            if g.tensors[name][1] != ty:
                failures.append(f'{name}: ggml type {g.tensors[name][1]}, {ty} expected')
        if failures:
            print('\n'.join('FAIL ' + f for f in failures))
            return 1

        ids = PROMPT + DECODE
        t0 = time.time()
        ref, info = reference.forward(g, ids)
        print(f'reference: {len(ids)} tokens, attention scale {info["scale"]:.8f}, {time.time() - t0:.1f} s')
        for l, sel in sorted(info['sel'].items()):
            print(f'  blk.{l}: {len(np.unique(sel))} distinct experts selected over {len(ids)} tokens')

        t0 = time.time()
        ref_nextn = reference.nextn(g, info['hidden'][:-1], ids[1:])
        print(f'reference NextN block: {ref_nextn.shape[0]} rows, {time.time() - t0:.1f} s')

        cases = [('prefill as one batch + 3 decode', []), ('prefill in chunks of 5 + 3 decode', ['--chunk', '5'])]
        for label, extra in cases:
            out = os.path.join(d, 'ours.bin')
            nout = os.path.join(d, 'nextn.bin')
            subprocess.run([logits, '--model', model, '--prompt', ','.join(map(str, PROMPT)),
                            '--decode', ','.join(map(str, DECODE)), '--device', 'cpu', *extra, '--out', out,
                            '--nextn-out', nout],
                           check=True)
            nextn = np.fromfile(nout, dtype='<f4').astype(np.float64)
            if nextn.size != ref_nextn.size:
                failures.append(f'{label}: x4-logits --nextn-out wrote {nextn.size} floats, {ref_nextn.size} expected')
            else:
                nextn = nextn.reshape(ref_nextn.shape)
                w, t, _ = worst(nextn, ref_nextn)
                same = int(np.sum(nextn.argmax(1) == ref_nextn.argmax(1)))
                print(f'{label}, NextN draft logits: worst {w:.3e} at row {t} (bound {BOUND:.0e}); '
                      f'argmax equal on {same}/{ref_nextn.shape[0]} rows')
                if not w <= BOUND:
                    failures.append(f'{label}, NextN: {w:.3e} > {BOUND:.0e} at row {t}')
                if same != ref_nextn.shape[0]:
                    failures.append(f'{label}, NextN: argmax differs on {ref_nextn.shape[0] - same} rows')
            ours = np.fromfile(out, dtype='<f4').astype(np.float64)
            if ours.size != ref.size:
                failures.append(f'{label}: x4-logits wrote {ours.size} floats, {ref.size} expected')
                continue
            ours = ours.reshape(ref.shape)
            w, t, _ = worst(ours, ref)
            same_argmax = int(np.sum(ours.argmax(1) == ref.argmax(1)))
            print(f'{label}: worst max|ours-ref|/max|ref| = {w:.3e} at row {t} (bound {BOUND:.0e}); '
                  f'argmax equal on {same_argmax}/{ref.shape[0]} rows')
            if not w <= BOUND:
                failures.append(f'{label}: {w:.3e} > {BOUND:.0e} at row {t}')
            if same_argmax != ref.shape[0]:
                failures.append(f'{label}: argmax differs on {ref.shape[0] - same_argmax} rows')

        # the bound must be able to fail: the same comparison of x4-logits (the last case's output)
        # against deliberately broken references
        for label, kw in [('comb transposed (C^T)', dict(comb_transposed=True)),
                          ('YaRN ramp off', dict(no_yarn=True))]:
            bad, _ = reference.forward(g, ids, **kw)
            w, t, _ = worst(ours, bad)
            print(f'broken reference, {label}: worst {w:.3e} at row {t} (must exceed {BOUND:.0e})')
            if not w > BOUND:
                failures.append(f'broken reference ({label}) passes the bound: {w:.3e}')

        # the NextN bound must be able to fail too: the other readings of U4 and U5, and the
        # concat order
        if nextn.size == ref_nextn.size:
            shifted = reference.nextn(g, info['hidden'][:-1], ids[1:], pos_offset=1)
            w, t, _ = worst(nextn, shifted)
            print(f'NextN reference with U5 position id t + 1: worst {w:.3e} at row {t} (a uniform shift, '
                  f'must stay within {BOUND:.0e})')
            if not w <= BOUND:
                failures.append(f'NextN: a uniform position shift (U5) changed the drafts: {w:.3e}')
            for label, h, kw in [('U4: pre-norm h', info['mean'][:-1], {}),
                                 ('concat(h, e)', info['hidden'][:-1], dict(swap_halves=True))]:
                bad = reference.nextn(g, h, ids[1:], **kw)
                w, t, _ = worst(nextn, bad)
                print(f'broken NextN reference, {label}: worst {w:.3e} at row {t} (must exceed {BOUND:.0e})')
                if not w > BOUND:
                    failures.append(f'broken NextN reference ({label}) passes the bound: {w:.3e}')

    for f in failures:
        print('FAIL ' + f)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
