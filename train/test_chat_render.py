#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""train-chat-render: the chat data generator's Python rendering of the Xing4 template
(train/corpus/chatgen.py) produces the bytes the engine's built-in template renders (x4-template
-xing4), for every kind of generated conversation (commands, options, words, reasoning, tool calls
with their results, tools offered but not used, the long agent dialogues). A template change in
chat/ that the training data does not follow fails here.

The agent dialogues (chatgen.gen_agent: a coding agent's long system prompt with 5-30 tools) are
also checked for what training relies on: the prompt is 1,000-6,000 tokens long (estimated from
its bytes), every tool call in them parses back the way chat/outparse.c reads the param syntax and
names an offered tool with arguments that fit its JSON schema (required keys, types, enums,
nested objects and arrays), and the loss mask (tokenizer.chat_mask) covers exactly the assistant's
turns: on a character-level stand-in for the ids always, and with the SentencePiece model too when
train/tok/xing4-demo.model (or train/data/tokens/tokenizer.model) and python3-sentencepiece exist.

    test_chat_render.py X4-TEMPLATE
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, 'corpus'))
sys.path.insert(0, HERE)
import chatgen  # noqa: E402
import tokenizer  # noqa: E402

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
    agent = [chatgen.gen_agent(rng, [PAGE], [WORD], ['tar', 'gzip']) for _ in range(60)]
    samples += agent
    bad = check_agent(agent)
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
    print(f'{len(samples) - bad}/{len(samples)} checks passed: renders byte-identical to x4-template -xing4, '
          f'and the {len(agent)} agent dialogues\' lengths, tool calls and masks')
    return 1 if bad else 0


# ---- the agent dialogues' tool calls and loss masks -------------------------------------------------

def parse_calls(text):
    """The param syntax as chat/outparse.c reads it: NAME, then <param_key>K</param_key>
    <param_value>V</param_value> pairs; V is JSON when it parses as JSON other than a string, else
    the raw text."""
    calls = []
    for body in re.findall(r'<tool_call>(.*?)</tool_call>', text, re.S):
        name, rest = body.split('<param_key>', 1) if '<param_key>' in body else (body, '')
        args = {}
        for k, v in re.findall(r'(.*?)</param_key><param_value>(.*?)</param_value>(?:<param_key>|$)',
                               rest, re.S):
            try:
                j = json.loads(v)
                args[k] = v if isinstance(j, str) else j
            except ValueError:
                args[k] = v
        calls.append((name, args))
    return calls


def fits(v, sch, where):
    """Errors of v against a JSON schema (the subset the generator writes)."""
    t = sch.get('type')
    ok = {'string': lambda x: isinstance(x, str), 'integer': lambda x: isinstance(x, int) and not isinstance(x, bool),
          'number': lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
          'boolean': lambda x: isinstance(x, bool), 'array': lambda x: isinstance(x, list),
          'object': lambda x: isinstance(x, dict)}.get(t, lambda x: True)
    if not ok(v):
        return [f'{where}: {v!r} is not {t}']
    errs = []
    if 'enum' in sch and v not in sch['enum']:
        errs.append(f'{where}: {v!r} not in {sch["enum"]}')
    if t == 'object':
        props = sch.get('properties', {})
        errs += [f'{where}: missing {k}' for k in sch.get('required', []) if k not in v]
        for k, x in v.items():
            if k in props:
                errs += fits(x, props[k], f'{where}.{k}')
            elif isinstance(sch.get('additionalProperties'), dict):
                errs += fits(x, sch['additionalProperties'], f'{where}.{k}')
            elif not sch.get('additionalProperties') and props:
                errs.append(f'{where}: unknown key {k}')
    if t == 'array' and 'items' in sch:
        for i, x in enumerate(v):
            errs += fits(x, sch['items'], f'{where}[{i}]')
    return errs


