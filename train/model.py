# SPDX-License-Identifier: MIT
"""The xing4_0 forward in PyTorch, written from docs/model.md §3-§5 and §8 (trunk, HC/mHC with
Sinkhorn, MLA with YaRN RoPE, dense and MoE FFN with sigmoid routing, selection bias and a shared
expert, the NextN/MTP block) at any size.

Parameters are held in the row-major shapes the GGUF stores (docs/model.md §2.4, `ne` reversed), so
export.py writes them without transposes. Works on PyTorch 1.13 (Debian, CPU) and 2.x (CUDA): no
torch.compile, F.scaled_dot_product_attention only where present.
"""
import json
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

HC = 4                 # hyper_connection.count (the engine supports exactly 4)
SINKHORN_ITERS = 20
EPS = 1e-6             # RMSNorm and HC eps (layer_norm_rms_epsilon)
HC_CLAMP = 30.0        # comb-logit clamp, config.json mhc_h_res_clamp_min/max
ROPE_BASE = 10000.0
YARN_ORIG_CTX = 4096
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
YARN_LOG_MUL = 0.1
ROUTED_SCALE = 2.0


@dataclass
class Config:
    vocab: int = 512
    hidden: int = 64
    layers: int = 3            # trunk blocks
    dense: int = 1             # leading dense blocks
    nextn: int = 1             # 0 or 1 NextN/MTP block
    heads: int = 4
    q_lora: int = 32
    kv_lora: int = 32
    qk_nope: int = 32
    qk_rope: int = 32
    v_head: int = 32
    ff: int = 128              # dense FFN width
    experts: int = 8
    experts_used: int = 2
    shared: int = 1
    expert_ff: int = 64
    ctx: int = 262144          # YaRN factor = ctx / 4096 (the release: 64)
    # train the NextN block with the trunk's embedding and output head (DeepSeek-V3's MTP shares
    # them); export writes them as the block's own embed_tokens / shared_head_head. Halves the
    # vocabulary-sized weights of the checkpoint.
    nextn_tied: bool = True

    @property
    def yarn_factor(self):
        return self.ctx / YARN_ORIG_CTX

    def to_json(self):
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_dict(d):
        return Config(**{k: v for k, v in d.items() if k in Config.__dataclass_fields__})


def rmsnorm(x, w=None):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    if w is not None:
        y = y * w.float()
    return y.to(x.dtype)


def yarn_inv_freq(cfg):
    """docs/model.md §4.1: YaRN ramp in pair indices; cos/sin not magnitude-scaled."""
    n = cfg.qk_rope
    i = torch.arange(n // 2, dtype=torch.float64)
    f = ROPE_BASE ** (-2.0 * i / n)
    factor = cfg.yarn_factor
    if factor == 1.0:
        return f
    low = math.floor(n * math.log(YARN_ORIG_CTX / (YARN_BETA_FAST * 2 * math.pi)) / (2 * math.log(ROPE_BASE)))
    high = math.ceil(n * math.log(YARN_ORIG_CTX / (YARN_BETA_SLOW * 2 * math.pi)) / (2 * math.log(ROPE_BASE)))
    ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)
    return f * (1 - ramp) + (f / factor) * ramp


def attn_scale(cfg):
    m = 1.0 + YARN_LOG_MUL * math.log(cfg.yarn_factor)
    return (cfg.qk_nope + cfg.qk_rope) ** -0.5 * m * m


def rope(x, cos, sin):
    """Adjacent pairs (x[2i], x[2i+1]); x (..., T, n), cos/sin (T, n/2)."""
    x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack((y0, y1), dim=-1).flatten(-2).to(x.dtype)


def P(*shape):
    return nn.Parameter(torch.empty(*shape))


