#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Chat data for the demo model, generated from the corpus build.py made (issue 15):

  - commands: "What does tar do?" (the manual page's NAME line and first DESCRIPTION paragraph),
    "How do I <option help> with tar?" and "What does -v do in tar?" (the OPTIONS section);
  - words: "What does the word X mean?" (WordNet glosses);
  - short reasoning traces: arithmetic done in steps, counting letters, comparing numbers, unit
    conversions, with the steps in the thinking channel;
  - tool dialogues over six tools (weather, calculator, file listing, time, file reading, package
    search): the call, the tool's result, the final answer; and questions where tools are offered
    but none is needed.

Each conversation is rendered in the Xing4 chat format exactly as the engine's built-in template
renders it (chat/chat_xing4.c; `--check-template build/tools/x4-template` compares the bytes), with
the trained assistant turn in generation form: `<_bot><think>\\n{reasoning}\\n</think>{answer}<_end>`
or, without thinking, `<_bot></think>{answer}<_end>`.

    chatgen.py [--data train/data] [--seed 1] [--words 30000] [--math 20000] [--tools 8000]

Writes DATA/chat/{train,heldout}.jsonl: {"kind", "messages", "tools", "text"} (text = the rendered
training string), and DATA/chat/heldout_tool_prompts.jsonl: held-out tool questions with the
expected call, for measuring the tool-call rate through the bridge.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

# ---- the Xing4 template, in Python (chat/chat_xing4.h U8 choices) -----------------------------

TOOLS_HEADER = ('# Tools\n\nYou may call one or more functions to assist with the user query. '
                'The available functions are:\n<tools>\n')
TOOLS_FOOTER = ('</tools>\n\nTo call a function, write '
                '<tool_call>NAME<param_key>KEY</param_key><param_value>VALUE</param_value></tool_call> '
                'with string values written raw and other values as JSON; several calls go back to back. '
                'Results come back as <tool_response>RESULT</tool_response>.')


def tojson(v):
    """The engine's tojson (chat/jinja_eval.c): keys in insertion order, ', ' and ': ' separators,
    no escaping of non-ASCII or HTML characters (checked by --check-template)."""
    return json.dumps(v, ensure_ascii=False)


def render_calls(calls):
    out = ''
    for c in calls:
        fn = c.get('function', c)
        out += '<tool_call>' + fn['name']
        for k, v in fn['arguments'].items():
            out += f'<param_key>{k}</param_key><param_value>{v if isinstance(v, str) else tojson(v)}</param_value>'
        out += '</tool_call>'
    return out


def render(messages, tools=None, add_generation_prompt=False, enable_thinking=None):
    system = ''
    if messages and messages[0]['role'] == 'system':
        system = messages[0]['content'] or ''
    out = '<_system>' + system
    if tools:
        if system:
            out += '\n\n'
        out += TOOLS_HEADER + ''.join(tojson(t) + '\n' for t in tools) + TOOLS_FOOTER
    prev = None
    for i, m in enumerate(messages):
        r = m['role']
        if r == 'system':
            if i:
                out += '<_system>' + (m['content'] or '')
        elif r == 'user':
            out += '<_user>' + (m['content'] or '')
        elif r == 'assistant':
            out += '<_bot></think>' + (m.get('content') or '')
            if m.get('tool_calls'):
                out += render_calls(m['tool_calls'])
            out += '<_end>\n'
        elif r == 'tool':
            if prev != 'tool':
                out += '<_user>'
            out += '<tool_response>' + (m['content'] or '') + '</tool_response>'
        prev = r
    if add_generation_prompt:
        out += '<_bot></think>' if enable_thinking is False else '<_bot><think>\n'
    return out


def sample_text(messages, tools, reasoning, answer, calls=None):
    """The training string: the history rendered with the generation prompt, then the turn the
    model writes (reasoning None: the non-thinking form)."""
    prompt = render(messages, tools, True, reasoning is not None)
    turn = (reasoning + '\n</think>' if reasoning is not None else '') + answer
    if calls:
        turn += render_calls(calls)
    return prompt + turn + '<_end>'


# ---- generators ---------------------------------------------------------------------------------

def first_sentences(text, n=2, limit=400):
    parts = re.split(r'(?<=[.!?])\s+', text.strip())
    out = ' '.join(parts[:n])
    return out[:limit].rstrip()


def cap(s):
    return s[:1].upper() + s[1:] if s else s


ASKS_PER_COMMAND = 3
OPTIONS_PER_COMMAND = 6
ASK_CMD = ['What does {c} do?', 'What is {c}?', 'What is the {c} command for?', 'Explain the {c} command.',
           'What is {c} used for?', 'Tell me what {c} does.']
ASK_OPT = ['How do I {h} with {c}?', 'How can I {h} using {c}?', 'Which {c} option do I use to {h}?']
ASK_FLAG = ['What does {f} do in {c}?', 'What does the {f} option of {c} do?', 'Explain {c} {f}.']
ASK_WORD = ['What does the word "{w}" mean?', 'What does {w} mean?', 'Define {w}.', 'What is the meaning of "{w}"?',
            'What is a {w}?']


def gen_command(rng, p):
    c = p['name']
    if not p['summary'] or len(p['summary']) > 200:
        return []
    out = []
    desc = first_sentences(p['description']) if p['description'] else ''
    # the questions the demo is asked most: several phrasings a page, so commands are not drowned
    # by the (more numerous) words and tool dialogues
    for q in rng.sample(ASK_CMD, ASKS_PER_COMMAND):
        q = q.format(c=c)
        ans = f'`{c}` ({p["summary"].rstrip(".")}). ' if rng.random() < 0.5 else f'{c}: {p["summary"].rstrip(".")}. '
        ans += desc
        reasoning = f'The user asks about the {c} command. Its manual page ({c}({p["section"]})) says: {p["summary"]}.'
        out.append(('command', [{'role': 'user', 'content': q}], None, reasoning if rng.random() < 0.5 else None,
                    ans.strip()))
    # --help and --version are in every GNU page: keep few of them
    opts = [o for o in p['options'] if not re.search(r'--(help|version)\b', o[0]) or rng.random() < 0.05]
    for flags, h in rng.sample(opts, min(OPTIONS_PER_COMMAND, len(opts))):
        h = h if h.endswith(('.', '!', '?', ':')) else h + '.'
        first = re.split(r'(?<=[.;])\s', h)[0].rstrip('.;')
        main_flag = flags.split(',')[0].split()[0].split('[')[0].split('=')[0]
        if rng.random() < 0.5 and first[:1].islower() and len(first) < 90:
            q = rng.choice(ASK_OPT).format(h=first[0].lower() + first[1:], c=c)
            ans = f'Use `{c} {main_flag}`' + (f' (also written {flags})' if ',' in flags else '') + f': {cap(h)}'
            reasoning = f'I need the {c} option that does this: "{first}". The OPTIONS section lists {flags}.'
        else:
            q = rng.choice(ASK_FLAG).format(f=main_flag, c=c)
            ans = f'In {c}, `{flags}`: {cap(h)}'
            reasoning = f'The {c} manual page describes {flags}.'
        out.append(('option', [{'role': 'user', 'content': q}], None, reasoning if rng.random() < 0.5 else None,
                    ans))
    return out


def gen_word(rng, e):
    w = e['words'][0]
    gloss = e['gloss'].split(';')[0].strip()
    examples = re.findall(r'"([^"]+)"', e['gloss'])
    q = rng.choice(ASK_WORD[:4] if e['pos'] != 'noun' else ASK_WORD).format(w=w)
    ans = f'"{w}" ({e["pos"]}): {gloss}.'
    if len(e['words']) > 1:
        ans += ' Synonyms: ' + ', '.join(e['words'][1:4]) + '.'
    if examples:
        ans += f' Example: "{examples[0]}".'
    reasoning = f'{w} is a {e["pos"]}. The dictionary gloss: {gloss}.'
    return [('word', [{'role': 'user', 'content': q}], None, reasoning if rng.random() < 0.4 else None, ans)]


def gen_math(rng):
    k = rng.randrange(5)
    if k == 0:
        a, b = rng.randrange(11, 99), rng.randrange(11, 99)
        b1, b0 = divmod(b, 10)
        q = rng.choice(['What is {a} * {b}?', 'Compute {a} times {b}.', 'Multiply {a} by {b}.']).format(a=a, b=b)
        r = (f'{a} * {b} = {a} * {b1 * 10} + {a} * {b0} = {a * b1 * 10} + {a * b0} = {a * b}.')
        return q, r, f'{a} * {b} = {a * b}.'
    if k == 1:
        a, b, c = rng.randrange(100, 999), rng.randrange(100, 999), rng.randrange(10, 99)
        q = f'What is {a} + {b} - {c}?'
        r = f'First {a} + {b} = {a + b}. Then {a + b} - {c} = {a + b - c}.'
        return q, r, f'{a + b - c}.'
    if k == 2:
        words = ['banana', 'strawberry', 'mississippi', 'debian', 'keyboard', 'parallel', 'committee', 'letter',
                 'coffee', 'address', 'balloon', 'assessment', 'necessary', 'bookkeeper', 'occurrence']
        w = rng.choice(words)
        ch = rng.choice(sorted(set(w)))
        pos = [str(i + 1) for i, x in enumerate(w) if x == ch]
        q = f'How many times does the letter "{ch}" appear in "{w}"?'
        r = f'Spell it out: {" ".join(w)}. "{ch}" is at position{"s" if len(pos) > 1 else ""} {", ".join(pos)}.'
        return q, r, f'The letter "{ch}" appears {len(pos)} time{"s" if len(pos) != 1 else ""} in "{w}".'
    if k == 3:
        a = round(rng.uniform(1, 100), rng.choice([1, 2]))
        b = round(rng.uniform(1, 100), rng.choice([1, 2]))
        if a == b:
            b += 1
        q = f'Which is larger, {a} or {b}?'
        big = max(a, b)
        r = f'Compare {a} and {b}: the difference {big} - {min(a, b)} = {round(abs(a - b), 2)} is positive for {big}.'
        return q, r, f'{big} is larger.'
    conv = [('kilometres', 'metres', 1000), ('hours', 'minutes', 60), ('minutes', 'seconds', 60),
            ('kilobytes', 'bytes', 1024), ('days', 'hours', 24), ('metres', 'centimetres', 100)]
    big, small, f = rng.choice(conv)
    n = rng.randrange(2, 60)
    q = f'How many {small} are in {n} {big}?'
    r = f'One of the {big} is {f} {small}, so {n} {big} are {n} * {f} = {n * f} {small}.'
    return q, r, f'{n} {big} are {n * f} {small}.'


TOOLS = {
    'get_weather': {'type': 'function', 'function': {
        'name': 'get_weather', 'description': 'Get the current weather for a city',
        'parameters': {'type': 'object', 'properties': {
            'city': {'type': 'string', 'description': 'the city name'},
            'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit']}}, 'required': ['city']}}},
    'calculator': {'type': 'function', 'function': {
        'name': 'calculator', 'description': 'Evaluate an arithmetic expression',
        'parameters': {'type': 'object', 'properties': {
            'expression': {'type': 'string', 'description': 'e.g. 2 * (3 + 4)'}}, 'required': ['expression']}}},
    'list_files': {'type': 'function', 'function': {
        'name': 'list_files', 'description': 'List the files in a directory',
        'parameters': {'type': 'object', 'properties': {
            'path': {'type': 'string'}, 'all': {'type': 'boolean', 'description': 'include hidden files'}},
            'required': ['path']}}},
    'get_time': {'type': 'function', 'function': {
        'name': 'get_time', 'description': 'Get the current time in a time zone',
        'parameters': {'type': 'object', 'properties': {
            'timezone': {'type': 'string', 'description': 'an IANA zone such as Europe/Paris'}},
            'required': ['timezone']}}},
    'read_file': {'type': 'function', 'function': {
        'name': 'read_file', 'description': 'Read a text file',
        'parameters': {'type': 'object', 'properties': {
            'path': {'type': 'string'}, 'max_lines': {'type': 'integer'}}, 'required': ['path']}}},
    'search_packages': {'type': 'function', 'function': {
        'name': 'search_packages', 'description': 'Search the Debian archive for packages',
        'parameters': {'type': 'object', 'properties': {
            'query': {'type': 'string'}}, 'required': ['query']}}},
}