def char_ids(text):
    """A stand-in tokenization: the registered specials by their ids, every other character one token."""
    ids, spans = [], []
    for part in tokenizer.SPLIT.split(text):
        if part in tokenizer.REGISTERED:
            ids.append(tokenizer.REGISTERED.index(part) + 1000)
            spans.append(part)
        else:
            ids += [100] * len(part)
            spans += list(part)
    ids = [tokenizer.BOT if spans[i] == '<_bot>' else tokenizer.END if spans[i] == '<_end>' else x
           for i, x in enumerate(ids)]
    return ids, spans


def masked_runs(ids, pieces):
    m = tokenizer.chat_mask([1] + ids)[1:]
    runs, cur = [], None
    for x, p in zip(m, pieces):
        if x:
            cur = (cur or []) + [p]
        elif cur is not None:
            runs.append(cur)
            cur = None
    if cur is not None:
        runs.append(cur)
    return runs


def check_agent(agent):
    bad = 0
    spm = None
    for mp in (os.path.join(HERE, 'tok', 'xing4-demo.model'), os.path.join(HERE, 'data', 'tokens', 'tokenizer.model')):
        if os.path.exists(mp):
            try:
                spm = tokenizer.Encoder(mp)
            except ImportError:
                pass
            break
    print('mask check with SentencePiece: ' + ('yes' if spm else 'no (no tokenizer model or python3-sentencepiece)'))
    n_calls = 0
    for kind, msgs, tools, reasoning, answer, calls in agent:
        text = chatgen.sample_text(msgs, tools, reasoning, answer, calls)
        errs = []
        prompt = chatgen.render(msgs[:next(i for i in range(len(msgs) - 1, -1, -1) if msgs[i]['role'] == 'user') + 1]
                                if kind == 'agent_tool' else msgs, tools, True)
        est = len(prompt.encode()) / 3.6
        if not 800 <= est <= 7000 or not 5 <= len(tools) <= 30:
            errs.append(f'prompt of ~{est:.0f} tokens, {len(tools)} tools')
        if len({t['function']['name'] for t in tools}) != len(tools):
            errs.append('two tools of one name')
        # the assistant's turns in order: each past one, then the trained one
        want = []
        for m in msgs:
            if m['role'] == 'assistant':
                want.append('</think>' + (m.get('content') or '') + chatgen.render_calls(m.get('tool_calls') or []) + '<_end>')
        want.append(('<think>\n' + reasoning + '\n</think>' if reasoning is not None else '</think>') + answer +
                    chatgen.render_calls(calls or []) + '<_end>')
        # tool calls: parse back, offered, schema-valid
        sent = [c['function'] for m in msgs if m['role'] == 'assistant' for c in m.get('tool_calls') or []]
        got = [c for w in want for c in parse_calls(w)]      # what the daemon parses: the model's turns
        n_calls += len(got)
        if kind == 'agent_tool' and len(got) != 1:
            errs.append(f'{len(got)} calls in a tool dialogue')
        offered = {t['function']['name']: t['function']['parameters'] for t in tools}
        for (name, args), fn in zip(got, sent):
            if name != fn['name'] or args != fn['arguments']:
                errs.append(f'call parsed as {name} {args}, sent {fn["name"]} {fn["arguments"]}')
            if name not in offered:
                errs.append(f'{name} not offered')
            else:
                errs += fits(args, offered[name], name)
        # the mask: exactly the assistant's turns
        runs = [''.join(r) for r in masked_runs(*char_ids(text))]
        if runs != want:
            errs.append(f'masked {runs!r}, want {want!r}')
        if spm:
            ids = spm.encode(text)
            m = tokenizer.chat_mask([1] + ids)[1:]
            runs, cur = [], []
            for t, x in zip(ids, m):
                if x:
                    cur.append(t)
                elif cur:
                    runs.append(cur)
                    cur = []
            runs += [cur] if cur else []
            if runs != [spm.encode(w) for w in want]:
                errs.append('SentencePiece mask runs differ from the assistant turns')
        if errs:
            bad += 1
            print(f'AGENT ({kind}): ' + '; '.join(errs)[:2000])
    print(f'agent dialogues: {len(agent)}, {sum(k == "agent_tool" for k, *_ in agent)} with a tool call '
          f'({n_calls} calls parsed back), {len(agent) - bad} passed')
    return bad


if __name__ == '__main__':
    sys.exit(main())
