# SPDX-License-Identifier: MIT
"""A small GGUF v3 writer (docs/model.md §2.1) and the ggml quantizers the release's types need:
BF16, F16, Q8_0, IQ4_NL and Q6_K (block layouts of docs/model.md §6), in numpy only, so the exporter
runs wherever PyTorch does (the GPU machine has no compiler-built xing4d tree to lean on).

The quantizers follow ggml's reference algorithms in spirit (no importance matrix): IQ4_NL tries 15
scales per 32-value block and keeps the one of least squared error (the least-squares scale for the
chosen codes); Q6_K takes per-16 scales from the largest magnitude, 8-bit sub-scales under one fp16
super-scale, then requantizes with the final scales.
"""
import struct

import numpy as np

T_F32, T_F16, T_Q8_0, T_Q6_K, T_IQ4_NL, T_BF16 = 0, 1, 8, 14, 20, 30
TYPE_NAMES = {'F32': T_F32, 'F16': T_F16, 'Q8_0': T_Q8_0, 'Q6_K': T_Q6_K, 'IQ4_NL': T_IQ4_NL, 'BF16': T_BF16}
BLOCK = {T_F32: 1, T_F16: 1, T_BF16: 1, T_Q8_0: 32, T_IQ4_NL: 32, T_Q6_K: 256}

IQ4NL_K = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64 = range(13)


def to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = 0x7FC0
    return r


def _nearest_iq4(v):
    """Index of the nearest codebook value, v (..., n)."""
    edges = (IQ4NL_K[1:] + IQ4NL_K[:-1]) / 2
    return np.searchsorted(edges, v)


