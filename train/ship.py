#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Ship a trained checkpoint as models/xing4-demo/ (issue 15), measuring everything the card says:

    train/ship.py CKPT_DIR [--out models/xing4-demo] [--build build] [--log LOG.jsonl ...]
                  [--windows 8] [--seq 256] [--questions 20] [--tool-prompts 50] [--stand-in]

1. export.py: the release-typed GGUF + config.json into OUT, and an F32 export in a scratch folder;
2. evaluate.py on both: held-out bits per byte (engine on the F32 file and PyTorch), the parity, the
   quantized / unquantized perplexity ratio;
3. the real daemon (build/daemon/xing4d, CPU backend, --mtp on) on OUT/model.gguf: twenty held-out
   questions through x4ctl, greedy (--temperature 0), answers kept unedited; the MTP head's greedy
   acceptance from the daemon's counters (x4ctl stats) over those held-out chat answers;
4. the bridge (build/http-bridge/xing4-http) in front of it: the first N held-out tool prompts
   (train/data/chat/heldout_tool_prompts.jsonl), greedy, scored on the parsed tool_calls the bridge
   returns (right function name and arguments equal to the expected ones after JSON parsing);
5. OUT/metrics.json (every number and answer, as measured), OUT/manifest.tsv (the corpus's packages,
   versions, licenses) and the model card OUT/README.md, written only from those and from the
   checkpoint's index.json and the training logs.

The twenty questions are picked before anything runs, by kind and by the SHA-1 of their text (5
commands, 3 options, the held-out "How do I" questions (up to 3), 2 manual pages, 5 words, the
rest reasoning), so the selection does not depend on the answers.

