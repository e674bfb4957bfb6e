#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of fuzz-gguf: small valid GGUF files covering every value type, nested
arrays, v2/v3, custom alignments and several tensor types, plus near-valid ones (one field off)
so the fuzzer starts next to each check. Deterministic; run from anywhere:
    /usr/bin/python3 tests/fuzz/make-gguf-corpus.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32_T, F16_T, Q8_0, Q6_K, IQ4_NL, BF16 = 0, 1, 8, 14, 20, 30
BLOCK = {F32_T: (1, 4), F16_T: (1, 2), Q8_0: (32, 34), Q6_K: (256, 210), IQ4_NL: (32, 18),
         BF16: (1, 2)}
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t in SCALAR:
        return struct.pack(SCALAR[t], v)
    if t == STR:
        return s(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)


def gguf(kvs, tensors, version=3, alignment=None, data_fill=None):
    """kvs: [(key, type, value)]; tensors: [(name, ne, type)], laid out in order, aligned."""
    align = alignment or 32
    if alignment is not None:
        kvs = kvs + [("general.alignment", U32, alignment)]
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + value(t, v)
    offset, sizes = 0, []
    for name, ne, ty in tensors:
        n = 1
        for d in ne:
            n *= d
        bs, ts = BLOCK[ty]
        size = n // bs * ts
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ty, offset)
        sizes.append((offset, size))
        offset = (offset + size + align - 1) // align * align
    if tensors:
        out += b"\0" * (-len(out) % align)
        data = bytearray(offset if sizes else 0)
        for i in range(len(data)):
            data[i] = (i * 131 + 7) & 0xff if data_fill is None else data_fill
        out += bytes(data[: sizes[-1][0] + sizes[-1][1]])
    return out


BASE_KVS = [("general.architecture", STR, "xing4_0"), ("general.file_type", U32, 25),
            ("xing4_0.block_count", U32, 3)]
TENSORS = [("token_embd.weight", [16, 8], BF16), ("output_norm.weight", [16], F32_T),
           ("blk.0.ffn_up.weight", [32, 4], IQ4_NL), ("output.weight", [256, 2], Q6_K),
           ("blk.0.attn_q_a.weight", [32, 2], Q8_0)]

ALL_TYPES = [
    ("u8", U8, 200), ("i8", I8, -5), ("u16", U16, 60000), ("i16", I16, -30000),
    ("u32", U32, 4000000000), ("i32", I32, -2000000000), ("f32", F32, 1.5), ("bool", BOOL, 1),
    ("str", STR, "h\u00e9llo \u2713"), ("empty", STR, ""), ("u64", U64, 2**64 - 1),
    ("i64", I64, -2**63), ("f64", F64, -0.125),
    ("arr.u8", ARR, (U8, [1, 2, 255])), ("arr.f32", ARR, (F32, [0.25, -3.0])),
    ("arr.bool", ARR, (BOOL, [0, 1])), ("arr.str", ARR, (STR, ["a", "", "\u00fc"])),
    ("arr.empty", ARR, (STR, [])),
    ("arr.nested", ARR, (ARR, [(I32, [1, 2]), (I32, []), (I32, [3])])),
    ("arr.deep", ARR, (ARR, [(ARR, [(STR, ["x", "yz"])]), (ARR, [(STR, [])])])),
]

VOCAB = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(16)] + \
        ["\u2581the", "\u2581a", "ing", "\u4f60\u597d", "\U0001f600"]
TOKENIZER = [("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, VOCAB)),
             ("tokenizer.ggml.scores", ARR, (F32, [float(-i) for i in range(len(VOCAB))])),
             ("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3] + [6] * 16 + [1] * 5)),
             ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.add_bos_token", BOOL, 0)]


def deep(levels):
    v = (U8, [42])
    for _ in range(levels - 1):
        v = (ARR, [v])
    return v


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {
        "valid-minimal": gguf([("general.architecture", STR, "xing4_0")], []),
        "valid-all-types": gguf(ALL_TYPES, []),
        "valid-tensors-v3": gguf(BASE_KVS, TENSORS),
        "valid-tensors-v2": gguf(BASE_KVS, TENSORS[:3], version=2),
        "valid-align-64": gguf(BASE_KVS, TENSORS[:3], alignment=64),
        "valid-align-1": gguf(BASE_KVS, TENSORS[1:3], alignment=1),
        "valid-tokenizer": gguf(BASE_KVS + TOKENIZER, TENSORS[:2]),
        "valid-deep-8": gguf([("deep", ARR, deep(8))], []),
        "valid-4d": gguf(BASE_KVS, [("blk.0.x.weight", [2, 2, 2, 2], F16_T)]),
    }
    ok = files["valid-tensors-v3"]
    near = {
        "bad-version-1": gguf(BASE_KVS, TENSORS[:2], version=1),
        "bad-deep-9": gguf([("deep", ARR, deep(9))], []),
        "bad-align-48": gguf(BASE_KVS, TENSORS[:2], alignment=48),
        "bad-utf8-key": gguf([("ab\xff", U32, 1)], []).replace(b"ab\xc3\xbf", b"ab\xff\xff"),
        "bad-utf8-token": gguf(BASE_KVS + TOKENIZER, []).replace("\u4f60".encode(), b"\xed\xa0\x80"),
        "bad-dup-key": gguf(BASE_KVS + [("general.file_type", U32, 7)], []),
        "bad-dup-tensor": gguf(BASE_KVS, TENSORS[:2] + [TENSORS[0]]),
        "bad-ragged-q8": gguf(BASE_KVS, [("w", [33, 2], F32_T)]).replace(
            struct.pack("<QQI", 33, 2, F32_T), struct.pack("<QQI", 33, 2, Q8_0)),
        "bad-dim-0": gguf(BASE_KVS, [("w", [4, 1], F32_T)]).replace(
            struct.pack("<QQI", 4, 1, F32_T), struct.pack("<QQI", 4, 0, F32_T)),
        "bad-truncated-data": ok[:-1],
        "bad-truncated-mid": ok[: len(ok) // 2],
        "bad-huge-counts": b"GGUF" + struct.pack("<IQQ", 3, 2**63, 2**63) + ok[24:200],
        "bad-overlap": gguf(BASE_KVS, TENSORS[:3]).replace(
            struct.pack("<IQ", F32_T, 256), struct.pack("<IQ", F32_T, 224)),
    }
    files.update(near)
    for name, data in sorted(files.items()):
        assert len(data) <= 8192, name
        with open(os.path.join(OUT, name + ".gguf"), "wb") as fp:
            fp.write(data)
    print("wrote %d files to %s" % (len(files), OUT))


if __name__ == "__main__":
    main()
