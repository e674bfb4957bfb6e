# SPDX-License-Identifier: MIT
"""A SentencePiece .model reader, standard library only: the protobuf is read by hand (field
numbers from sentencepiece_model.proto: ModelProto.pieces = 1, SentencePiece.piece = 1, .score = 2,
.type = 3; NormalizerSpec = 3 with add_dummy_prefix = 3), so no protobuf package is needed.
export.py reads the vocabulary with it, and tests/tokenizer/spm_to_gguf.py and spm_variants.py
(which run with /usr/bin/python3 from a clean clone) import it from here."""
import struct


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7f) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    """(field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        fn, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError('wire type %d' % wt)
        yield fn, wt, v


def read_model(path):
    """(pieces, add_dummy_prefix): pieces a list of (piece bytes, score, type), in id order."""
    data = open(path, 'rb').read()
    pieces = []
    add_dummy_prefix = True
    for fn, wt, v in fields(data):
        if fn == 1 and wt == 2:
            piece, score, typ = b'', 0.0, 1
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    piece = v2
                elif f2 == 2:
                    score = struct.unpack('<f', v2)[0]
                elif f2 == 3:
                    typ = v2
            pieces.append((piece, score, typ))
        elif fn == 3 and wt == 2:
            for f2, w2, v2 in fields(v):
                if f2 == 3:
                    add_dummy_prefix = bool(v2)
    return pieces, add_dummy_prefix