class HyperConn(nn.Module):
    """docs/model.md §3.1: pre/post/comb from the unweighted-normed concatenated streams."""

    def __init__(self, H):
        super().__init__()
        self.fn = P(HC * (2 + HC), HC * H)      # hc_*_fn   [24, 4H]
        self.base = P(HC * (2 + HC))            # hc_*_base [24]
        self.scale = P(3)                       # hc_*_scale

    def gates(self, X):
        """X: (B, T, 4, H) -> pre (B,T,4), post (B,T,4), C (B,T,4dst,4src), all fp32."""
        z = X.flatten(-2).float()
        z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + EPS)
        w = z @ self.fn.float().t()
        s, b = self.scale.float(), self.base.float()
        pre = torch.sigmoid(w[..., 0:HC] * s[0] + b[0:HC])
        post = 2.0 * torch.sigmoid(w[..., HC:2 * HC] * s[1] + b[HC:2 * HC])
        L = (w[..., 2 * HC:] * s[2] + b[2 * HC:]).clamp(-HC_CLAMP, HC_CLAMP)
        L = L.view(*L.shape[:-1], HC, HC)                                   # [dst][src]
        M = torch.exp(L - L.amax(-1, keepdim=True))
        for _ in range(SINKHORN_ITERS):
            M = M / (M.sum(-1, keepdim=True) + EPS)     # over src, per dst
            M = M / (M.sum(-2, keepdim=True) + EPS)     # over dst, per src
        return pre, post, M

    @staticmethod
    def collapse(X, pre):
        return torch.einsum('bts,btsh->bth', pre, X.float()).to(X.dtype)

    @staticmethod
    def expand(X, post, C, out):
        mix = torch.einsum('btds,btsh->btdh', C, X.float())
        return (mix + post.unsqueeze(-1) * out.float().unsqueeze(-2)).to(X.dtype)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg
        self.cfg = c
        self.norm = P(c.hidden)                                        # attn_norm (applied by the block)
        self.q_a = P(c.q_lora, c.hidden)
        self.q_a_norm = P(c.q_lora)
        self.q_b = P(c.heads * (c.qk_nope + c.qk_rope), c.q_lora)
        self.kv_a = P(c.kv_lora + c.qk_rope, c.hidden)                # attn_kv_a_mqa
        self.kv_a_norm = P(c.kv_lora)
        self.k_b = P(c.heads, c.kv_lora, c.qk_nope)                   # Kb[h][j][i]
        self.v_b = P(c.heads, c.v_head, c.kv_lora)                    # Vb[h][d][j]
        self.o = P(c.hidden, c.heads * c.v_head)                      # attn_output

    def forward(self, a, cos, sin, scale):
        c = self.cfg
        B, T, _ = a.shape
        nh, dn, dr = c.heads, c.qk_nope, c.qk_rope
        qa = rmsnorm(F.linear(a, self.q_a), self.q_a_norm)
        q = F.linear(qa, self.q_b).view(B, T, nh, dn + dr).transpose(1, 2)   # (B, nh, T, 192)
        q_nope, q_pe = q[..., :dn], rope(q[..., dn:], cos, sin)
        kv = F.linear(a, self.kv_a)
        lat = rmsnorm(kv[..., :c.kv_lora], self.kv_a_norm)                  # (B, T, kvl)
        k_pe = rope(kv[..., c.kv_lora:], cos, sin)                           # (B, T, dr), shared by heads
        k_nope = torch.einsum('hji,btj->bhti', self.k_b.to(lat.dtype), lat)
        v = torch.einsum('hdj,btj->bhtd', self.v_b.to(lat.dtype), lat)
        k = torch.cat((k_nope, k_pe.unsqueeze(1).expand(B, nh, T, dr)), dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1)
        if hasattr(F, 'scaled_dot_product_attention'):
            # default scale is 1/sqrt(192): fold ours into q (works on every 2.x)
            q = q * (scale * math.sqrt(dn + dr))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q.float() @ k.float().transpose(-1, -2)) * scale
            mask = torch.ones(T, T, dtype=torch.bool, device=a.device).triu(1)
            s = s.masked_fill(mask, float('-inf'))
            o = (torch.softmax(s, dim=-1) @ v.float()).to(a.dtype)
        o = o.transpose(1, 2).reshape(B, T, nh * c.v_head)
        return F.linear(o, self.o)


