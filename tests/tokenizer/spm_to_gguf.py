#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Write a GGUF v3 file holding only the tokenizer of a SentencePiece .model (no tensors), with
the tokenizer.ggml.* keys of docs/model.md §2.3. The .model is read and the file written by the
exporter's modules (train/spm_model.py: no protobuf package needed; train/gguf_write.py).

usage: spm_to_gguf.py MODEL OUT.gguf"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'train'))
import gguf_write as gw  # noqa: E402
from spm_model import read_model  # noqa: E402


def main():
    convert(sys.argv[1], sys.argv[2])


def convert(model, out_path):
    pieces, add_dummy_prefix = read_model(model)
    ids = {p: i for i, (p, _, _) in reversed(list(enumerate(pieces)))}
    w = gw.Writer()
    w.str('general.architecture', 'xing4_0')
    w.str('general.name', 'spm-bpe8k tokenizer fixture')
    w.str('tokenizer.ggml.model', 'llama')
    w.arr('tokenizer.ggml.tokens', gw.STR, [p for p, _, _ in pieces])
    w.arr('tokenizer.ggml.scores', gw.F32V, [s for _, s, _ in pieces])
    w.arr('tokenizer.ggml.token_type', gw.I32, [t for _, _, t in pieces])
    w.bool('tokenizer.ggml.add_bos_token', False)
    w.bool('tokenizer.ggml.add_eos_token', False)
    w.bool('tokenizer.ggml.add_space_prefix', add_dummy_prefix)
    # ids by piece text (Xing4 names first, sentencepiece's defaults second); absent: no key
    for key, names in (('unknown', [b'<_unk>', b'<unk>']), ('bos', [b'<_start>', b'<s>']),
                       ('eos', [b'<_end>', b'</s>']), ('padding', [b'<_pad>', b'<pad>'])):
        found = [ids[n] for n in names if n in ids]
        if found:
            w.u32('tokenizer.ggml.%s_token_id' % key, found[0])
    w.write(out_path)  # no tensors: the (empty) data section starts aligned


if __name__ == '__main__':
    main()
