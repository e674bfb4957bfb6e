#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Write a GGUF v3 file holding only the tokenizer of a SentencePiece .model (no tensors), with
the tokenizer.ggml.* keys of docs/model.md §2.3. The .model protobuf is read by hand (field numbers from
sentencepiece_model.proto: ModelProto.pieces = 1, SentencePiece.piece = 1, .score = 2,
.type = 3; NormalizerSpec = 3 with add_dummy_prefix = 3), so no protobuf package is needed.

usage: spm_to_gguf.py MODEL OUT.gguf"""
import struct
import sys


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


def gstr(s):
    return struct.pack('<Q', len(s)) + s


def kv(key, vtype, payload):
    return gstr(key.encode()) + struct.pack('<I', vtype) + payload


def main():
    convert(sys.argv[1], sys.argv[2])


def convert(model, out_path):
    pieces, add_dummy_prefix = read_model(model)
    ids = {p: i for i, (p, _, _) in reversed(list(enumerate(pieces)))}
    kvs = [
        kv('general.architecture', 8, gstr(b'xing4_0')),
        kv('general.name', 8, gstr(b'spm-bpe8k tokenizer fixture')),
        kv('tokenizer.ggml.model', 8, gstr(b'llama')),
        kv('tokenizer.ggml.tokens', 9, struct.pack('<IQ', 8, len(pieces)) +
           b''.join(gstr(p) for p, _, _ in pieces)),
        kv('tokenizer.ggml.scores', 9, struct.pack('<IQ', 6, len(pieces)) +
           b''.join(struct.pack('<f', s) for _, s, _ in pieces)),
        kv('tokenizer.ggml.token_type', 9, struct.pack('<IQ', 5, len(pieces)) +
           b''.join(struct.pack('<i', t) for _, _, t in pieces)),
        kv('tokenizer.ggml.add_bos_token', 7, b'\0'),
        kv('tokenizer.ggml.add_eos_token', 7, b'\0'),
        kv('tokenizer.ggml.add_space_prefix', 7, b'\1' if add_dummy_prefix else b'\0'),
    ]
    # ids by piece text (Xing4 names first, sentencepiece's defaults second); absent: no key
    for key, names in (('unknown', [b'<_unk>', b'<unk>']), ('bos', [b'<_start>', b'<s>']),
                       ('eos', [b'<_end>', b'</s>']), ('padding', [b'<_pad>', b'<pad>'])):
        found = [ids[n] for n in names if n in ids]
        if found:
            kvs.append(kv('tokenizer.ggml.%s_token_id' % key, 4, struct.pack('<I', found[0])))
    out = b'GGUF' + struct.pack('<IQQ', 3, 0, len(kvs)) + b''.join(kvs)
    out += b'\0' * (-len(out) % 32)  # the (empty) data section starts aligned
    with open(out_path, 'wb') as f:
        f.write(out)


if __name__ == '__main__':
    main()
