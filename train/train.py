#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train the demo model (issue 15): pretraining, chat tuning and the MTP head, in time-boxed runs
that resume from small checkpoints (the GPU machine runs one command for at most 10 minutes and
returns files of at most 16 MiB each; train/README.md has the plan).

    train.py --run DIR --phase pretrain|chat|mtp --minutes M [--config demo|toy|FILE.json]
             [--resume DIR_OR_CKPT] [--data train/data/tokens] [--batch B] [--seq T] ...

Phases (the loss is always next-token cross-entropy on the trunk plus --mtp-weight times the MTP
block's cross-entropy on token t+2, docs/model.md §8):
  pretrain  the Debian prose (pretrain_train.bin), with --chat-mix of chat data;
  chat      the chat data, the loss only on what the assistant writes (the .mask files), with
            --pretrain-mix of prose so the model keeps its language;
  mtp       the trunk frozen, only the NextN block trained (on the chat phase's mixture).
With --agent-mix F a fraction F of the steps (any phase; meant for chat) trains on the agent
dialogues instead (agent_train.bin: coding-agent system prompts of 1,000-6,000 tokens with many
tools): --agent-batch windows of --agent-seq tokens, each placed on one dialogue so its final turn is
in the window, e.g. --seq 512 --batch 64 --agent-seq 4096 --agent-batch 8 (the same tokens a step).

The learning rate is warmup-stable-decay by wall clock: --warmup-steps up to --lr, constant, then
linear decay to --lr-min over the last --decay-minutes of the run (0: none). Routing balance is
DeepSeek-V3's auxiliary-loss-free rule: after every step each MoE layer's selection bias
(exp_probs_b) moves by --bias-rate towards the experts that got fewer tokens than the mean.

Checkpoints (DIR/ckpt/): the weights in bf16 (the routing bias in fp32), the config, the step,
tokens seen and the RNG state, split into files of at most --shard-mb MiB so each comes back
through $OUT; no optimizer state unless --save-optim (Adam's moments are twice the weights in fp32;
a resumed run re-warms them with --warmup-steps). The log is DIR/log.jsonl.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Xing4, gguf_sizes  # noqa: E402

CONFIGS = {
    # CPU smoke runs
    'toy': Config(vocab=8192, hidden=256, layers=3, dense=1, nextn=1, heads=4, q_lora=64, kv_lora=64,
                  qk_nope=32, qk_rope=32, v_head=32, ff=512, experts=8, experts_used=2, shared=1, expert_ff=64),
    # the shipped demo (train/README.md: sized for the 48 MB GGUF and a few 9-minute H200 runs)
    'demo': Config(vocab=8192, hidden=512, layers=8, dense=1, nextn=1, heads=8, q_lora=128, kv_lora=96,
                   qk_nope=32, qk_rope=32, v_head=32, ff=768, experts=8, experts_used=2, shared=1,
                   expert_ff=64),
}


# ---- data -----------------------------------------------------------------------------------------

class Tokens:
    """A uint16 token file (and its loss mask) read through a memory map; .xz files are unpacked
    next to themselves once (the corpus travels compressed)."""

    def __init__(self, path, need=True):
        self.ids = self.mask = None
        if not os.path.exists(path) and os.path.exists(path + '.xz'):
            import lzma
            with lzma.open(path + '.xz') as f, open(path, 'wb') as g:
                g.write(f.read())
        if not os.path.exists(path):
            if need:
                raise FileNotFoundError(path)
            return
        self.ids = np.memmap(path, dtype=np.uint16, mode='r')
        mp = path[:-4] + '.mask'
        if not os.path.exists(mp) and os.path.exists(mp + '.xz'):
            import lzma
            with lzma.open(mp + '.xz') as f, open(mp, 'wb') as g:
                g.write(f.read())
        if os.path.exists(mp):
            self.mask = np.memmap(mp, dtype=np.uint8, mode='r')

    def __bool__(self):
        return self.ids is not None and len(self.ids) > 0

    def batch(self, rng, B, T):
        """B random windows of T+2 tokens: inputs, the targets t+1 and t+2, and the loss masks."""
        n = len(self.ids) - (T + 2)
        starts = rng.integers(0, n, size=B)
        w = np.stack([np.asarray(self.ids[s:s + T + 2], dtype=np.int64) for s in starts])
        if self.mask is not None:
            m = np.stack([np.asarray(self.mask[s:s + T + 2], dtype=np.float32) for s in starts])
        else:
            m = np.ones_like(w, dtype=np.float32)
        return torch.from_numpy(w), torch.from_numpy(m)

    def doc_batch(self, rng, B, T):
        """B windows of T+2 tokens each placed on one random conversation (the `<_start>` token 1
        begins each): from its start when it fits (the window runs on into the next ones), else
        ending at its end, so the trained final turn is always inside and as much of the long prompt
        before it as the window holds."""
        if getattr(self, '_starts', None) is None:
            self._starts = np.flatnonzero(np.asarray(self.ids) == 1)
            if len(self._starts) == 0:
                self._starts = np.zeros(1, np.int64)
        L, W = len(self.ids), T + 2
        ws, ms = [], []
        for i in rng.integers(0, len(self._starts), size=B):
            s = int(self._starts[i])
            e = int(self._starts[i + 1]) if i + 1 < len(self._starts) else L
            s = e - W if e - s > W else s
            s = max(0, min(s, L - W))
            ws.append(np.asarray(self.ids[s:s + W], dtype=np.int64))
            ms.append(np.asarray(self.mask[s:s + W], dtype=np.float32) if self.mask is not None
                      else np.ones(W, np.float32))
        return torch.from_numpy(np.stack(ws)), torch.from_numpy(np.stack(ms))


def mixed_batch(rng, primary, secondary, frac, B, T):
    """B windows, a fraction `frac` of them from `secondary` (none if it is empty)."""
    nb = int(round(B * frac)) if secondary else 0
    w, m = primary.batch(rng, B - nb, T)
    if nb:
        w2, m2 = secondary.batch(rng, nb, T)
        w, m = torch.cat((w, w2)), torch.cat((m, m2))
    return w, m


# ---- checkpoints -----------------------------------------------------------------------------------

def save_ckpt(model, cfg, state, path, shard_mb, opt=None):
    """DIR/ckpt/: index.json + shard-N.pt files each under shard_mb MiB; written to a temporary
    folder and renamed, so an interrupted save keeps the last one."""
    tmp = path + '.tmp'
    os.makedirs(tmp, exist_ok=True)
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    sd = model.state_dict()
    shards, cur, cur_bytes = [], {}, 0
    for k, v in sd.items():
        v = v.detach().cpu()
        v = v.to(torch.bfloat16) if v.is_floating_point() and not k.endswith('.bias') else v.float()
        nb = v.numel() * v.element_size()
        if cur and cur_bytes + nb > shard_mb * (1 << 20) - 65536:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[k] = v.contiguous()
        cur_bytes += nb
    if cur:
        shards.append(cur)
    for i, s in enumerate(shards):
        torch.save(s, os.path.join(tmp, f'shard-{i}.pt'))
    if opt is not None:
        torch.save(opt.state_dict(), os.path.join(tmp, 'optim.pt'))
    json.dump(dict(config=cfg.__dict__, shards=len(shards), **state), open(os.path.join(tmp, 'index.json'), 'w'),
              indent=1)
    if os.path.isdir(path):
        old = path + '.old'
        if os.path.isdir(old):
            for f in os.listdir(old):
                os.unlink(os.path.join(old, f))
            os.rmdir(old)
        os.rename(path, old)
    os.rename(tmp, path)


def load_ckpt(path):
    """(config dict, state dict of tensors, index) from a ckpt folder (or a run folder holding one)."""
    if os.path.isdir(os.path.join(path, 'ckpt')):
        path = os.path.join(path, 'ckpt')
    idx = json.load(open(os.path.join(path, 'index.json')))
    sd = {}
    for i in range(idx['shards']):
        sd.update(torch.load(os.path.join(path, f'shard-{i}.pt'), map_location='cpu'))
    return idx['config'], sd, idx, path


# ---- evaluation ------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model, data, B, T, n_batches, device, amp, bytes_per_token, aligned=False):
    """Held-out loss (nats/token over masked tokens), bits per byte, MTP loss and the MTP head's
    greedy agreement with the true t+2 token where the trunk's greedy t+1 is right (the draft
    acceptance a speculative decoder would see)."""
    if not data:
        return None
    model.eval()
    rng = np.random.default_rng(1234)   # the same windows every time
    tot = mtp_tot = n = acc = acc_n = 0.0
    for _ in range(n_batches):
        w, m = (data.doc_batch if aligned else data.batch)(rng, B, T)
        w, m = w.to(device), m.to(device)
        with amp():
            logits, mtp = model(w[:, :T], w[:, 1:T + 1])
        mk = m[:, 1:T + 1]
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:T + 1].reshape(-1), reduction='none')
        tot += float((ce * mk.reshape(-1)).sum())
        n += float(mk.sum())
        if mtp is not None:
            m2 = m[:, 2:T + 2]
            ce2 = F.cross_entropy(mtp.float().reshape(-1, mtp.shape[-1]), w[:, 2:T + 2].reshape(-1), reduction='none')
            mtp_tot += float((ce2 * m2.reshape(-1)).sum())
            ok1 = (logits.argmax(-1) == w[:, 1:T + 1])
            ok2 = (mtp.argmax(-1) == w[:, 2:T + 2])
            sel = ok1 & (m2 > 0)
            acc += float((ok2 & sel).sum())
            acc_n += float(sel.sum())
    model.train()
    if n == 0:
        return None       # no counted token in these windows (chat windows of only prompts)
    loss = tot / n
    out = dict(loss=round(loss, 4), bpb=round(loss / math.log(2) / bytes_per_token, 4))
    if acc_n:
        out.update(mtp_loss=round(mtp_tot / max(n, 1), 4), mtp_accept=round(acc / acc_n, 4))
    return out


