#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Independent float64 reference of the Xing4 (xing4_0) trunk forward pass.

Written only from the model's specification, docs/model.md sections 3-6 (not from the C or CUDA
backends), so that a misreading shared by our backends shows up as a disagreement here.

    reference.py MODEL.gguf --ids 1,7,3,... --out LOGITS.npy [--comb-transposed] [--no-yarn]

Writes float64 logits, one row per id (causal, absolute positions 0..n-1). The two flags break the
reference on purpose (C^T in the post-mapping; YaRN ramp off), used by the test to show the bound can
fail.
"""
import argparse
import math
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- GGUF reader (spec 2.1)

_SCALAR = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q', 11: '<q', 12: '<d'}


class Gguf:
    def __init__(self, path):
        self.buf = np.memmap(path, dtype=np.uint8, mode='r')
        self.mv = memoryview(self.buf)
        self.pos = 0
        if bytes(self.mv[0:4]) != b'GGUF':
            raise ValueError(f'{path}: GGUF magic expected')
        self.pos = 4
        self.version = self._u('<I')
        n_tensors = self._u('<Q')
        n_kv = self._u('<Q')
        self.kv = {}
        for _ in range(n_kv):
            key = self._str()
            t = self._u('<I')
            self.kv[key] = self._value(t)
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._str()
            nd = self._u('<I')
            ne = [self._u('<Q') for _ in range(nd)]
            ty = self._u('<I')
            off = self._u('<Q')
            self.tensors[name] = (ne, ty, off)
        align = int(self.kv.get('general.alignment', 32))
        self.data = (self.pos + align - 1) // align * align

    def _u(self, fmt):
        n = struct.calcsize(fmt)
        v = struct.unpack_from(fmt, self.mv, self.pos)[0]
        self.pos += n
        return v

    def _str(self):
        n = self._u('<Q')
        s = bytes(self.mv[self.pos:self.pos + n]).decode('utf-8', 'replace')
        self.pos += n
        return s

    def _value(self, t):
        if t in _SCALAR:
            return self._u(_SCALAR[t])
        if t == 8:
            return self._str()
        if t == 9:
            et = self._u('<I')
            n = self._u('<Q')
            if et in _SCALAR:  # skip numeric arrays in bulk (tokenizer scores etc.)
                self.pos += n * struct.calcsize(_SCALAR[et])
                return None
            return [self._value(et) for _ in range(n)]
        raise ValueError(f'GGUF value type {t} unknown')

    def meta(self, key, default=None):
        for k in (f'xing4_0.{key}', key):
            if k in self.kv:
                return self.kv[k]
        if default is None:
            raise KeyError(f'GGUF key {key} missing')
        return default

    def has(self, name):
        return name in self.tensors

    def raw(self, name, row0=0, nrows=None):
        """Bytes of rows [row0, row0+nrows) of a tensor (a row = ne0 values)."""
        ne, ty, off = self.tensors[name]
        k = ne[0]
        total_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        if nrows is None:
            nrows = total_rows - row0
        rb = row_bytes(ty, k)
        start = self.data + off + row0 * rb
        return np.asarray(self.buf[start:start + nrows * rb]), ty, k, nrows

    def get(self, name, row0=0, nrows=None):
        """Dequantized float64 rows, shape (nrows, ne0)."""
        b, ty, k, n = self.raw(name, row0, nrows)
        return dequant(b, ty, k, n)


# ---------------------------------------------------------------- dequantization (spec 6)

IQ4NL_K = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float64)


def row_bytes(ty, k):
    if ty == 0:
        return 4 * k
    if ty in (1, 30):
        return 2 * k
    if ty == 20:
        assert k % 32 == 0
        return k // 32 * 18
    if ty == 14:
        assert k % 256 == 0
        return k // 256 * 210
    raise ValueError(f'ggml type {ty} not supported by the reference')


def dequant(b, ty, k, n):
    if ty == 0:
        return b.view('<f4').astype(np.float64).reshape(n, k)
    if ty == 1:
        return b.view('<f2').astype(np.float64).reshape(n, k)
    if ty == 30:
        return (b.view('<u2').astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(n, k)
    if ty == 20:
        blk = b.reshape(-1, 18)
        d = blk[:, 0:2].copy().view('<f2').astype(np.float64)  # (nb, 1)
        qs = blk[:, 2:18]
        y = np.empty((blk.shape[0], 32), dtype=np.float64)
        y[:, 0:16] = IQ4NL_K[qs & 0xF]
        y[:, 16:32] = IQ4NL_K[qs >> 4]
        return (y * d).reshape(n, k)
    if ty == 14:
        blk = b.reshape(-1, 210)
        nb = blk.shape[0]
        ql = blk[:, 0:128].astype(np.int32)
        qh = blk[:, 128:192].astype(np.int32)
        sc = blk[:, 192:208].copy().view(np.int8).astype(np.float64)
        d = blk[:, 208:210].copy().view('<f2').astype(np.float64)[:, 0]
        y = np.empty((nb, 256), dtype=np.float64)
        for h in range(2):
            L = ql[:, 64 * h:64 * h + 64]
            H = qh[:, 32 * h:32 * h + 32]
            S = sc[:, 8 * h:8 * h + 8]
            q1 = ((L[:, 0:32] & 0xF) | (((H >> 0) & 3) << 4)) - 32
            q2 = ((L[:, 32:64] & 0xF) | (((H >> 2) & 3) << 4)) - 32
            q3 = ((L[:, 0:32] >> 4) | (((H >> 4) & 3) << 4)) - 32
            q4 = ((L[:, 32:64] >> 4) | (((H >> 6) & 3) << 4)) - 32
            is_ = np.arange(32) // 16
            base = 128 * h
            y[:, base + 0:base + 32] = d[:, None] * S[:, is_] * q1
            y[:, base + 32:base + 64] = d[:, None] * S[:, is_ + 2] * q2
            y[:, base + 64:base + 96] = d[:, None] * S[:, is_ + 4] * q3
            y[:, base + 96:base + 128] = d[:, None] * S[:, is_ + 6] * q4
        return y.reshape(n, k)
    raise ValueError(f'ggml type {ty} not supported by the reference')


# ---------------------------------------------------------------- forward (spec 3-5)

EPS = 1e-6
CLAMP = 30.0


def rmsnorm(x, w=None):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    return y if w is None else y * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def hc(g, X, kind, l, iters):
    """X: (4, T, H). Returns pre (T,4), post (T,4), C (T,4dst,4src), u (T,H)."""
    ns, T, H = X.shape
    Wfn = g.get(f'blk.{l}.hc_{kind}_fn.weight')            # (24, 4H)
    base = g.get(f'blk.{l}.hc_{kind}_base.weight')[0]       # (24,)
    scale = g.get(f'blk.{l}.hc_{kind}_scale.weight')[0]     # (3,)
    z = X.transpose(1, 0, 2).reshape(T, ns * H)             # stream-major
    zh = rmsnorm(z)
    w = zh @ Wfn.T                                           # (T, 24)
    pre = sigmoid(w[:, 0:ns] * scale[0] + base[0:ns])
    post = 2.0 * sigmoid(w[:, ns:2 * ns] * scale[1] + base[ns:2 * ns])
    L = np.clip(w[:, 2 * ns:] * scale[2] + base[2 * ns:], -CLAMP, CLAMP).reshape(T, ns, ns)  # [t][dst][src]
    M = np.exp(L - L.max(axis=2, keepdims=True))
    for _ in range(iters):
        M = M / (M.sum(axis=2, keepdims=True) + EPS)   # over src, per dst
        M = M / (M.sum(axis=1, keepdims=True) + EPS)   # over dst, per src
    u = np.einsum('ts,sth->th', pre, X)
    return pre, post, M, u


def post_map(X, post, C, out, comb_transposed):
    if comb_transposed:
        C = C.transpose(0, 2, 1)
    mix = np.einsum('tds,sth->dth', C, X)
    return mix + post.T[:, :, None] * out[None, :, :]


def yarn_inv_freq(g, n_rot, no_yarn):
    base = float(g.meta('rope.freq_base'))
    i = np.arange(n_rot // 2, dtype=np.float64)
    f = base ** (-2.0 * i / n_rot)
    if no_yarn:
        return f
    factor = float(g.meta('rope.scaling.factor'))
    orig = float(g.meta('rope.scaling.original_context_length'))
    bf = float(g.meta('rope.scaling.yarn_beta_fast'))
    bs = float(g.meta('rope.scaling.yarn_beta_slow'))
    low = math.floor(n_rot * math.log(orig / (bf * 2 * math.pi)) / (2 * math.log(base)))
    high = math.ceil(n_rot * math.log(orig / (bs * 2 * math.pi)) / (2 * math.log(base)))
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    return f * (1 - ramp) + (f / factor) * ramp


def rope(x, pos, inv_freq):
    """x: (..., T, n_rot) adjacent pairs; pos (T,)."""
    th = pos[:, None] * inv_freq[None, :]          # (T, n_rot/2)
    c, s = np.cos(th), np.sin(th)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return y


def mla(g, l, a, hp, inv_freq, scale, pos_offset=0):
    T = a.shape[0]
    nh, dn, dr, dv, kvl = hp['heads'], hp['nope'], hp['rope'], hp['v'], hp['kv_lora']
    qa = rmsnorm(a @ g.get(f'blk.{l}.attn_q_a.weight').T, g.get(f'blk.{l}.attn_q_a_norm.weight')[0])
    q = (qa @ g.get(f'blk.{l}.attn_q_b.weight').T).reshape(T, nh, dn + dr)
    q_nope, q_pe = q[:, :, :dn], q[:, :, dn:]
    kv = a @ g.get(f'blk.{l}.attn_kv_a_mqa.weight').T
    c = rmsnorm(kv[:, :kvl], g.get(f'blk.{l}.attn_kv_a_norm.weight')[0])
    k_pe = kv[:, kvl:kvl + dr]
    pos = np.arange(T, dtype=np.float64) + pos_offset
    q_pe = rope(q_pe.transpose(1, 0, 2), pos, inv_freq)   # (nh, T, dr)
    k_pe = rope(k_pe, pos, inv_freq)                      # (T, dr)
    Kb = g.get(f'blk.{l}.attn_k_b.weight').reshape(nh, kvl, dn)   # [h][j][i]
    Vb = g.get(f'blk.{l}.attn_v_b.weight').reshape(nh, dv, kvl)   # [h][d][j]
    k_nope = np.einsum('hji,tj->hti', Kb, c)
    v = np.einsum('hdj,tj->htd', Vb, c)
    s = np.einsum('hti,hui->htu', q_nope.transpose(1, 0, 2), k_nope)
    s = s + np.einsum('htr,ur->htu', q_pe, k_pe)
    s = s * scale
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    s[:, mask] = -np.inf
    s = s - s.max(axis=2, keepdims=True)
    P = np.exp(s)
    P = P / P.sum(axis=2, keepdims=True)
    o = np.einsum('htu,hud->thd', P, v).reshape(T, nh * dv)
    return o @ g.get(f'blk.{l}.attn_output.weight').T


def swiglu(g, f, gate, up, down):
    return (silu(f @ gate.T) * (f @ up.T)) @ down.T


def dense_ffn(g, l, f):
    return swiglu(g, f, g.get(f'blk.{l}.ffn_gate.weight'), g.get(f'blk.{l}.ffn_up.weight'),
                  g.get(f'blk.{l}.ffn_down.weight'))


def moe(g, l, f, hp):
    T = f.shape[0]
    ne, nu, eff = hp['experts'], hp['used'], hp['expert_ff']
    Wr = g.get(f'blk.{l}.ffn_gate_inp.weight')        # (E, H)
    b = g.get(f'blk.{l}.exp_probs_b.bias')[0]
    s = sigmoid(f @ Wr.T)                              # (T, E)
    sel = np.argsort(-(s + b), axis=1, kind='stable')[:, :nu]
    sw = np.take_along_axis(s, sel, axis=1)
    gw = sw / (sw.sum(axis=1, keepdims=True) + 1e-20) if hp['norm_w'] else sw
    gw = gw * hp['w_scale']
    y = np.zeros_like(f)
    H = f.shape[1]
    for e in np.unique(sel):
        rows_t, rows_k = np.nonzero(sel == e)
        ge = g.get(f'blk.{l}.ffn_gate_exps.weight', e * eff, eff)
        ue = g.get(f'blk.{l}.ffn_up_exps.weight', e * eff, eff)
        de = g.get(f'blk.{l}.ffn_down_exps.weight', e * H, H)
        out = swiglu(g, f[rows_t], ge, ue, de)
        y[rows_t] += gw[rows_t, rows_k][:, None] * out
    y += swiglu(g, f, g.get(f'blk.{l}.ffn_gate_shexp.weight'), g.get(f'blk.{l}.ffn_up_shexp.weight'),
                g.get(f'blk.{l}.ffn_down_shexp.weight'))
    return y, sel


def hparams(g):
    n_rot = int(g.meta('rope.dimension_count'))
    kl = int(g.meta('attention.key_length_mla'))
    return dict(heads=int(g.meta('attention.head_count')), rope=n_rot, nope=kl - n_rot,
                v=int(g.meta('attention.value_length_mla')), kv_lora=int(g.meta('attention.kv_lora_rank')),
                experts=int(g.meta('expert_count')), used=int(g.meta('expert_used_count')),
                expert_ff=int(g.meta('expert_feed_forward_length')),
                norm_w=bool(g.meta('expert_weights_norm')), w_scale=float(g.meta('expert_weights_scale')))


def attn_scale(g):
    kl = int(g.meta('attention.key_length_mla'))
    factor = float(g.meta('rope.scaling.factor'))
    logmul = float(g.meta('rope.scaling.yarn_log_multiplier', 0.1))
    m = 1.0 + logmul * math.log(factor)
    return kl ** -0.5 * m * m


def nextn(g, h, next_ids, h_post_norm=True, pos_offset=0, swap_halves=False):
    """docs/model.md section 8: the NextN (MTP) block. h (T, H): the trunk's final hidden of the tokens
    at positions 0..T-1 (post output_norm when h_post_norm, U4); next_ids: the ids at 1..T. Row t
    attends to rows 0..t of the block's own cache at position id t + pos_offset (U5). Returns the
    draft logits (T, vocab): the distribution of the token at t + 2."""
    hp = hparams(g)
    l = int(g.meta('block_count')) - int(g.meta('nextn_predict_layers', 0))
    n_rot = hp['rope']
    inv_freq = yarn_inv_freq(g, n_rot, False)
    e = rmsnorm(g.get(f'blk.{l}.nextn.embed_tokens.weight')[np.asarray(next_ids)],
                g.get(f'blk.{l}.nextn.enorm.weight')[0])
    hn = rmsnorm(h, g.get(f'blk.{l}.nextn.hnorm.weight')[0])
    cat = np.concatenate([hn, e] if swap_halves else [e, hn], axis=1)   # embedding half first
    x = cat @ g.get(f'blk.{l}.nextn.eh_proj.weight').T
    a = rmsnorm(x, g.get(f'blk.{l}.attn_norm.weight')[0])
    x = x + mla(g, l, a, hp, inv_freq, attn_scale(g), pos_offset)
    f = rmsnorm(x, g.get(f'blk.{l}.ffn_norm.weight')[0])
    if l < int(g.meta('leading_dense_block_count')):
        x = x + dense_ffn(g, l, f)
    else:
        x = x + moe(g, l, f, hp)[0]
    x = rmsnorm(x, g.get(f'blk.{l}.nextn.shared_head_norm.weight')[0])
    return x @ g.get(f'blk.{l}.nextn.shared_head_head.weight').T


def forward(g, ids, comb_transposed=False, no_yarn=False):
    n_rot = int(g.meta('rope.dimension_count'))
    kl = int(g.meta('attention.key_length_mla'))
    hp = dict(heads=int(g.meta('attention.head_count')), rope=n_rot, nope=kl - n_rot,
              v=int(g.meta('attention.value_length_mla')), kv_lora=int(g.meta('attention.kv_lora_rank')),
              experts=int(g.meta('expert_count')), used=int(g.meta('expert_used_count')),
              expert_ff=int(g.meta('expert_feed_forward_length')),
              norm_w=bool(g.meta('expert_weights_norm')), w_scale=float(g.meta('expert_weights_scale')))
    gating = int(g.meta('expert_gating_func', 2))
    if gating != 2:
        raise ValueError(f'expert_gating_func {gating}: 2 (sigmoid) expected')
    n_blocks = int(g.meta('block_count')) - int(g.meta('nextn_predict_layers', 0))
    n_dense = int(g.meta('leading_dense_block_count'))
    ns = int(g.meta('hyper_connection.count'))
    iters = int(g.meta('hyper_connection.sinkhorn_iterations'))
    factor = float(g.meta('rope.scaling.factor'))
    logmul = float(g.meta('rope.scaling.yarn_log_multiplier', 0.1))
    m = 1.0 + logmul * math.log(factor)
    scale = kl ** -0.5 * m * m
    inv_freq = yarn_inv_freq(g, n_rot, no_yarn)

    ids = np.asarray(ids)
    emb = g.get('token_embd.weight')[ids]              # (T, H) -- vocab small in the test models
    X = np.repeat(emb[None], ns, axis=0)
    info = dict(scale=scale, blocks=n_blocks, dense=n_dense, sel={})
    for l in range(n_blocks):
        _, post, C, u = hc(g, X, 'attn', l, iters)
        a = rmsnorm(u, g.get(f'blk.{l}.attn_norm.weight')[0])
        X = post_map(X, post, C, mla(g, l, a, hp, inv_freq, scale), comb_transposed)
        _, post, C, u = hc(g, X, 'ffn', l, iters)
        f = rmsnorm(u, g.get(f'blk.{l}.ffn_norm.weight')[0])
        if l < n_dense:
            mo = dense_ffn(g, l, f)
        else:
            mo, sel = moe(g, l, f, hp)
            info['sel'][l] = sel
        X = post_map(X, post, C, mo, comb_transposed)
    mean = X.mean(axis=0)
    h = rmsnorm(mean, g.get('output_norm.weight')[0])
    info['hidden'] = h
    info['mean'] = mean
    return h @ g.get('output.weight').T, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('model')
    ap.add_argument('--ids', required=True)
    ap.add_argument('--out', required=True)
    ap.add_argument('--comb-transposed', action='store_true')
    ap.add_argument('--no-yarn', action='store_true')
    a = ap.parse_args()
    g = Gguf(a.model)
    ids = [int(x) for x in a.ids.split(',')]
    logits, info = forward(g, ids, a.comb_transposed, a.no_yarn)
    np.save(a.out, logits)
    print(f'reference: {len(ids)} tokens, {info["blocks"]} blocks ({info["dense"]} dense), '
          f'attention scale {info["scale"]:.8f}', file=sys.stderr)


if __name__ == '__main__':
    main()