def swiglu(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


class DenseFFN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = P(cfg.hidden)
        self.gate = P(cfg.ff, cfg.hidden)
        self.up = P(cfg.ff, cfg.hidden)
        self.down = P(cfg.hidden, cfg.ff)

    def forward(self, f):
        return swiglu(f, self.gate, self.up, self.down)


class MoE(nn.Module):
    """docs/model.md §5: sigmoid scores in fp32, top-k of score + bias (bias selects only), weights from
    the unbiased scores normalised (+1e-20) and x2, plus the always-on shared expert."""

    def __init__(self, cfg):
        super().__init__()
        c = cfg
        self.cfg = c
        self.norm = P(c.hidden)
        self.router = P(c.experts, c.hidden)                   # ffn_gate_inp (F32)
        self.register_buffer('bias', torch.zeros(c.experts))   # exp_probs_b: trained by load, not grad
        self.gate_exps = P(c.experts, c.expert_ff, c.hidden)
        self.up_exps = P(c.experts, c.expert_ff, c.hidden)
        self.down_exps = P(c.experts, c.hidden, c.expert_ff)
        sh = c.expert_ff * c.shared
        self.gate_sh = P(sh, c.hidden)
        self.up_sh = P(sh, c.hidden)
        self.down_sh = P(c.hidden, sh)
        self.last_load = None                                  # (E,) token counts of the last forward

    def forward(self, f):
        c = self.cfg
        shape = f.shape
        x = f.reshape(-1, shape[-1])
        with torch.autocast(device_type=x.device.type, enabled=False):      # the router in fp32
            s = torch.sigmoid(x.float() @ self.router.float().t())              # (N, E)
        sel = torch.topk(s + self.bias, c.experts_used, dim=-1, sorted=True).indices
        sw = torch.gather(s, 1, sel)
        gw = sw / (sw.sum(-1, keepdim=True) + 1e-20) * ROUTED_SCALE
        # tokens sorted by expert, one host sync per layer (the counts) instead of one per expert
        flat = sel.flatten()
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=c.experts)
        with torch.no_grad():
            self.last_load = counts.detach()
        tok = order // c.experts_used
        xs = x[tok]
        ws = gw.flatten()[order].unsqueeze(-1)
        outs = []
        n_e = counts.tolist()
        for e, (xe, n) in enumerate(zip(torch.split(xs, n_e), n_e)):
            if n:
                outs.append(swiglu(xe, self.gate_exps[e], self.up_exps[e], self.down_exps[e]).float())
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if outs:
            y = y.index_add(0, tok, torch.cat(outs) * ws)
        y = y + swiglu(x, self.gate_sh, self.up_sh, self.down_sh).float()
        return y.to(f.dtype).view(shape)


class Block(nn.Module):
    def __init__(self, cfg, idx, hc=True):
        super().__init__()
        self.attn = MLA(cfg)
        self.ffn = DenseFFN(cfg) if idx < cfg.dense else MoE(cfg)
        if hc:
            self.hc_attn = HyperConn(cfg.hidden)
            self.hc_ffn = HyperConn(cfg.hidden)

    def forward(self, X, cos, sin, scale):
        pre, post, C = self.hc_attn.gates(X)
        a = rmsnorm(HyperConn.collapse(X, pre), self.attn.norm)
        X = HyperConn.expand(X, post, C, self.attn(a, cos, sin, scale))
        pre, post, C = self.hc_ffn.gates(X)
        f = rmsnorm(HyperConn.collapse(X, pre), self.ffn.norm)
        return HyperConn.expand(X, post, C, self.ffn(f))


class NextN(nn.Module):
    """docs/model.md §8: the MTP block; draft for token t+2 from the trunk's normed hidden of t and the
    embedding of token t+1. Positions: row t at position t (U5, the choice train.py makes)."""

    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden
        self.block = Block(cfg, cfg.layers, hc=False)    # MoE (index >= dense), no hc_*
        self.eh_proj = P(H, 2 * H)
        if not cfg.nextn_tied:
            self.embed_tokens = P(cfg.vocab, H)
            self.head = P(cfg.vocab, H)                    # shared_head_head
        self.enorm = P(H)
        self.hnorm = P(H)
        self.head_norm = P(H)                              # shared_head_norm

    def forward(self, h, next_ids, cos, sin, scale, embed, head):
        e = rmsnorm(F.embedding(next_ids, embed), self.enorm)
        g = rmsnorm(h, self.hnorm)
        x = F.linear(torch.cat((e, g.to(e.dtype)), dim=-1), self.eh_proj)
        b = self.block
        x = x + b.attn(rmsnorm(x, b.attn.norm), cos, sin, scale)
        x = x + b.ffn(rmsnorm(x, b.ffn.norm))
        return F.linear(rmsnorm(x, self.head_norm), head)


