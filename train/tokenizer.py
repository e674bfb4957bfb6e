#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train the demo model's SentencePiece BPE tokenizer with Debian's `spm_train`, and encode text the
way the engine does (chat/tokenizer.c, docs/model.md §7).

    tokenizer.py train  [--data train/data] [--vocab 8192] [--out train/tok/xing4-demo]
    tokenizer.py encode [--data train/data] [--model train/tok/xing4-demo.model] [--kinds pretrain,chat,agent]
    tokenizer.py check  --model M --x4-tokenize build/tools/x4-tokenize --gguf any.gguf

Vocabulary layout (the release's, docs/model.md §7): 0 `<_unk>`, 1 `<_start>`, 2 `<_end>`, 3 `<_pad>`,
4..23 the control pieces `<_user>` `<_bot>` `<_system>` `<_observation>` `<_sep>` `<think>` `</think>`
`<tool_call>` `</tool_call>` `<tool_response>` `</tool_response>` `<_control1..9>`, then user-defined
pieces (digits, newline, tab, runs of `_`, and the tool-call markup `<param_key>` … which the
template writes as text), then the 256 byte pieces, then the BPE pieces. Identity normalisation,
dummy prefix on, extra whitespace kept, byte fallback: what the engine's encoder expects.

`encode` writes uint16 token files (vocab <= 65536) for train.py: DATA/tokens/{pretrain,chat,agent}_
{train,heldout}.bin (agent: chat/agent_*.jsonl, the long agent dialogues, in files of their own so
train.py can take them in long windows that start at a dialogue; --kinds re-encodes only some), a copy of the tokenizer that made them (tokenizer.model), plus a loss mask for chat (1 = a token the assistant writes: everything after
a `<_bot>` up to and including its `<_end>`), DATA/tokens/meta.json with the counts. The engine's
encoding is reproduced: split on the 12 registered specials, every other chunk encoded separately
(its own dummy prefix); `check` compares ids with the engine's x4-tokenize.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

import numpy as np

CONTROL = ['<_user>', '<_bot>', '<_system>', '<_observation>', '<_sep>', '<think>', '</think>', '<tool_call>',
           '</tool_call>', '<tool_response>', '</tool_response>'] + [f'<_control{i}>' for i in range(1, 10)]
# the specials the engine splits text on (chat/tokenizer.c); the others never come from text
REGISTERED = ['<_start>', '<_end>', '<_pad>', '<_user>', '<_bot>', '<_system>', '<think>', '</think>',
              '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>']
USER = [str(d) for d in range(10)] + ['\n', '\t'] + ['_' * n for n in range(1, 17)] + \
       ['<param_key>', '</param_key>', '<param_value>', '</param_value>']
SPLIT = re.compile('(' + '|'.join(re.escape(s) for s in REGISTERED) + ')')
BOT, END = 5, 2


def train(a):
    data = os.path.abspath(a.data)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    inp = os.path.join(os.path.dirname(os.path.abspath(a.out)), 'spm-input.txt')
    rng = random.Random(1)
    n = 0
    with open(inp, 'w') as f:
        for path in ('corpus/train.jsonl', 'chat/train.jsonl'):
            p = os.path.join(data, path)
            if not os.path.exists(p):
                continue
            for ln in open(p):
                text = json.loads(ln)['text']
                text = SPLIT.sub('\n', text)
                for line in text.split('\n'):
                    line = line.strip('\r')
                    if line.strip() and rng.random() < a.sample:
                        f.write(line[:4000] + '\n')
                        n += 1
    args = ['spm_train', f'--input={inp}', f'--model_prefix={a.out}', f'--vocab_size={a.vocab}',
            '--model_type=bpe', '--character_coverage=0.9995', '--byte_fallback=true',
            '--normalization_rule_name=identity', '--add_dummy_prefix=true', '--remove_extra_whitespaces=false',
            '--allow_whitespace_only_pieces=true', '--split_digits=true', '--max_sentencepiece_length=16',
            '--unk_id=0', '--bos_id=1', '--eos_id=2', '--pad_id=3',
            '--unk_piece=<_unk>', '--bos_piece=<_start>', '--eos_piece=<_end>', '--pad_piece=<_pad>',
            '--control_symbols=' + ','.join(CONTROL),
            '--user_defined_symbols=' + ','.join(USER),
            f'--input_sentence_size={a.sentences}', '--shuffle_input_sentence=true',
            f'--num_threads={os.cpu_count() or 2}', '--minloglevel=1']
    subprocess.run(args, check=True)
    import export  # the .model reader
    pieces, scores, types = export.read_spm_model(a.out + '.model')
    assert pieces[:4] == ['<_unk>', '<_start>', '<_end>', '<_pad>'], pieces[:4]
    assert pieces[4:24] == CONTROL, pieces[4:24]
    print(json.dumps(dict(model=a.out + '.model', vocab=len(pieces), training_lines=n,
                          user_defined=sum(t == 4 for t in types), bytes=sum(t == 6 for t in types))))


class Encoder:
    """The engine's encode: registered specials by id, every other chunk through SentencePiece."""

    def __init__(self, model):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=model)
        self.special = {s: self.sp.piece_to_id(s) for s in REGISTERED}

    def encode(self, text):
        out = []
        for part in SPLIT.split(text):
            if not part:
                continue
            if part in self.special:
                out.append(self.special[part])
            else:
                out += self.sp.encode(part)
        return out


