#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Build the SentencePiece training text and the differential test corpus from text that Debian
packages install on this machine (licenses, copyright files, Python sources, man pages, the
translated strings of .mo catalogs). Deterministic: sorted file lists and a fixed random seed.

usage: make_corpus.py TRAIN_OUT TEST_OUT

The training text is not committed (it is only an input of spm_train, see README.md); the test
corpus is (tests/tokenizer/corpus.txt): it mixes held-out lines of the same sources with lines
built to hit the tokenizer's corners (emoji, control characters, long whitespace runs, invalid
UTF-8, registered specials, digits, runs of '_', tabs)."""
import glob
import gettext
import gzip
import os
import random
import sys

LANGS = ['de', 'fr', 'es', 'it', 'pt_BR', 'pl', 'cs', 'ru', 'uk', 'bg', 'el', 'tr', 'vi', 'ja',
         'zh_CN', 'zh_TW', 'ko', 'ar', 'he', 'fa', 'hi', 'bn', 'ta', 'th', 'ka', 'hy', 'am', 'fi',
         'hu', 'sv', 'nl', 'id', 'eo', 'ro', 'lt', 'sr', 'km', 'my', 'si', 'ml']

SPECIALS = ['<_start>', '<_end>', '<_pad>', '<_user>', '<_bot>', '<_system>', '<think>',
            '</think>', '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>']


def read_lines(path, limit):
    try:
        if path.endswith('.gz'):
            with gzip.open(path, 'rb') as f:
                data = f.read(limit)
        else:
            with open(path, 'rb') as f:
                data = f.read(limit)
    except OSError:
        return []
    text = data.decode('utf-8', errors='ignore')
    return [l for l in text.split('\n') if l.strip()]


def mo_lines(path):
    try:
        with open(path, 'rb') as f:
            t = gettext.GNUTranslations(f)
    except Exception:
        return []
    out = []
    for k, v in sorted(t._catalog.items(), key=lambda kv: str(kv[0])):
        if isinstance(v, str) and v and k:
            out.extend(x for x in v.split('\n') if x.strip())
    return out


def sources():
    """(name, lines) of every source, sorted by name."""
    srcs = []
    for p in sorted(glob.glob('/usr/share/common-licenses/*')):
        srcs.append(('license', read_lines(p, 1 << 20)))
    for p in sorted(glob.glob('/usr/share/doc/*/copyright'))[:400]:
        srcs.append(('copyright', read_lines(p, 64 << 10)))
    for p in sorted(glob.glob('/usr/lib/python3.11/*.py'))[:150]:
        srcs.append(('python', read_lines(p, 256 << 10)))
    for p in sorted(glob.glob('/usr/share/man/man1/*.gz'))[:300]:
        srcs.append(('man', read_lines(p, 64 << 10)))
    for lang in LANGS:
        for p in sorted(glob.glob('/usr/share/locale/%s/LC_MESSAGES/*.mo' % lang))[:12]:
            srcs.append(('mo-' + lang, mo_lines(p)))
    return srcs


def corner_lines(rng, pool):
    """Lines built to hit the corners the real text rarely does."""
    emoji = ['😀', '👍🏽', '👨‍👩‍👧', '🇯🇵', '❤️', '🤖', '🔥', '∑', '√', '€', '₿', '𝔘𝔫𝔦', '\U0010fffd']
    ws = [' ', '  ', '   ', '\t', '\t\t', ' \t ', '\u3000', '\u00a0', '\u2009']
    ctrl = [chr(c) for c in range(1, 32) if c != 10] + ['\x7f', '\x85', '\u200b', '\u200d', '\ufeff']
    out = []
    for i in range(3000):
        base = rng.choice(pool)
        words = base.split(' ')
        kind = i % 12
        if kind == 0:   # emoji sprinkled in
            words.insert(rng.randrange(len(words) + 1), rng.choice(emoji) * rng.randint(1, 3))
            s = ' '.join(words)
        elif kind == 1:  # control characters
            s = ''.join(c + (rng.choice(ctrl) if rng.random() < 0.15 else '') for c in base)
        elif kind == 2:  # long whitespace runs, leading and trailing too
            s = rng.choice(ws) * rng.randint(1, 40) + (rng.choice(ws) * rng.randint(1, 9)).join(words)
            s += ' ' * rng.randint(0, 20)
        elif kind == 3:  # registered specials between text, at the ends, back to back
            parts = []
            for w in words[:12]:
                parts.append(w)
                if rng.random() < 0.4:
                    parts.append(rng.choice(SPECIALS) * rng.randint(1, 2))
            s = ' '.join(parts)
            if rng.random() < 0.5:
                s = rng.choice(SPECIALS) + s
            if rng.random() < 0.5:
                s = s + rng.choice(SPECIALS)
        elif kind == 4:  # numbers and underscores (user-defined pieces)
            s = ' '.join(w + ('_' * rng.randint(1, 7) if rng.random() < 0.3 else '') +
                         (str(rng.randint(0, 10**rng.randint(1, 12))) if rng.random() < 0.3 else '')
                         for w in words)
        elif kind == 5:  # near-specials that are not specials
            s = ' '.join(words) + ' ' + rng.choice(['<think', '</think', '<_end', '<_sep>', '<tool',
                                                    '<<think>>', '<_observation>', '< think>',
                                                    '<_unk>', '<0x41>', '</s>', '<s>'])
        elif kind == 6:  # mixed scripts in one line
            s = ' '.join([rng.choice(pool).split(' ')[0] for _ in range(rng.randint(2, 10))])
        elif kind == 7:  # rare characters that are likely outside the vocab (byte fallback)
            s = ''.join(chr(rng.choice([rng.randint(0x4e00, 0x9fff), rng.randint(0xac00, 0xd7a3),
                                        rng.randint(0x1f300, 0x1faff), rng.randint(0x10000, 0x1ffff)]))
                        for _ in range(rng.randint(1, 12)))
            s = base[:20] + s
        elif kind == 8:  # code-ish
            s = '    ' * rng.randint(0, 4) + 'def f_%d(x, y=%d):  # %s' % (i, rng.randint(0, 999), base[:40])
        elif kind == 9:  # a single character / very short
            s = rng.choice(base) if base else 'a'
        elif kind == 10:  # leading/trailing spaces only variants
            s = rng.choice(['', ' ', '  ', '\t', ' ' * 17]) + base + rng.choice(['', ' ', '  ', '\t'])
        else:  # long line
            s = ' '.join(rng.choice(pool) for _ in range(rng.randint(5, 20)))
        out.append(s.encode('utf-8', errors='surrogatepass'))
    # invalid UTF-8: stray continuation bytes, truncated sequences, overlongs, surrogates, 0xFF
    bad = [b'\x80', b'\xbf', b'\xc0\xaf', b'\xc3', b'\xe2\x82', b'\xf0\x9f\x98', b'\xed\xa0\x80',
           b'\xf4\x90\x80\x80', b'\xfe', b'\xff', b'\xf8\x88\x80\x80\x80', b'\xc2\x41', b'\xe0\x80\x80']
    for i in range(600):
        b = rng.choice(pool).encode()
        pos = rng.randrange(len(b) + 1)
        b = b[:pos] + rng.choice(bad) * rng.randint(1, 3) + b[pos:]
        if i % 5 == 0:
            b = rng.choice(bad) + b
        out.append(b)
    return out


def main():
    train_out, test_out = sys.argv[1], sys.argv[2]
    rng = random.Random(20261130)
    train, test = [], []
    for name, lines in sources():
        for l in lines:
            # ~7% of the lines are held out for the test corpus
            (test if rng.random() < 0.07 else train).append(l)
    with open(train_out, 'w', encoding='utf-8') as f:
        for l in train:
            f.write(l + '\n')
    rng.shuffle(test)
    test = [l for l in test if len(l.encode()) < 2000][:9000]
    pool = test[:]
    lines = [l.encode('utf-8') for l in test] + corner_lines(rng, pool)
    lines = [l.replace(b'\n', b' ') for l in lines]
    with open(test_out, 'wb') as f:
        for l in lines:
            f.write(l + b'\n')
    print('train: %d lines, test: %d lines' % (len(train), len(lines)), file=sys.stderr)


if __name__ == '__main__':
    main()