class Xing4(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embd = P(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.output_norm = P(cfg.hidden)
        self.output = P(cfg.vocab, cfg.hidden)
        self.nextn = NextN(cfg) if cfg.nextn else None
        self.register_buffer('inv_freq', yarn_inv_freq(cfg), persistent=False)
        self.scale = attn_scale(cfg)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std=0.02):
        for name, p in self.named_parameters():
            leaf = name.rsplit('.', 1)[-1]
            if p.dim() == 1 and ('norm' in leaf or leaf in ('enorm', 'hnorm')):
                p.fill_(1.0)
            elif leaf == 'base':
                # pre sigma(0) = 0.5, post 2 sigma(0) = 1, comb logits favour the identity
                p.zero_()
                p[2 * HC:].view(HC, HC).fill_diagonal_(2.0)
            elif leaf == 'scale':
                p.fill_(0.1)
            elif leaf in ('tok_embd', 'embed_tokens'):
                p.normal_(0, 1.0)
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.normal_(0, min(std, fan_in ** -0.5))
            else:
                p.normal_(0, std)
        for b in list(self.blocks) + ([self.nextn.block] if self.nextn else []):
            # residual-output projections start small (GPT-2 style)
            k = (2 * (self.cfg.layers + 1)) ** -0.5
            b.attn.o.mul_(k)
            if isinstance(b.ffn, MoE):
                b.ffn.down_exps.mul_(k)
                b.ffn.down_sh.mul_(k)
            else:
                b.ffn.down.mul_(k)

    def rope_tables(self, T, device, offset=0):
        pos = torch.arange(offset, offset + T, dtype=torch.float64, device=device)
        th = pos[:, None] * self.inv_freq.to(device)[None, :]
        return th.cos().float(), th.sin().float()

    def trunk(self, ids):
        """ids (B, T) -> the normed final hidden (B, T, H) (docs/model.md §3 steps 1-4 before the head)."""
        B, T = ids.shape
        cos, sin = self.rope_tables(T, ids.device)
        e = F.embedding(ids, self.tok_embd)
        X = e.unsqueeze(2).expand(B, T, HC, e.shape[-1]).contiguous()
        for b in self.blocks:
            X = b(X, cos, sin, self.scale)
        return rmsnorm(X.float().mean(2).to(X.dtype), self.output_norm)

    def forward(self, ids, mtp_ids=None):
        """Trunk logits (B, T, V); with mtp_ids (the tokens t+1, shape (B, T)) also the MTP logits."""
        h = self.trunk(ids)
        logits = F.linear(h, self.output)
        if mtp_ids is None or self.nextn is None:
            return logits, None
        cos, sin = self.rope_tables(ids.shape[1], ids.device)
        n = self.nextn
        embed, head = (self.tok_embd, self.output) if self.cfg.nextn_tied else (n.embed_tokens, n.head)
        return logits, n(h, mtp_ids, cos, sin, self.scale, embed, head)

    def moe_layers(self):
        out = [b.ffn for b in self.blocks if isinstance(b.ffn, MoE)]
        if self.nextn is not None:
            out.append(self.nextn.block.ffn)
        return out


def gguf_sizes(cfg):
    """Bytes per tensor class in the release's types (BF16 attention/HC/embedding, IQ4_NL FFN, experts
    and NextN matrices, Q6_K head, F32 vectors)."""
    H, V = cfg.hidden, cfg.vocab
    bf16, iq4, q6k, f32 = 2.0, 18 / 32, 210 / 256, 4.0
    att = (cfg.q_lora * H + cfg.heads * (cfg.qk_nope + cfg.qk_rope) * cfg.q_lora + (cfg.kv_lora + cfg.qk_rope) * H
           + cfg.heads * cfg.kv_lora * cfg.qk_nope + cfg.heads * cfg.v_head * cfg.kv_lora + H * cfg.heads * cfg.v_head)
    hc = 2 * HC * (2 + HC) * HC * H
    moe = 3 * cfg.experts * cfg.expert_ff * H + 3 * cfg.shared * cfg.expert_ff * H
    dense = 3 * cfg.ff * H
    nblk = cfg.layers + cfg.nextn
    n_moe = nblk - cfg.dense
    s = {
        'token_embd (BF16)': V * H * bf16,
        'output (Q6_K)': V * H * q6k,
        'attention (BF16)': nblk * att * bf16,
        'hc (BF16)': cfg.layers * hc * bf16,
        'dense FFN (IQ4_NL)': cfg.dense * dense * iq4,
        'experts + shared (IQ4_NL)': n_moe * moe * iq4,
        'router etc (F32)': n_moe * cfg.experts * (H + 1) * f32,
        'nextn (IQ4_NL)': cfg.nextn * (2 * H * H + 2 * V * H) * iq4,
    }
    params = (V * H * 2 + nblk * att + cfg.layers * hc + cfg.dense * dense + n_moe * (moe + cfg.experts * H)
              + cfg.nextn * (2 * H * H + (0 if cfg.nextn_tied else 2 * V * H)))
    active = (nblk * att + cfg.layers * hc + cfg.dense * dense
              + n_moe * 3 * (cfg.experts_used + cfg.shared) * cfg.expert_ff * H + V * H)
    return s, params, active