CITIES = [('Paris', 'Europe/Paris'), ('Berlin', 'Europe/Berlin'), ('Tokyo', 'Asia/Tokyo'), ('Lima', 'America/Lima'),
          ('Oslo', 'Europe/Oslo'), ('Cairo', 'Africa/Cairo'), ('Sydney', 'Australia/Sydney'),
          ('Toronto', 'America/Toronto'), ('Madrid', 'Europe/Madrid'), ('Nairobi', 'Africa/Nairobi'),
          ('Mumbai', 'Asia/Kolkata'), ('Seoul', 'Asia/Seoul'), ('Lisbon', 'Europe/Lisbon'),
          ('Denver', 'America/Denver'), ('Rome', 'Europe/Rome'), ('Dublin', 'Europe/Dublin'),
          ('Helsinki', 'Europe/Helsinki'), ('Santiago', 'America/Santiago'), ('Hanoi', 'Asia/Bangkok'),
          ('Vienna', 'Europe/Vienna'), ('Bogota', 'America/Bogota'), ('Athens', 'Europe/Athens')]
SKY = ['sunny', 'cloudy', 'light rain', 'heavy rain', 'snow', 'fog', 'partly cloudy', 'windy']
DIRS = ['/etc', '/var/log', '/home/alice', '/tmp', '/usr/share/doc', '/srv/www', '/home/bob/projects', '.']
FILES = ['notes.txt', 'README.md', 'config.ini', 'data.csv', 'build.sh', 'report.pdf', 'photo.jpg', 'main.c',
         'Makefile', 'todo.org', 'server.log', '.bashrc', '.profile', 'backup.tar.gz', 'index.html']