def quant_iq4_nl(x):
    """x (rows, k) float32, k % 32 == 0 -> bytes (rows, k/32*18)."""
    rows, k = x.shape
    b = x.reshape(-1, 32).astype(np.float32)
    n = b.shape[0]
    amax_i = np.abs(b).argmax(1)
    mx = b[np.arange(n), amax_i]                      # signed value of largest magnitude
    best_d = np.zeros(n, np.float32)
    best_err = np.full(n, np.inf, np.float32)
    best_idx = np.zeros((n, 32), np.int64)
    safe = np.where(mx == 0, 1.0, mx)
    w = b * b + 1e-12                                 # weight like ggml without an imatrix: x^2
    for itry in range(-7, 8):
        iscale = (IQ4NL_K[0] + 0.1 * itry) / safe     # maps mx onto about -127
        idx = _nearest_iq4(b * iscale[:, None])
        q = IQ4NL_K[idx]
        sumqx = (w * q * b).sum(1)
        sumq2 = (w * q * q).sum(1)
        d = np.where(sumq2 > 0, sumqx / np.maximum(sumq2, 1e-30), 0.0).astype(np.float32)
        err = (w * (b - d[:, None] * q) ** 2).sum(1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_d = np.where(better, d, best_d)
        best_idx = np.where(better[:, None], idx, best_idx)
    d16 = best_d.astype(np.float16)
    # requantize against the fp16-rounded scale
    d32 = d16.astype(np.float32)
    inv = np.where(d32 != 0, 1.0 / np.where(d32 == 0, 1, d32), 0.0)
    idx = np.where((d32 != 0)[:, None], _nearest_iq4(b * inv[:, None]), 8)
    qs = (idx[:, :16] | (idx[:, 16:] << 4)).astype(np.uint8)
    out = np.empty((n, 18), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(n, 2)
    out[:, 2:] = qs
    return out.reshape(rows, k // 32 * 18)


def quant_q8_0(x):
    rows, k = x.shape
    b = x.reshape(-1, 32).astype(np.float32)
    n = b.shape[0]
    d = np.abs(b).max(1) / 127.0
    d16 = d.astype(np.float16)
    d32 = d16.astype(np.float32)
    q = np.where(d32[:, None] > 0, np.round(b / np.where(d32 == 0, 1, d32)[:, None]), 0).clip(-127, 127).astype(np.int8)
    out = np.empty((n, 34), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(n, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(rows, k // 32 * 34)


def quant_q6_k(x):
    """x (rows, k), k % 256 == 0 -> bytes (rows, k/256*210): ql[128] qh[64] scales[16] d(fp16)."""
    rows, k = x.shape
    b = x.reshape(-1, 256).astype(np.float32)
    n = b.shape[0]
    sub = b.reshape(n, 16, 16)
    ai = np.abs(sub).argmax(2)
    mx = np.take_along_axis(sub, ai[..., None], 2)[..., 0]      # (n, 16) signed
    s = mx / -32.0                                               # per-16 scale: mx -> -32
    si = np.abs(s).argmax(1)
    max_scale = s[np.arange(n), si]
    iscale = np.where(max_scale != 0, -128.0 / np.where(max_scale == 0, 1, max_scale), 0.0)
    sc = np.clip(np.round(iscale[:, None] * s), -128, 127).astype(np.int8)
    d = np.where(iscale != 0, 1.0 / np.where(iscale == 0, 1, iscale), 0.0)
    d16 = d.astype(np.float16)
    dd = d16.astype(np.float32)[:, None] * sc.astype(np.float32)     # (n, 16)
    L = np.where(dd[..., None] != 0, np.round(sub / np.where(dd == 0, 1, dd)[..., None]), 0)
    L = (L.clip(-32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)    # halves
    q1, q2, q3, q4 = L[:, :, 0:32], L[:, :, 32:64], L[:, :, 64:96], L[:, :, 96:128]
    ql = np.concatenate(((q1 & 0xF) | ((q3 & 0xF) << 4), (q2 & 0xF) | ((q4 & 0xF) << 4)), axis=2)  # (n,2,64)
    qh = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)                        # (n,2,32)
    out = np.empty((n, 210), np.uint8)
    out[:, 0:128] = ql.reshape(n, 128)
    out[:, 128:192] = qh.reshape(n, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d16.view(np.uint8).reshape(n, 2)
    return out.reshape(rows, k // 256 * 210)


def encode(x, ty):
    """float array in GGUF row-major order (last axis = ne0) -> bytes of type ty."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if ty == T_F32:
        return x.tobytes()
    if ty == T_F16:
        return x.astype(np.float16).tobytes()
    if ty == T_BF16:
        return to_bf16(x).tobytes()
    k = x.shape[-1]
    if k % BLOCK[ty]:
        raise ValueError(f'rows of {k} values are not whole blocks of {BLOCK[ty]}')
    x2 = x.reshape(-1, k)
    q = {T_Q8_0: quant_q8_0, T_IQ4_NL: quant_iq4_nl, T_Q6_K: quant_q6_k}[ty]
    out = []
    for i in range(0, x2.shape[0], 4096):
        out.append(q(x2[i:i + 4096]).tobytes())
    return b''.join(out)


class Writer:
    def __init__(self, alignment=32):
        self.kv = []
        self.tensors = []    # (name, ne, type, bytes)
        self.alignment = alignment

    def add(self, key, vtype, value, elem=None):
        self.kv.append((key, vtype, value, elem))

    def u32(self, k, v): self.add(k, U32, int(v))
    def f32(self, k, v): self.add(k, F32V, float(v))
    def str(self, k, v): self.add(k, STR, v)
    def bool(self, k, v): self.add(k, BOOL, bool(v))
    def arr(self, k, elem, v): self.add(k, ARR, v, elem)

    def tensor(self, name, array, ty):
        a = np.asarray(array, dtype=np.float32)
        ne = list(reversed(a.shape))
        self.tensors.append((name, ne, ty, encode(a, ty)))

    @staticmethod
    def _s(s):
        """A GGUF string: text, or bytes as they are (a vocabulary's pieces as read)."""
        b = s if isinstance(s, bytes) else s.encode('utf-8')
        return struct.pack('<Q', len(b)) + b

    def _val(self, t, v, elem=None):
        fmt = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32V: '<f', BOOL: '<?',
               U64: '<Q', I64: '<q', F64: '<d'}
        if t in fmt:
            return struct.pack(fmt[t], v)
        if t == STR:
            return self._s(v)
        if t == ARR:
            out = [struct.pack('<IQ', elem, len(v))]
            if elem == STR:
                out += [self._s(s) for s in v]
            elif elem == F32V:
                out.append(np.asarray(v, '<f4').tobytes())
            elif elem == I32:
                out.append(np.asarray(v, '<i4').tobytes())
            else:
                out += [struct.pack(fmt[elem], x) for x in v]
            return b''.join(out)
        raise ValueError(t)

    def write(self, path):
        al = self.alignment
        head = [b'GGUF', struct.pack('<IQQ', 3, len(self.tensors), len(self.kv))]
        for k, t, v, e in self.kv:
            head += [self._s(k), struct.pack('<I', t), self._val(t, v, e)]
        off = 0
        offsets = []
        for name, ne, ty, data in self.tensors:
            offsets.append(off)
            head += [self._s(name), struct.pack('<I', len(ne)), struct.pack(f'<{len(ne)}Q', *ne),
                     struct.pack('<IQ', ty, off)]
            off += (len(data) + al - 1) // al * al
        h = b''.join(head)
        with open(path, 'wb') as f:
            f.write(h)
            f.write(b'\0' * ((-len(h)) % al))
            for (name, ne, ty, data), o in zip(self.tensors, offsets):
                f.write(data)
                f.write(b'\0' * ((-len(data)) % al))
        return len(h) + ((-len(h)) % al) + off
