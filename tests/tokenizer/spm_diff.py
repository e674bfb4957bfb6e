#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""SentencePiece differential test: our tokenizer (through x4-tokenize) against
python3-sentencepiece on the same model.

usage: spm_diff.py X4_TOKENIZE [SOURCE_DIR [MODEL GGUF]]

Without MODEL GGUF: the committed model, then its spm_variants.py variants (unused pieces;
no byte pieces; no dummy prefix), each checked the same way.

1. encode: every line of corpus.txt (bytes, invalid UTF-8 included) through `x4-tokenize
   --model spm-bpe8k.gguf`; the reference is what Xing4_0Tokenizer does (docs/model.md §7): split on the
   12 registered specials, sp.encode() each remaining chunk, the special's id in between.
   Ids must be 100% identical.
2. decode: our ids back through `x4-tokenize --decode`; the reference decodes each run between
   specials with sp.decode() and keeps the special's text. Identical for every line, and equal to
   the input line wherever SentencePiece itself round-trips.
3. decode of random id sequences (byte pieces, controls, unknown, specials mixed), identical.
Exit status 0 only if everything matched."""
import os
import random
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree clean when meson runs this

try:
    import sentencepiece as spm
except ImportError:
    print('python3-sentencepiece is not installed: skipped (exit 77)')
    sys.exit(77)

SPECIALS = ['<_start>', '<_end>', '<_pad>', '<_user>', '<_bot>', '<_system>', '<think>',
            '</think>', '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>']


def compare(tool, here, model, gguf):
    """Number of mismatches of x4-tokenize on GGUF against sentencepiece on MODEL."""
    print('== %s' % os.path.basename(model))
    sp = spm.SentencePieceProcessor(model_file=model)
    # the registered specials this vocab has (a vocab without them has no special rules)
    special_id = {s: sp.piece_to_id(s) for s in SPECIALS if sp.id_to_piece(sp.piece_to_id(s)) == s}
    id_special = {v: k for k, v in special_id.items()}
    split_re = re.compile(b'(' + b'|'.join(re.escape(s.encode()) for s in special_id) + b')'
                          if special_id else b'(?!)')

    def ref_encode(line):
        ids = []
        for part in split_re.split(line):
            if part.decode('latin-1') in special_id:
                ids.append(special_id[part.decode()])
            elif part:
                ids.extend(sp.encode(part))
        return ids

    def ref_decode(ids):
        out, run = [], []
        for i in ids + [None]:
            if i is None or i in id_special:
                if run:
                    out.append(sp.decode(run))
                run = []
                if i is not None:
                    out.append(id_special[i])
            else:
                run.append(i)
        return ''.join(out)

    with open(os.path.join(here, 'corpus.txt'), 'rb') as f:
        lines = f.read().split(b'\n')
    if lines and lines[-1] == b'':
        lines.pop()

    fails = 0
    p = subprocess.run([tool, '--model', gguf], input=b'\n'.join(lines) + b'\n',
                       capture_output=True, check=False)
    if p.returncode != 0:
        print('x4-tokenize failed:', p.stderr.decode(errors='replace'))
        return 1
    ours = [[int(x) for x in l.split()] for l in p.stdout.decode().split('\n')[:-1]]
    if len(ours) != len(lines):
        print('x4-tokenize printed %d lines for %d input lines' % (len(ours), len(lines)))
        return 1
    enc_ok = 0
    for i, (line, got) in enumerate(zip(lines, ours)):
        want = ref_encode(line)
        if got == want:
            enc_ok += 1
        else:
            fails += 1
            if fails <= 10:
                print('encode mismatch, line %d: %r\n  ours: %s\n  sp:   %s' % (
                    i + 1, line[:200], [sp.id_to_piece(x) for x in got][:60],
                    [sp.id_to_piece(x) for x in want][:60]))
    print('encode: %d/%d lines identical' % (enc_ok, len(lines)))

    # long texts (the encoder caches words within one long text): 200 lines joined by spaces
    long_texts = [b' '.join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
    p = subprocess.run([tool, '--model', gguf], input=b'\n'.join(long_texts) + b'\n',
                       capture_output=True, check=False)
    long_ours = [[int(x) for x in l.split()] for l in p.stdout.decode().split('\n')[:-1]]
    long_ok = sum(got == ref_encode(t) for t, got in zip(long_texts, long_ours))
    if p.returncode != 0 or long_ok != len(long_texts):
        fails += 1
    print('encode: %d/%d long texts (%d KB) identical' % (long_ok, len(long_texts),
                                                          sum(map(len, long_texts)) // 1024))

    def decode_all(seqs, extra=()):
        inp = '\n'.join(' '.join(map(str, s)) for s in seqs) + '\n'
        p = subprocess.run([tool, '--model', gguf, '--decode', *extra], input=inp.encode(),
                           capture_output=True, check=False)
        if p.returncode != 0:
            print('x4-tokenize --decode failed:', p.stderr.decode(errors='replace'))
            return None
        out = p.stdout.decode('utf-8').split('\n')
        return out[:-1]

    dec = decode_all(ours)
    if dec is None:
        return 1
    dec_ok = rt_ok = rt_total = 0
    for i, (line, ids, got) in enumerate(zip(lines, ours, dec)):
        want = ref_decode(ids)
        if got == want:
            dec_ok += 1
        else:
            fails += 1
            if fails <= 20:
                print('decode mismatch, line %d: ours %r sp %r' % (i + 1, got[:200], want[:200]))
        try:
            text = line.decode('utf-8')
        except UnicodeDecodeError:
            continue
        if want == text:  # SentencePiece round-trips this line: so must we
            rt_total += 1
            rt_ok += got == text
    print('decode: %d/%d lines identical to sp.decode; round trip: %d/%d lines where sp round-trips'
          % (dec_ok, len(lines), rt_ok, rt_total))
    fails += rt_total - rt_ok

    rng = random.Random(7)
    n = sp.get_piece_size()
    # no <0x0A>: the tool prints one decoded text per line
    pools = [list(range(0, 40)), [sp.piece_to_id('<0x%02X>' % b) for b in range(256) if b != 10],
             list(range(296, n)), [sp.piece_to_id('▁'), sp.piece_to_id('▁▁')]]
    nl = sp.piece_to_id('<0x0A>')
    pools = [[i for i in pool if i != nl or nl == sp.unk_id()] for pool in pools]
    seqs = []
    for _ in range(3000):
        seqs.append([rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 24))])
    dec = decode_all(seqs)
    if dec is None:
        return 1
    rnd_ok = sum(got == ref_decode(s) for s, got in zip(seqs, dec))
    for s, got in zip(seqs, dec):
        if got != ref_decode(s):
            fails += 1
            if fails <= 30:
                print('random decode mismatch: %s ours %r sp %r' % (
                    [sp.id_to_piece(x) for x in s], got, ref_decode(s)))
    print('random id sequences: %d/%d decodes identical' % (rnd_ok, len(seqs)))
    return fails


def cli_errors(tool, gguf):
    """x4-tokenize's errors: one line on stderr naming the problem, exit status 1."""
    cases = [
        # the rest of this line is the GGUF reader's wording: only its start is ours
        (['--model', '/nonexistent/x.gguf'], b'', 'x4-tokenize: /nonexistent/x.gguf: ...'),
        (['--model', gguf, '--decode'], b'5 x\n',
         'x4-tokenize: stdin line 1: "x" is not a token id, integers expected\n'),
        (['--model', gguf, '--decode'], b'1\n303 8000\n',
         'x4-tokenize: stdin line 2: tokenizer: token id 8000 at position 1 out of range, 0..7999 expected\n'),
        ([], b'', 'x4-tokenize: --model M.gguf is required\n'),
        (['--model', gguf, 'some text'], b'',
         "x4-tokenize: unexpected argument 'some text' (the text is read on stdin)\n"),
    ]
    fails = 0
    for args, stdin, want in cases:
        p = subprocess.run([tool, *args], input=stdin, capture_output=True, check=False)
        err = p.stderr.decode()
        ok = (err.startswith(want[:-3]) and err.count('\n') == 1 and err.endswith('\n')
              if want.endswith('...') else err == want)
        if p.returncode != 1 or not ok:
            fails += 1
            print('x4-tokenize %s: exit %d, stderr %r; expected exit 1, %r' % (
                ' '.join(args), p.returncode, p.stderr.decode(), want))
    print('x4-tokenize errors: %d/%d as expected' % (len(cases) - fails, len(cases)))
    return fails


def main():
    tool = sys.argv[1]
    src = sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
        'X4_SOURCE_DIR', os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    here = os.path.join(src, 'tests', 'tokenizer')
    if len(sys.argv) > 4:  # another model and its GGUF
        return 1 if compare(tool, here, sys.argv[3], sys.argv[4]) else 0
    model = os.path.join(here, 'spm-bpe8k.model')
    fails = compare(tool, here, model, os.path.join(here, 'spm-bpe8k.gguf'))
    fails += cli_errors(tool, os.path.join(here, 'spm-bpe8k.gguf'))
    # the variants (spm_variants.py): unused pieces; no byte pieces (unknown characters); no
    # dummy prefix
    sys.path.insert(0, here)
    import spm_to_gguf
    import spm_variants
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ('unused', 'nobyte', 'noprefix'):
            vm, vg = os.path.join(tmp, kind + '.model'), os.path.join(tmp, kind + '.gguf')
            spm_variants.make(model, kind, vm)
            spm_to_gguf.convert(vm, vg)
            fails += compare(tool, here, vm, vg)
    return 1 if fails else 0


if __name__ == '__main__':
    sys.exit(main())