def gen_tool(rng, man_names):
    k = rng.randrange(6)
    if k == 0:
        city, _ = rng.choice(CITIES)
        unit = rng.choice([None, 'celsius', 'fahrenheit'])
        q = rng.choice(['What is the weather in {c}?', "What's the weather like in {c} right now?",
                        'Is it raining in {c}?', 'How warm is it in {c} today?', 'Weather in {c}, please.']).format(c=city)
        if unit == 'fahrenheit':
            q = q.rstrip('?.') + ' in Fahrenheit?'
        args = {'city': city} if unit != 'fahrenheit' else {'city': city, 'unit': 'fahrenheit'}
        t = rng.randrange(-5, 35)
        tv = round(t * 9 / 5 + 32) if unit == 'fahrenheit' else t
        u = '°F' if unit == 'fahrenheit' else '°C'
        sky = rng.choice(SKY)
        res = tojson({'city': city, 'temperature': tv, 'unit': u, 'conditions': sky})
        final = f'In {city} it is {tv}{u} with {sky}.'
        name, why = 'get_weather', f'The user wants the current weather in {city}; get_weather gives it.'
    elif k == 1:
        a, b, c = rng.randrange(2, 999), rng.randrange(2, 99), rng.randrange(2, 50)
        op = rng.choice(['*', '+', '-'])
        expr = f'{a} {op} {b} * {c}' if rng.random() < 0.5 else f'({a} {op} {b}) * {c}'
        val = eval(expr)  # noqa: S307 (our own digits and operators)
        q = rng.choice(['Use the calculator: what is {e}?', 'Calculate {e}.', 'What is {e}? Use the tool.',
                        'Please compute {e}.']).format(e=expr)
        args = {'expression': expr}
        res = str(val)
        final = f'{expr} = {val}.'
        name, why = 'calculator', 'This is arithmetic; the calculator tool evaluates it exactly.'
    elif k == 2:
        d = rng.choice(DIRS)
        hidden = rng.random() < 0.3
        q = rng.choice(['List the files in {d}.', 'What files are in {d}?', 'Show me the contents of {d}.',
                        'Which files does {d} contain?']).format(d=d)
        if hidden:
            q = q.rstrip('.?') + ', including hidden files.'
        args = {'path': d, 'all': True} if hidden else {'path': d}
        fs = rng.sample(FILES if hidden else [f for f in FILES if not f.startswith('.')], rng.randrange(2, 6))
        res = tojson(fs)
        final = f'{d} contains {len(fs)} files: ' + ', '.join(fs) + '.'
        name, why = 'list_files', f'I can list {d} with list_files.'
    elif k == 3:
        city, tz = rng.choice(CITIES)
        q = rng.choice(['What time is it in {c}?', 'What is the current time in {c}?', 'Tell me the time in {c}.']).format(c=city)
        args = {'timezone': tz}
        hh, mm = rng.randrange(24), rng.randrange(60)
        res = tojson({'timezone': tz, 'time': f'{hh:02d}:{mm:02d}'})
        final = f'It is {hh:02d}:{mm:02d} in {city} ({tz}).'
        name, why = 'get_time', f'{city} is in the time zone {tz}; get_time takes the zone.'
    elif k == 4:
        f = rng.choice(['/etc/hostname', '/etc/os-release', 'notes.txt', 'README.md', '/etc/timezone', 'todo.txt'])
        n = rng.choice([None, 5, 10])
        q = f'Show me {"the first " + str(n) + " lines of " if n else ""}{f}.' if rng.random() < 0.5 else \
            f'What is in {f}?'
        args = {'path': f, 'max_lines': n} if n else {'path': f}
        content = {'/etc/hostname': 'debian-box', '/etc/os-release': 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
                   '/etc/timezone': rng.choice(CITIES)[1]}.get(f, rng.choice(['buy milk', 'call Ann at 5',
                                                                               'fix the build', 'release on Friday']))
        res = content
        final = f'{f} contains: {content}'
        name, why = 'read_file', f'I should read {f} with read_file.'
    else:
        cmd = rng.choice(man_names) if man_names else 'tar'
        q = rng.choice(['Which Debian package has {c}?', 'Find the package that provides {c}.',
                        'Search the archive for {c}.']).format(c=cmd)
        args = {'query': cmd}
        res = tojson([cmd])
        final = f'The search for "{cmd}" found the package {cmd}.'
        name, why = 'search_packages', 'search_packages searches the Debian archive.'
    offered = [TOOLS[name]] + rng.sample([t for n, t in TOOLS.items() if n != name], rng.randrange(0, 3))
    rng.shuffle(offered)
    call = {'type': 'function', 'function': {'name': name, 'arguments': args}}
    user = [{'role': 'user', 'content': q}]
    if rng.random() < 0.3:
        user.insert(0, {'role': 'system', 'content': 'You are a helpful assistant on a Debian system.'})
    think = rng.random() < 0.6
    s1 = ('tool_call', user, offered, why if think else None, '', [call])
    hist = user + [{'role': 'assistant', 'content': '', 'tool_calls': [call]}, {'role': 'tool', 'content': res}]
    s2 = ('tool_answer', hist, offered, 'The tool answered; I report the result.' if think else None, final, None)
    prompt = dict(messages=user, tools=offered, expected={'name': name, 'arguments': args})
    return [s1, s2], prompt