# ---- the loop --------------------------------------------------------------------------------------

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--run', required=True, help='run folder (log, checkpoint)')
    ap.add_argument('--phase', choices=['pretrain', 'chat', 'mtp'], default='pretrain')
    ap.add_argument('--config', default='toy', help='toy | demo | a JSON file of model.Config fields')
    ap.add_argument('--resume', help='a run folder or ckpt folder to start from')
    ap.add_argument('--data', default=os.path.join(here, 'data', 'tokens'))
    ap.add_argument('--minutes', type=float, default=5.0, help='wall-clock budget of this run, saving included')
    ap.add_argument('--max-steps', type=int, default=0)
    ap.add_argument('--batch', type=int, default=16)
    ap.add_argument('--seq', type=int, default=256)
    ap.add_argument('--accum', type=int, default=1)
    ap.add_argument('--lr', type=float, default=3e-3)
    ap.add_argument('--lr-min', type=float, default=3e-4)
    ap.add_argument('--warmup-steps', type=int, default=100)
    ap.add_argument('--decay-minutes', type=float, default=0.0)
    ap.add_argument('--wd', type=float, default=0.1)
    ap.add_argument('--mtp-weight', type=float, default=0.3)
    ap.add_argument('--bias-rate', type=float, default=1e-3)
    ap.add_argument('--chat-mix', type=float, default=0.1)
    ap.add_argument('--pretrain-mix', type=float, default=0.2)
    ap.add_argument('--agent-mix', type=float, default=0.0,
                    help='fraction of steps on the agent dialogues (agent_train.bin): --agent-batch windows of '
                         '--agent-seq tokens, each placed on one dialogue')
    ap.add_argument('--agent-seq', type=int, default=0, help='window of the agent steps (default: --seq)')
    ap.add_argument('--agent-batch', type=int, default=0, help='batch of the agent steps (default: --batch)')
    ap.add_argument('--eval-every', type=int, default=200)
    ap.add_argument('--eval-batches', type=int, default=8)
    ap.add_argument('--save-every-minutes', type=float, default=3.0)
    ap.add_argument('--shard-mb', type=float, default=15.0)
    ap.add_argument('--save-optim', action='store_true')
    ap.add_argument('--compile', action='store_true', help='torch.compile the model (PyTorch >= 2)')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--threads', type=int, default=0)
    ap.add_argument('--print-size', action='store_true', help='print the parameter and GGUF sizes and exit')
    a = ap.parse_args()
    t_start = time.time()
    deadline = t_start + a.minutes * 60

    if a.threads:
        torch.set_num_threads(a.threads)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def amp():
        if device == 'cuda':
            return torch.autocast('cuda', dtype=torch.bfloat16)
        return torch.autocast('cpu', enabled=False)

    state = dict(step=0, tokens=0, phase_steps={}, seconds=0.0)
    sd = None
    if a.resume:
        cfg_d, sd, idx, _ = load_ckpt(a.resume)
        cfg = Config.from_dict(cfg_d)
        for k in ('step', 'tokens', 'phase_steps', 'seconds'):
            if k in idx:
                state[k] = idx[k]
    elif a.config in CONFIGS:
        cfg = CONFIGS[a.config]
    else:
        cfg = Config.from_dict(json.load(open(a.config)))

    sizes, params, active = gguf_sizes(cfg)
    size_line = dict(params=params, active_per_token=active, gguf_release_bytes=int(sum(sizes.values())),
                     gguf_by_class={k: int(v) for k, v in sizes.items()}, ckpt_bf16_bytes=2 * params)
    if a.print_size:
        print(json.dumps(size_line, indent=1))
        return

    torch.manual_seed(a.seed + state['step'])
    model = Xing4(cfg)
    if sd is not None:
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        if unexpected or [k for k in missing if k != 'inv_freq']:
            print(f'checkpoint: missing {missing}, unexpected {unexpected}', file=sys.stderr)
    model.to(device)
    fwd = model
    if a.compile and hasattr(torch, 'compile'):
        fwd = torch.compile(model)

    meta = json.load(open(os.path.join(a.data, 'meta.json')))
    if meta['vocab'] != cfg.vocab:
        sys.exit(f'token files are for a vocabulary of {meta["vocab"]}, the model has {cfg.vocab}')
    bpt = {k: v['bytes_per_token'] for k, v in meta['files'].items()}
    pre_tr = Tokens(os.path.join(a.data, 'pretrain_train.bin'), need=a.phase == 'pretrain')
    chat_tr = Tokens(os.path.join(a.data, 'chat_train.bin'), need=a.phase != 'pretrain')
    pre_ho = Tokens(os.path.join(a.data, 'pretrain_heldout.bin'), need=False)
    chat_ho = Tokens(os.path.join(a.data, 'chat_heldout.bin'), need=False)
    agent_tr = Tokens(os.path.join(a.data, 'agent_train.bin'), need=a.agent_mix > 0)
    agent_ho = Tokens(os.path.join(a.data, 'agent_heldout.bin'), need=False)
    a.agent_seq = a.agent_seq or a.seq
    a.agent_batch = a.agent_batch or a.batch
    if a.phase == 'pretrain':
        primary, secondary, frac = pre_tr, chat_tr, a.chat_mix
    else:
        primary, secondary, frac = chat_tr, pre_tr, a.pretrain_mix

    if a.phase == 'mtp':
        for n, p in model.named_parameters():
            p.requires_grad = n.startswith('nextn.')
    params_t = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params_t if p.dim() >= 2]
    no_decay = [p for p in params_t if p.dim() < 2]
    kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    if device == 'cuda':
        try:
            opt = torch.optim.AdamW([dict(params=decay, weight_decay=a.wd), dict(params=no_decay, weight_decay=0.0)],
                                    fused=True, **kw)
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW([dict(params=decay, weight_decay=a.wd), dict(params=no_decay, weight_decay=0.0)], **kw)
    else:
        opt = torch.optim.AdamW([dict(params=decay, weight_decay=a.wd), dict(params=no_decay, weight_decay=0.0)], **kw)
    if a.resume and a.save_optim:
        op = os.path.join(a.resume if not os.path.isdir(os.path.join(a.resume, 'ckpt')) else os.path.join(a.resume, 'ckpt'),
                          'optim.pt')
        if os.path.exists(op):
            try:
                opt.load_state_dict(torch.load(op, map_location=device))
            except (ValueError, RuntimeError) as e:
                print(f'optimizer state not loaded ({e}); Adam re-warms', file=sys.stderr)

    os.makedirs(a.run, exist_ok=True)
    logf = open(os.path.join(a.run, 'log.jsonl'), 'a')

    def log(rec):
        rec = dict(rec, step=state['step'], tokens=state['tokens'], phase=a.phase,
                   elapsed=round(time.time() - t_start, 1))
        logf.write(json.dumps(rec) + '\n')
        logf.flush()
        print(json.dumps(rec), flush=True)

    log(dict(event='start', device=device, torch=torch.__version__, config=cfg.__dict__, **size_line,
             args=vars(a)))

    def run_eval():
        r = {}
        e = evaluate(model, pre_ho, min(a.batch, 8), a.seq, a.eval_batches, device, amp, bpt.get('pretrain_heldout', 4))
        if e:
            r['heldout_prose'] = e
        e = evaluate(model, chat_ho, min(a.batch, 8), a.seq, a.eval_batches, device, amp, bpt.get('chat_heldout', 4))
        if e:
            r['heldout_chat'] = e
        if agent_ho:
            e = evaluate(model, agent_ho, min(a.agent_batch, 8), a.agent_seq, a.eval_batches, device, amp,
                         bpt.get('agent_heldout', 4), aligned=True)
            if e:
                r['heldout_agent'] = e
        log(dict(event='eval', **r))
        return r

    def save():
        t0 = time.time()
        state['seconds'] = round(state['seconds'] + (time.time() - save.t_last), 1)
        save.t_last = time.time()
        save_ckpt(model, cfg, state, os.path.join(a.run, 'ckpt'), a.shard_mb, opt if a.save_optim else None)
        log(dict(event='save', save_seconds=round(time.time() - t0, 1)))
    save.t_last = time.time()

    run_eval()
    rng = np.random.default_rng(a.seed * 1_000_003 + state['step'])
    step0 = state['step']
    t_loop = time.time()
    last_save = time.time()
    tok_window, t_window = 0, time.time()
    # the time one step takes, measured, so the run stops with room for the final eval and save
    step_time = 0.0
    reserve = 20.0 if device == 'cuda' else 10.0
    while True:
        now = time.time()
        if a.max_steps and state['step'] - step0 >= a.max_steps:
            break
        if now + step_time + reserve > deadline:
            break
        ls = state['step'] - step0
        lr = a.lr * min(1.0, (ls + 1) / max(a.warmup_steps, 1))
        if a.decay_minutes > 0:
            left = (deadline - reserve - now) / 60.0
            if left < a.decay_minutes:
                f = max(0.0, left / a.decay_minutes)
                lr = a.lr_min + (lr - a.lr_min) * f
        for g in opt.param_groups:
            g['lr'] = lr
        t0 = time.time()
        tot_loss = tot_mtp = 0.0
        # an agent step (long windows on whole dialogues) or an ordinary one
        agent_step = a.agent_mix > 0 and rng.random() < a.agent_mix
        for _ in range(a.accum):
            if agent_step:
                w, m = agent_tr.doc_batch(rng, a.agent_batch, a.agent_seq)
                T = a.agent_seq
            else:
                w, m = mixed_batch(rng, primary, secondary, frac, a.batch, a.seq)
                T = a.seq
            w, m = w.to(device, non_blocking=True), m.to(device, non_blocking=True)
            with amp():
                logits, mtp = fwd(w[:, :T], w[:, 1:T + 1])
            mk = m[:, 1:T + 1].reshape(-1)
            ce = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), w[:, 1:T + 1].reshape(-1), reduction='none')
            loss_main = (ce * mk).sum() / mk.sum().clamp(min=1)
            loss = loss_main if a.phase != 'mtp' else 0.0 * loss_main
            if mtp is not None and a.mtp_weight > 0:
                m2 = m[:, 2:T + 2].reshape(-1)
                ce2 = F.cross_entropy(mtp.float().reshape(-1, cfg.vocab), w[:, 2:T + 2].reshape(-1), reduction='none')
                loss_mtp = (ce2 * m2).sum() / m2.sum().clamp(min=1)
                loss = loss + (1.0 if a.phase == 'mtp' else a.mtp_weight) * loss_mtp
                tot_mtp += float(loss_mtp) / a.accum
            (loss / a.accum).backward()
            tot_loss += float(loss_main) / a.accum
            state['tokens'] += int(w.shape[0] * T)
            tok_window += int(w.shape[0] * T)
        gn = torch.nn.utils.clip_grad_norm_(params_t, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        # auxiliary-loss-free balancing: the selection bias follows the load
        with torch.no_grad():
            for moe in (model.moe_layers() if a.phase != 'mtp' else [model.nextn.block.ffn]):
                if moe.last_load is not None:
                    load = moe.last_load.float()
                    moe.bias += a.bias_rate * torch.sign(load.mean() - load)
        state['step'] += 1
        state['phase_steps'][a.phase] = state['phase_steps'].get(a.phase, 0) + 1
        dt = time.time() - t0
        step_time = dt if step_time == 0 else 0.9 * step_time + 0.1 * dt
        if state['step'] % 10 == 0 or state['step'] == step0 + 1:
            tps = tok_window / max(time.time() - t_window, 1e-9)
            tok_window, t_window = 0, time.time()
            log(dict(event='train', **({'agent_step': True} if agent_step else {}), loss=round(tot_loss, 4), mtp_loss=round(tot_mtp, 4), lr=round(lr, 6),
                     grad_norm=round(float(gn), 3), tok_per_s=round(tps)))
        if a.eval_every and (state['step'] - step0) % a.eval_every == 0:
            run_eval()
        if time.time() - last_save > a.save_every_minutes * 60:
            save()
            last_save = time.time()
    r = run_eval()
    save()
    log(dict(event='end', steps_this_run=state['step'] - step0, loop_seconds=round(time.time() - t_loop, 1),
             **({'final': r} if r else {})))


if __name__ == '__main__':
    main()
