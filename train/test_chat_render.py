#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""train-chat-render: the chat data generator's Python rendering of the Xing4 template
(train/corpus/chatgen.py) produces the bytes the engine's built-in template renders (x4-template
-xing4), for every kind of generated conversation (commands, options, words, reasoning, tool calls
with their results, tools offered but not used). A template change in chat/ that the training
data does not follow fails here.

    test_chat_render.py X4-TEMPLATE
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus'))
import chatgen  # noqa: E402

PAGE = dict(name='tar', summary='an archiving utility', section='1', pkg='tar', heldout=False,
            description='GNU tar is an archiving program designed to store multiple files in a single file.',
            options=[['-v, --verbose', 'verbosely list files processed'],
                     ['-x, --extract', 'Extract files from an archive.'],
                     ['--exclude=PATTERN', 'Exclude files matching PATTERN, a glob(3)-style wildcard pattern.']])
WORD = dict(words=['lantern', 'lamp'], pos='noun', gloss='light in a transparent protective case; "he carried a lantern"')


def main():
    x4_template = sys.argv[1]
    rng = random.Random(5)
    samples = []
    for _ in range(4):
        samples += [(*s, None) for s in chatgen.gen_command(rng, PAGE)]
        samples += [(*s, None) for s in chatgen.gen_word(rng, WORD)]
    for _ in range(40):
        two, _ = chatgen.gen_tool(rng, ['tar', 'gzip'])
        samples += two
        samples.append(chatgen.gen_no_tool(rng, [PAGE]))
    q, r, ans = chatgen.gen_math(rng)
    samples.append(('reasoning', [{'role': 'user', 'content': q}], None, r, ans, None))
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, 'ctx.json')
        for kind, msgs, tools, reasoning, answer, calls in samples:
            ctx = {'messages': msgs, 'add_generation_prompt': True}
            if tools:
                ctx['tools'] = tools
            if reasoning is None:
                ctx['enable_thinking'] = False
            json.dump(ctx, open(p, 'w'))
            ref = subprocess.run([x4_template, '-xing4', p], capture_output=True, check=True).stdout.decode()
            ours = chatgen.render(msgs, tools, True, False if reasoning is None else None)
            text = chatgen.sample_text(msgs, tools, reasoning, answer, calls)
            if ref != ours or not text.startswith(ref):
                bad += 1
                print(f'MISMATCH ({kind}):\n engine {ref!r}\n ours   {ours!r}')
    print(f'{len(samples) - bad}/{len(samples)} conversations render byte-identically to x4-template -xing4')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