def chat_mask(ids):
    m = np.zeros(len(ids), np.uint8)
    inside = False
    for i, t in enumerate(ids):
        if inside:
            m[i] = 1
            if t == END:
                inside = False
        elif t == BOT:
            inside = True
    return m


def encode(a):
    data = os.path.abspath(a.data)
    enc = Encoder(a.model)
    if enc.sp.get_piece_size() > 65536:
        sys.exit('vocabulary over 65536: uint16 token files cannot hold it')
    out = os.path.join(data, 'tokens')
    os.makedirs(out, exist_ok=True)
    meta = dict(vocab=enc.sp.get_piece_size(), files={})
    kinds = a.kinds.split(',')
    mp = os.path.join(out, 'meta.json')
    if set(kinds) != {'pretrain', 'chat', 'agent'} and os.path.exists(mp):
        old = json.load(open(mp))        # re-encoding some kinds: keep the others' entries
        if old.get('vocab') == meta['vocab']:
            meta['files'] = old['files']
    for kind, path, pre in (('pretrain', 'corpus', ''), ('chat', 'chat', ''), ('agent', 'chat', 'agent_')):
        if kind not in kinds:
            continue
        for split in ('train', 'heldout'):
            p = os.path.join(data, path, f'{pre}{split}.jsonl')
            if not os.path.exists(p):
                continue
            toks, mask, nbytes, ndocs = [], [], 0, 0
            for ln in open(p):
                text = json.loads(ln)['text']
                nbytes += len(text.encode())
                ids = enc.encode(text)
                if kind == 'pretrain':
                    ids = ids + [END]                       # documents separated by <_end>
                    toks.append(np.asarray(ids, np.uint16))
                else:
                    ids = [1] + ids                          # <_start> then the conversation
                    toks.append(np.asarray(ids, np.uint16))
                    mask.append(chat_mask(ids))
                ndocs += 1
            t = np.concatenate(toks) if toks else np.zeros(0, np.uint16)
            t.tofile(os.path.join(out, f'{kind}_{split}.bin'))
            if mask:
                np.concatenate(mask).tofile(os.path.join(out, f'{kind}_{split}.mask'))
            meta['files'][f'{kind}_{split}'] = dict(tokens=int(t.size), bytes=nbytes, docs=ndocs,
                                                    bytes_per_token=round(nbytes / max(t.size, 1), 3))
    # the model that made these ids travels with them (pack.sh, export.py --spm)
    import hashlib
    import shutil
    shutil.copyfile(a.model, os.path.join(out, 'tokenizer.model'))
    meta['tokenizer_sha256'] = hashlib.sha256(open(a.model, 'rb').read()).hexdigest()
    json.dump(meta, open(os.path.join(out, 'meta.json'), 'w'), indent=1)
    print(json.dumps(meta))


def check(a):
    """Ids of a few texts from our encoder and from the engine's tokenizer (x4-tokenize over a GGUF
    that holds this vocabulary)."""
    enc = Encoder(a.model)
    texts = ['What does tar do?', 'tar -xzf archive.tar.gz\n\tdone  twice',
             '<_system><_user>What is the weather in Paris?<_bot><think>\nI call it.\n</think>'
             '<tool_call>get_weather<param_key>city</param_key><param_value>Paris</param_value></tool_call><_end>',
             'Überprüfung: naïve café — 3.14159, x_y__z', 'GNU tar is an archiving program (an archive).']
    texts = [t.replace('\n', ' ') for t in texts]        # x4-tokenize reads one text a line
    texts += [json.loads(ln)['text'].replace('\n', ' ') for i, ln in
              zip(range(200), open(os.path.join(a.data, 'chat', 'heldout.jsonl')))]
    texts += [json.loads(ln)['text'][:2000].replace('\n', ' ') for i, ln in
              zip(range(100), open(os.path.join(a.data, 'corpus', 'heldout.jsonl')))]
    r = subprocess.run([a.x4_tokenize, '--model', a.gguf], input='\n'.join(texts) + '\n',
                       capture_output=True, text=True, check=True)
    lines = r.stdout.split('\n')
    bad = 0
    for t, line in zip(texts, lines):
        ours = enc.encode(t)
        theirs = [int(x) for x in line.split()]
        if ours != theirs:
            bad += 1
            if bad <= 3:
                print(f'MISMATCH {t[:200]!r}\n ours   {ours[:40]}\n engine {theirs[:40]}')
    print(f'{len(texts) - bad}/{len(texts)} texts encode identically')
    return 1 if bad else 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('cmd', choices=['train', 'encode', 'check'])
    ap.add_argument('--data', default=os.path.join(here, 'data'))
    ap.add_argument('--vocab', type=int, default=8192)
    ap.add_argument('--sample', type=float, default=1.0, help='fraction of lines given to spm_train')
    ap.add_argument('--sentences', type=int, default=2000000)
    ap.add_argument('--out', default=os.path.join(here, 'tok', 'xing4-demo'))
    ap.add_argument('--model', default=os.path.join(here, 'tok', 'xing4-demo.model'))
    ap.add_argument('--kinds', default='pretrain,chat,agent',
                    help='encode: which token files to (re)write: pretrain, chat, agent (chat/agent_*.jsonl)')
    ap.add_argument('--x4-tokenize')
    ap.add_argument('--gguf')
    a = ap.parse_args()
    if a.cmd == 'train':
        train(a)
    elif a.cmd == 'encode':
        encode(a)
    else:
        sys.exit(check(a))


if __name__ == '__main__':
    main()