--stand-in puts a banner on the card: for testing this script on a random-initialised or barely
trained checkpoint, whose numbers say nothing about the demo model. Never ship such a card.
"""
import argparse
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def sh(cmd, **kw):
    print('+ ' + ' '.join(shlex.quote(str(c)) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def sha1(s):
    return hashlib.sha1(s.encode()).hexdigest()


def pick_questions(path, n):
    """Single-turn held-out chat questions without tools: a fixed mix of kinds, by text hash."""
    by_kind = {}
    for line in open(path):
        d = json.loads(line)
        if d.get('tools') or d['messages'][-1]['role'] != 'user':
            continue
        if any(m['role'] not in ('system', 'user') for m in d['messages']):
            continue
        q = d['messages'][-1]['content']
        kind = d['kind']
        if kind == 'option' and q.startswith('How do I'):
            kind = 'howto'
        by_kind.setdefault(kind, []).append(d)
    for v in by_kind.values():
        v.sort(key=lambda d: sha1(d['messages'][-1]['content']))
    quota = [('command', 5), ('option', 3), ('howto', 3), ('manpage', 2), ('word', 5), ('reasoning', n)]
    out = []
    for kind, k in quota:
        take = by_kind.get(kind, [])[:min(k, n - len(out))]
        out += [dict(kind=kind, messages=d['messages']) for d in take]
        if len(out) >= n:
            break
    return out


class Daemon:
    def __init__(self, build, model, work, threads):
        self.x4ctl = os.path.join(build, 'cli', 'x4ctl')
        self.sock = os.path.join(work, 'xing4d.sock')
        os.makedirs(os.path.join(work, 'state'), exist_ok=True)
        self.log = open(os.path.join(work, 'xing4d.log'), 'w')
        cmd = [os.path.join(build, 'daemon', 'xing4d'), '--config', '/dev/null', '--model', model,
               '--device', 'cpu', '--threads', str(threads), '--listen', self.sock,
               '--state-dir', os.path.join(work, 'state'), '--cache-pages', '64', '--mtp', 'on',
               '--log-level', 'notice']
        print('+ ' + ' '.join(cmd), file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            if subprocess.run([self.x4ctl, '--socket', self.sock, 'health'], capture_output=True).returncode == 0:
                break
            if self.proc.poll() is not None:
                sys.exit(f'xing4d exited ({self.proc.returncode}): see {self.log.name}')
            time.sleep(0.1)
        else:
            sys.exit('xing4d did not come up in 60 s')
        self.cmd = cmd

    def ctl(self, *args):
        r = subprocess.run([self.x4ctl, '--socket', self.sock, *args], capture_output=True, text=True)
        return r

    def stats(self):
        return json.loads(self.ctl('stats', '--json').stdout)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def ask(d, msgs, max_tokens):
    """One greedy generation through x4ctl (the chat template, thinking as the model chooses)."""
    args = ['--json', 'generate', '--temperature', '0', '--max-tokens', str(max_tokens)]
    sys_msgs = [m['content'] for m in msgs if m['role'] == 'system']
    if sys_msgs:
        args += ['--system', sys_msgs[0]]
    args.append(msgs[-1]['content'])
    r = d.ctl(*args)
    text = {}
    done = None
    for line in r.stdout.splitlines():
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if o.get('type') == 'chunk':
            text[o['channel']] = text.get(o['channel'], '') + o['text']
        elif o.get('type') in ('done', 'error'):
            done = o
    return dict(reasoning=text.get('reasoning', ''), answer=text.get('content', ''),
                finish_reason=(done or {}).get('finish_reason'), usage=(done or {}).get('usage'),
                x4ctl_exit=r.returncode, x4ctl_stderr=r.stderr.strip()[-300:])


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def tool_prompts(build, d, work, path, n, max_tokens):
    port = free_port()
    log = open(os.path.join(work, 'bridge.log'), 'w')
    cmd = [os.path.join(build, 'http-bridge', 'xing4-http'), '--listen', f'127.0.0.1:{port}',
           '--socket', d.sock, '--timeout', '600']
    print('+ ' + ' '.join(cmd), file=sys.stderr, flush=True)
    bridge = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f'http://127.0.0.1:{port}/v1/chat/completions'
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        prompts = [json.loads(line) for line in open(path)][:n]
        results = []
        for p in prompts:
            body = dict(model='xing4', messages=p['messages'], tools=p['tools'], temperature=0,
                        max_tokens=max_tokens)
            req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                         headers={'Content-Type': 'application/json'})
            try:
                resp = json.loads(urllib.request.urlopen(req, timeout=600).read())
                msg = resp['choices'][0]['message']
                finish = resp['choices'][0].get('finish_reason')
                err = None
            except Exception as e:  # an HTTP error is a miss, recorded with its reason
                msg, finish, err = {}, None, str(e)
            calls = msg.get('tool_calls') or []
            got, well_formed = None, False
            if calls:
                f = calls[0].get('function', {})
                try:
                    args = json.loads(f.get('arguments', ''))
                    well_formed = isinstance(args, dict) and isinstance(f.get('name'), str)
                except ValueError:
                    args = f.get('arguments')
                got = dict(name=f.get('name'), arguments=args)
            exp = p['expected']
            results.append(dict(question=p['messages'][-1]['content'], expected=exp, got=got,
                                n_calls=len(calls), well_formed=well_formed,
                                name_ok=bool(got) and got['name'] == exp['name'],
                                ok=well_formed and got['name'] == exp['name'] and got['arguments'] == exp['arguments'],
                                content=msg.get('content'), finish_reason=finish, error=err))
        return results
    finally:
        bridge.terminate()
        bridge.wait(30)


def read_logs(paths):
    """The records of every log, each once: a machine that stayed warm between calls appends to its
    log.jsonl, so a later call's log repeats the earlier call's lines."""
    recs, seen = [], set()
    for p in paths:
        for line in open(p):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            key = json.dumps(r, sort_keys=True)
            if key not in seen:
                seen.add(key)
                recs.append(dict(r, _file=os.path.basename(p)))
    return recs


def fence(text):
    n = 3
    while '`' * n in text:
        n += 1
    return '`' * n + 'text\n' + text.rstrip('\n') + '\n' + '`' * n


def manifest_summary(path):
    rows = [line.rstrip('\n').split('\t') for line in open(path)][1:]
    lic = {}
    for r in rows:
        for name in r[2].split('; '):
            if name:
                lic[name] = lic.get(name, 0) + 1
    return dict(packages=len(rows), bytes=sum(int(r[3]) for r in rows if r[3].isdigit()),
                licenses=sorted(lic.items(), key=lambda kv: -kv[1]),
                top=sorted(rows, key=lambda r: -int(r[3]) if r[3].isdigit() else 0)[:8])


def card(m):
    c = m['checkpoint']
    cfg = c['config']
    ev = m['evaluate']
    mtp = m['mtp']
    tools = m['tools']
    out = []
    w = out.append
    w('# xing4-demo: a small Xing4 model trained on Debian\'s own text\n')
    if m['stand_in']:
        w('> **STAND-IN.** This card was written by `train/ship.py --stand-in` from a checkpoint that is\n'
          '> not the trained demo model (a random-initialised or barely trained one, to test the script).\n'
          '> Its numbers and answers say nothing about the demo model. Do not ship it.\n')
    w('A model of the xing4_0 architecture (MLA with the release\'s RoPE/YaRN settings, 4-stream mHC with '
      'Sinkhorn, a dense block then MoE blocks with sigmoid routing, selection bias and a shared expert, '
      'the NextN/MTP block) at small widths, trained from scratch on text from Debian main packages '
      '(manual pages, package documentation, WordNet) and chat generated from them, so that a fresh '
      'install of xing4d has a model that answers. It knows what Debian\'s manual pages say, '
      'roughly; it is not a general assistant. Everything here was built by `train/` '
      '(train/README.md) and every number below was measured by `train/ship.py`, which wrote this card.\n')
    w('## Files\n')
    w('| file | bytes | sha256 |\n|---|---|---|')
    for f in m['files']:
        w(f'| `{f["name"]}` | {f["bytes"]:,} | `{f["sha256"]}` |')
    w('')
    w('Tensor types: the release\'s (BF16 attention, HC and embeddings, IQ4_NL FFN, experts and NextN '
      'matrices, Q6_K head). `config.json` sits next to the GGUF, where xing4d looks for it.\n')
    w('## Model\n')
    w(f'- **{m["params"]["total"]:,} parameters** ({m["params"]["active_per_token"]:,} active per token), '
      f'counted from the checkpoint\'s configuration (`model.gguf_sizes`).')
    w(f'- hidden {cfg["hidden"]}, {cfg["layers"]} trunk blocks ({cfg["dense"]} dense, FFN {cfg["ff"]}; the '
      f'rest MoE with {cfg["experts"]} experts of width {cfg["expert_ff"]}, top-{cfg["experts_used"]}, '
      f'{cfg["shared"]} shared) + {cfg["nextn"]} NextN block, {cfg["heads"]} heads, q_lora {cfg["q_lora"]}, '
      f'kv_lora {cfg["kv_lora"]}, qk_nope {cfg["qk_nope"]}, qk_rope {cfg["qk_rope"]}, v_head {cfg["v_head"]}, '
      f'vocabulary {cfg["vocab"]}, context {cfg["ctx"]:,} (YaRN); the engine\'s view of it in `config.json`.')
    w('- tokenizer: SentencePiece BPE trained with Debian\'s `spm_train` on the corpus, the release\'s '
      'special tokens at the spec\'s ids; chat template: the engine\'s built-in Xing4 template.\n')
    w('## Training\n')
    w(f'- {c["tokens"]:,} training tokens in {c["step"]:,} steps (steps per phase: '
      f'{", ".join(f"{k} {v:,}" for k, v in (c.get("phase_steps") or {}).items()) or "not recorded"}), '
      f'from the checkpoint\'s `index.json`.')
    dev = m['training_devices']
    w(f'- {c["seconds"] / 60:.1f} minutes of training wall time (the checkpoint\'s `seconds`, summed '
      f'over every run that led to it), on {", ".join(dev) if dev else "devices the logs do not name"}'
      f'{" (GPU minutes)" if dev and all(x.startswith("cuda") for x in dev) else ""}.')
    if m['runs']:
        w('- The runs, from the training logs (`train/train.py` arguments as logged):\n')
        w('| log | phase | device | minutes asked | batch × seq | lr | steps | tokens after |\n|---|---|---|---|---|---|---|---|')
        for r in m['runs']:
            w(f'| {r["log"]} | {r["phase"]} | {r["device"]} | {r["minutes"]} | {r["batch"]} × {r["seq"]} | '
              f'{r["lr"]} | {r["steps"]} | {r["tokens"]:,} |' if r["tokens"] is not None else
              f'| {r["log"]} | {r["phase"]} | {r["device"]} | {r["minutes"]} | {r["batch"]} × {r["seq"]} | {r["lr"]} | | |')
        w('')
    else:
        w('- No training logs were given to `ship.py`, so the runs are not listed.\n')
    if m['data']:
        d = m['data']
        w('## Data\n')
        w(f'{d["packages"]} Debian main packages ({d["bytes"] / 1e6:.1f} MB of text taken from them); '
          f'`manifest.tsv` lists every package with its version, the license names of its copyright file '
          f'and the bytes it contributed. The largest: '
          + ', '.join(f'{r[0]} {int(r[3]) / 1e6:.1f} MB' for r in d['top']) + '.')
        w('License names in the manifest (packages naming each): '
          + ', '.join(f'{k} {v}' for k, v in d['licenses'][:15])
          + (f', and {len(d["licenses"]) - 15} more' if len(d['licenses']) > 15 else '') + '.')
        if m['tokens_meta']:
            f = m['tokens_meta']['files']
            w(f'Token files: prose {f["pretrain_train"]["tokens"]:,} tokens for training + '
              f'{f["pretrain_heldout"]["tokens"]:,} held out; chat {f["chat_train"]["tokens"]:,} + '
              f'{f["chat_heldout"]["tokens"]:,} held out (documents held out by the SHA-1 of their name).')
        w('')
    w('## Held-out evaluation (`train/evaluate.py`)\n')
    w(f'{m["evaluate_args"]}. Engine = `x4-logits` on the CPU backend.\n')
    w('| text | PyTorch fp32 bpb | engine, F32 export, bpb | engine, release types, bpb | perplexity ratio release / F32 |\n|---|---|---|---|---|')
    for kind, label in (('pretrain_heldout', 'prose'), ('chat_heldout', 'chat')):
        r = ev.get(kind)
        if r:
            w(f'| {label} | {r["torch"]["bpb"]} | {r["f32"]["bpb"]} | {r.get("quant", {}).get("bpb", "")} | '
              f'{r.get("perplexity_ratio_quant_over_f32", "")} |')
    w(f'\nEngine against PyTorch on the F32 export: max relative logit difference '
      f'**{ev["parity_max_rel_engine_f32_vs_torch"]:.2e}**.\n')
    w('## MTP (the NextN block)\n')
    a = mtp['questions']
    w(f'Greedy acceptance of the NextN block\'s drafts, from the daemon\'s counters (`x4ctl stats`: '
      f'mtp_drafted_tokens, mtp_accepted_tokens; xing4d --mtp on, one draft a step) while it answered '
      f'the {len(m["questions"])} held-out questions below: **{a["acceptance"]:.1%}** ({a["accepted"]:,} of '
      f'{a["drafted"]:,} drafts). Over the tool prompts: {mtp["tools"]["acceptance"]:.1%} '
      f'({mtp["tools"]["accepted"]:,} of {mtp["tools"]["drafted"]:,}).')
    if m['train_eval']:
        te = m['train_eval']
        w(f'The training log\'s last evaluation (PyTorch, held-out chat windows, t+2 guess right where the '
          f'trunk\'s t+1 guess is): {te.get("mtp_accept")}.')
    w('')
    w('## Tool calls through the bridge\n')
    ok = sum(r['ok'] for r in tools)
    wf = sum(r['well_formed'] for r in tools)
    nm = sum(r['name_ok'] for r in tools)
    w(f'The first {len(tools)} held-out tool prompts (`heldout_tool_prompts.jsonl`: the question, the '
      f'tools offered, the expected call), sent to xing4-http\'s /v1/chat/completions with the tools, '
      f'greedy; scored on the `tool_calls` the daemon\'s output parser produced: '
      f'**{ok} of {len(tools)} ({ok / max(len(tools), 1):.0%})** name the right function with arguments '
      f'equal to the expected ones; {wf} returned a well-formed call, {nm} the right function.\n')
    w(f'## {len(m["questions"])} held-out questions, greedy, unedited\n')
    w('Asked through `x4ctl generate --temperature 0` (the chat template, thinking left to the model; '
      f'--max-tokens {m["max_tokens"]}); the reasoning is shown when the model produced any.\n')
    for i, q in enumerate(m['questions'], 1):
        w(f'**{i}. {q["question"]}** ({q["kind"]}; finish: {q["finish_reason"]})\n')
        if q['reasoning']:
            w('Reasoning:\n')
            w(fence(q['reasoning']) + '\n')
        w(fence(q['answer'] if q['answer'] else '(no answer)') + '\n')
    w('## How this card was made\n')
    w('```\n' + m['command'] + '\n```\n')
    w('Raw results, every answer and tool call included: `metrics.json`. Training: train/README.md.')
    return '\n'.join(out) + '\n'


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('ckpt', help='a train.py run folder, or its ckpt/ folder (index.json + shards)')
    ap.add_argument('--out', default=os.path.join(SRC, 'models', 'xing4-demo'))
    ap.add_argument('--build', default=os.environ.get('X4_BUILD_DIR', os.path.join(SRC, 'build')))
    ap.add_argument('--data', default=os.path.join(HERE, 'data'), help='chat/, tokens/, manifest.tsv')
    ap.add_argument('--spm', help='default: train/carry/tok/xing4-demo.model, else train/tok/')
    ap.add_argument('--log', action='append', default=[],
                    help='a training log.jsonl (repeatable; default: log*.jsonl in the run folder)')
    ap.add_argument('--windows', type=int, default=8)
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--questions', type=int, default=20)
    ap.add_argument('--tool-prompts', type=int, default=50)
    ap.add_argument('--max-tokens', type=int, default=512)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--stand-in', action='store_true', help='mark the card as a stand-in (testing)')
    a = ap.parse_args()
    command = 'train/ship.py ' + ' '.join(shlex.quote(x) for x in sys.argv[1:])

    sys.path.insert(0, HERE)
    from model import Config, gguf_sizes
    from train import load_ckpt

    spm = a.spm or next((p for p in (os.path.join(HERE, 'carry', 'tok', 'xing4-demo.model'),
                                     os.path.join(HERE, 'tok', 'xing4-demo.model')) if os.path.exists(p)), None)
    if not spm:
        sys.exit('no SentencePiece model: give --spm (train/tokenizer.py train writes train/tok/xing4-demo.model)')
    for t in ('daemon/xing4d', 'cli/x4ctl', 'http-bridge/xing4-http', 'tools/x4-logits'):
        if not os.path.exists(os.path.join(a.build, t)):
            sys.exit(f'{a.build}/{t} missing: build first (meson setup build -Dcuda=disabled && ninja -C build) or give --build')
    chat = os.path.join(a.data, 'chat')
    for f in ('heldout.jsonl', 'heldout_tool_prompts.jsonl'):
        if not os.path.exists(os.path.join(chat, f)):
            sys.exit(f'{chat}/{f} missing: train/corpus/chatgen.py writes it (train/README.md §1)')
    questions = pick_questions(os.path.join(chat, 'heldout.jsonl'), a.questions)

    run = a.ckpt.rstrip('/') or '/'
    if os.path.basename(run) == 'ckpt':
        run = os.path.dirname(run) or '.'
    logs = a.log or sorted(os.path.join(run, f) for f in os.listdir(run) if f.startswith('log') and f.endswith('.jsonl'))
    cfg_d, _, idx, _ = load_ckpt(a.ckpt)
    total, active = gguf_sizes(Config.from_dict(cfg_d))[1:]

    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix='x4-ship-')
    model = os.path.join(a.out, 'model.gguf')
    f32 = os.path.join(work, 'f32', 'model.gguf')
    py = sys.executable
    sh([py, os.path.join(HERE, 'export.py'), '--ckpt', a.ckpt, '--spm', spm, '--out', model])
    sh([py, os.path.join(HERE, 'export.py'), '--ckpt', a.ckpt, '--spm', spm, '--out', f32, '--types', 'f32'])
    ev_cmd = [py, os.path.join(HERE, 'evaluate.py'), '--ckpt', a.ckpt, '--f32', f32, '--quant', model,
              '--x4-logits', os.path.join(a.build, 'tools', 'x4-logits'), '--data', os.path.join(a.data, 'tokens'),
              '--windows', str(a.windows), '--seq', str(a.seq)]
    ev = json.loads(sh(ev_cmd, capture_output=True, text=True).stdout)
    shutil.rmtree(os.path.dirname(f32))

    d = Daemon(a.build, model, work, a.threads)
    try:
        s0 = d.stats()
        answers = []
        for q in questions:
            r = ask(d, q['messages'], a.max_tokens)
            print(f'  Q: {q["messages"][-1]["content"]}\n  A: {r["answer"][:200]!r}', file=sys.stderr, flush=True)
            answers.append(dict(kind=q['kind'], question=q['messages'][-1]['content'], **r))
        s1 = d.stats()
        tools = tool_prompts(a.build, d, work, os.path.join(chat, 'heldout_tool_prompts.jsonl'),
                             a.tool_prompts, a.max_tokens)
        s2 = d.stats()
    finally:
        d.stop()

    def acc(x, y):
        dr = y['mtp_drafted_tokens'] - x['mtp_drafted_tokens']
        ac = y['mtp_accepted_tokens'] - x['mtp_accepted_tokens']
        return dict(drafted=dr, accepted=ac, acceptance=ac / dr if dr else 0.0)

    recs = read_logs(logs)
    runs = []
    for i, r in enumerate(recs):
        if r.get('event') != 'start':
            continue
        end = next((e for e in recs[i + 1:] if e['_file'] == r['_file'] and e.get('event') in ('end', 'start')), None)
        ar = r.get('args', {})
        runs.append(dict(log=r['_file'], phase=r.get('phase'), device=r.get('device'), minutes=ar.get('minutes'),
                         batch=ar.get('batch'), seq=ar.get('seq'), lr=ar.get('lr'),
                         steps=end.get('steps_this_run') if end and end.get('event') == 'end' else None,
                         tokens=end.get('tokens') if end and end.get('event') == 'end' else None))
    evals = [r for r in recs if r.get('event') == 'eval' and r.get('heldout_chat')]
    manifest = os.path.join(a.data, 'manifest.tsv')
    meta = os.path.join(a.data, 'tokens', 'meta.json')
    m = dict(stand_in=a.stand_in, command=command, max_tokens=a.max_tokens,
             checkpoint=dict(step=idx.get('step'), tokens=idx.get('tokens'), seconds=idx.get('seconds', 0.0),
                             phase_steps=idx.get('phase_steps'), config=cfg_d),
             params=dict(total=int(total), active_per_token=int(active)),
             training_devices=sorted({r['device'] for r in runs if r.get('device')}), runs=runs,
             train_eval=evals[-1]['heldout_chat'] if evals else None,
             evaluate=ev, evaluate_args=f'{a.windows} fixed windows of {a.seq} tokens of each held-out token file',
             mtp=dict(questions=acc(s0, s1), tools=acc(s1, s2)),
             tools=tools, tool_ok=sum(r['ok'] for r in tools), questions=answers,
             data=manifest_summary(manifest) if os.path.exists(manifest) else None,
             tokens_meta=json.load(open(meta)) if os.path.exists(meta) else None,
             # as a reader would type it: paths in the tree relative to its root, the scratch
             # folder as WORK (a card must not name the machine it was made on)
             daemon=' '.join(os.path.relpath(x, SRC) if os.path.isabs(x) and x.startswith(SRC + os.sep)
                             else x.replace(work, 'WORK') for x in d.cmd))
    if os.path.exists(manifest):
        shutil.copy(manifest, os.path.join(a.out, 'manifest.tsv'))
    m['files'] = [dict(name=f, bytes=os.path.getsize(os.path.join(a.out, f)), sha256=sha256(os.path.join(a.out, f)))
                  for f in ('model.gguf', 'config.json', 'manifest.tsv') if os.path.exists(os.path.join(a.out, f))]
    json.dump(m, open(os.path.join(a.out, 'metrics.json'), 'w'), indent=1)
    open(os.path.join(a.out, 'README.md'), 'w').write(card(m))
    shutil.rmtree(work)
    n = len(tools)
    print(f'{a.out}: model.gguf {os.path.getsize(model):,} bytes; tool calls {m["tool_ok"]}/{n}; '
          f'MTP acceptance {m["mtp"]["questions"]["acceptance"]:.3f}; card README.md, metrics.json')


if __name__ == '__main__':
    main()