def gen_no_tool(rng, man_pages):
    p = rng.choice(man_pages)
    offered = rng.sample(list(TOOLS.values()), rng.randrange(1, 3))
    q = rng.choice(ASK_CMD).format(c=p['name'])
    ans = f'{p["name"]}: {p["summary"].rstrip(".")}.'
    return ('no_tool', [{'role': 'user', 'content': q}], offered,
            'No tool is needed: this is about a command\'s manual page.' if rng.random() < 0.5 else None, ans, None)


def check_template(x4_template, samples):
    """Render the history of each sample with the engine's built-in template and compare bytes."""
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for s in samples:
            ctx = {'messages': s['messages'], 'add_generation_prompt': True}
            if s['tools']:
                ctx['tools'] = s['tools']
            p = os.path.join(d, 'ctx.json')
            json.dump(ctx, open(p, 'w'))
            ref = subprocess.run([x4_template, '-xing4', p], capture_output=True).stdout.decode()
            ours = render(s['messages'], s['tools'], True)
            if ref != ours:
                bad += 1
                if bad == 1:
                    print('template mismatch:\n engine: %r\n ours:   %r' % (ref, ours), file=sys.stderr)
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--data', default=os.path.join(here, '..', 'data'))
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--words', type=int, default=30000)
    ap.add_argument('--math', type=int, default=20000)
    ap.add_argument('--tools', type=int, default=8000)
    ap.add_argument('--check-template', metavar='X4_TEMPLATE', help='compare renders with the engine (x4-template)')
    a = ap.parse_args()
    rng = random.Random(a.seed)
    corpus = os.path.join(a.data, 'corpus')
    pages = [json.loads(ln) for ln in open(os.path.join(corpus, 'manpages.jsonl'))]
    words = [json.loads(ln) for ln in open(os.path.join(corpus, 'wordnet.jsonl'))]
    cmd_pages = [p for p in pages if p['section'] in ('1', '8') and p['summary']]
    out = os.path.join(a.data, 'chat')
    os.makedirs(out, exist_ok=True)
    ft, fh = open(os.path.join(out, 'train.jsonl'), 'w'), open(os.path.join(out, 'heldout.jsonl'), 'w')
    fp = open(os.path.join(out, 'heldout_tool_prompts.jsonl'), 'w')
    counts = {}
    written = []

    def put(s, held):
        kind, msgs, tools, reasoning, answer, calls = s
        text = sample_text(msgs, tools, reasoning, answer, calls)
        rec = dict(kind=kind, messages=msgs, tools=tools, text=text)
        (fh if held else ft).write(json.dumps(rec, ensure_ascii=False) + '\n')
        counts[kind + (' (held out)' if held else '')] = counts.get(kind + (' (held out)' if held else ''), 0) + 1
        written.append(rec)

    for p in pages:
        if p['section'][:1] in ('1', '6', '8'):
            for s in gen_command(rng, p):
                put((*s, None), p['heldout'])
        elif p['summary'] and len(p['summary']) < 200:
            # file formats, overviews, system calls, library functions: what the page describes
            kind = {'2': 'system call', '3': 'library function', '5': 'file format', '7': 'overview'}.get(
                p['section'][:1], 'manual page')
            q = rng.choice(['What is {n}?', 'What does the {n}({s}) manual page describe?',
                            'What is {n}({s}) about?']).format(n=p['name'], s=p['section'])
            ans = f'{p["name"]}({p["section"]}), a {kind} page: {p["summary"].rstrip(".")}.'
            if p['description']:
                ans += ' ' + first_sentences(p['description'])
            put(('manpage', [{'role': 'user', 'content': q}], None, None, ans, None), p['heldout'])
    for e in rng.sample(words, min(a.words, len(words))):
        for s in gen_word(rng, e):
            put((*s, None), e['heldout'])
    for i in range(a.math):
        q, r, ans = gen_math(rng)
        put(('reasoning', [{'role': 'user', 'content': q}], None, r, ans, None), rng.random() < 0.02)
    names = [p['name'] for p in cmd_pages]
    n_prompts = 0
    for i in range(a.tools):
        held = rng.random() < 0.02 or n_prompts < 50 and i >= a.tools - 200
        samples, prompt = gen_tool(rng, names)
        for s in samples:
            put(s, held)
        if held:
            fp.write(json.dumps(prompt, ensure_ascii=False) + '\n')
            n_prompts += 1
        if cmd_pages and rng.random() < 0.15:
            put(gen_no_tool(rng, cmd_pages), held)
    for f in (ft, fh, fp):
        f.close()
    print(json.dumps(dict(counts=counts, heldout_tool_prompts=n_prompts)))
    if a.check_template:
        kinds = {}
        for r in written:
            kinds.setdefault(r['kind'], []).append(r)
        written = [r for k in sorted(kinds) for r in rng.sample(kinds[k], min(60, len(kinds[k])))]
        bad = check_template(a.check_template, written)
        print(f'template check: {len(written) - bad}/{len(written)} renders byte-identical to the engine\'s')
        if bad:
            sys.exit(1)


if __name__ == '__main__':
    main()
