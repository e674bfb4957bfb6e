#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Variants of a SentencePiece .model for rules the trained fixture does not reach, made by
rewriting its protobuf (field numbers from sentencepiece_model.proto: ModelProto.pieces = 1,
trainer_spec = 2, self_test_data = 4; SentencePiece.type = 3; TrainerSpec.byte_fallback = 35):

- unused: every 5th normal piece of two or more characters becomes UNUSED (type 5): BPE may
  merge through such a piece but never outputs it (it is split back into its halves);
- nobyte: the 256 byte pieces are removed and byte_fallback turned off: unknown characters
  become <unk>, a run of them one <unk>;
- noprefix: NormalizerSpec.add_dummy_prefix (field 3 of ModelProto field 3) off: no `▁` is
  added, and decode then keeps a leading `▁` as a space.

usage: spm_variants.py MODEL KIND OUT.model"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'train'))
from spm_model import fields  # noqa: E402


def enc_varint(v):
    out = b''
    while True:
        b, v = v & 0x7f, v >> 7
        if not v:
            return out + bytes([b])
        out += bytes([b | 0x80])


def enc_field(fn, wt, v):
    key = enc_varint(fn << 3 | wt)
    if wt == 0:
        return key + enc_varint(v)
    if wt == 2:
        return key + enc_varint(len(v)) + v
    return key + v


def rebuild(data, piece_fn, trainer_fn=None, normalizer_fn=None):
    out = b''
    for fn, wt, v in fields(data):
        if fn == 3 and wt == 2 and normalizer_fn:
            v = b''.join(enc_field(*f) for f in normalizer_fn(list(fields(v))))
        elif fn == 1 and wt == 2:
            fl = piece_fn(list(fields(v)))
            if fl is None:
                continue
            v = b''.join(enc_field(*f) for f in fl)
        elif fn == 2 and wt == 2 and trainer_fn:
            v = b''.join(enc_field(*f) for f in trainer_fn(list(fields(v))))
        elif fn == 4:
            continue  # self-test samples would no longer hold
        out += enc_field(fn, wt, v)
    return out


def make(model, kind, out):
    data = open(model, 'rb').read()
    count = [0]

    def unused(fl):
        d = {f[0]: f[2] for f in fl}
        if d.get(3, 1) == 1 and len(d[1].decode()) >= 2:
            count[0] += 1
            if count[0] % 5 == 0:
                return [f for f in fl if f[0] != 3] + [(3, 0, 5)]
        return fl

    def nobyte(fl):
        d = {f[0]: f[2] for f in fl}
        return None if d.get(3, 1) == 6 else fl

    def no_byte_fallback(fl):
        return [f for f in fl if f[0] != 35] + [(35, 0, 0)]

    if kind == 'unused':
        m = rebuild(data, unused)
    elif kind == 'nobyte':
        m = rebuild(data, nobyte, no_byte_fallback)
    elif kind == 'noprefix':
        m = rebuild(data, lambda fl: fl, None, lambda fl: [f for f in fl if f[0] != 3] + [(3, 0, 0)])
    else:
        raise ValueError(kind)
    with open(out, 'wb') as f:
        f.write(m)


if __name__ == '__main__':
    make(sys.argv[1], sys.argv[2], sys.argv[3])
