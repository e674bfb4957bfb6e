#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Export a train.py checkpoint (or a model in memory) to the xing4_0 GGUF + config.json the engine
loads (docs/model.md §2: metadata keys, tensor names, shapes and types as model/mkmodel.c writes them).

    export.py --ckpt train/runs/demo --spm tok/xing4-demo.model --out models/xing4-demo/model.gguf \
              [--types release|f32|bf16]

Types: `release` = BF16 token_embd/attention/hc_*_fn, IQ4_NL dense FFN, experts, shared expert and
NextN matrices, Q6_K output, F32 vectors and router (the release's assignment); `f32` = every matrix
F32 (the parity test's file); `bf16` = matrices BF16.
"""
import argparse
import json
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402
import spm_model  # noqa: E402

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPECIALS = ['<_unk>', '<_start>', '<_end>', '<_pad>', '<_user>', '<_bot>', '<_system>', '<_observation>',
            '<_sep>', '<think>', '</think>', '<tool_call>', '</tool_call>', '<tool_response>',
            '</tool_response>'] + [f'<_control{i}>' for i in range(1, 10)]


# ---- tokenizer ----------------------------------------------------------------------------------

def read_spm_model(path):
    """(pieces, scores, types) from a SentencePiece .model (spm_model.py reads it)."""
    pieces, _ = spm_model.read_model(path)
    return ([p.decode('utf-8') for p, _, _ in pieces], [s for _, s, _ in pieces],
            [t for _, _, t in pieces])


def synthetic_vocab(n):
    """A valid vocabulary of n pieces for tests with random weights: the specials at their ids,
    digits/newline/tab user-defined, the 256 byte pieces, '▁' and printable ASCII, padding."""
    pieces = list(SPECIALS)
    types = [TOKEN_UNKNOWN] + [TOKEN_CONTROL] * 23
    for c in '0123456789\n\t':
        pieces.append(c)
        types.append(TOKEN_USER)
    for i in range(256):
        pieces.append(f'<0x{i:02X}>')
        types.append(TOKEN_BYTE)
    for c in ['\u2581'] + [chr(c) for c in range(33, 127) if not chr(c).isdigit()]:
        pieces.append(c)
        types.append(TOKEN_NORMAL)
    while len(pieces) < n:
        pieces.append(f'<unused{len(pieces)}>')
        types.append(TOKEN_CONTROL)
    if len(pieces) > n:
        raise ValueError(f'vocabulary of {n}: at least {len(pieces)} pieces needed')
    scores = [0.0] * n
    r = 0
    for i, t in enumerate(types):
        if t == TOKEN_NORMAL:
            scores[i] = -float(r)
            r += 1
    return pieces, scores, types


# ---- the file -----------------------------------------------------------------------------------

def config_json(cfg):
    return json.dumps({
        'generated_by': 'train/export.py',
        'architectures': ['Xing4_0ForCausalLM'], 'model_type': 'xing4_0',
        'hidden_size': cfg.hidden, 'num_hidden_layers': cfg.layers, 'num_nextn_predict_layers': cfg.nextn,
        'first_k_dense_replace': cfg.dense, 'intermediate_size': cfg.ff, 'moe_intermediate_size': cfg.expert_ff,
        'n_routed_experts': cfg.experts, 'num_experts_per_tok': cfg.experts_used,
        'n_shared_experts': cfg.shared, 'n_group': 1, 'topk_group': 1, 'topk_method': 'noaux_tc',
        'scoring_func': 'sigmoid', 'norm_topk_prob': True, 'routed_scaling_factor': 2.0,
        'num_attention_heads': cfg.heads, 'num_key_value_heads': cfg.heads, 'q_lora_rank': cfg.q_lora,
        'kv_lora_rank': cfg.kv_lora, 'qk_nope_head_dim': cfg.qk_nope, 'qk_rope_head_dim': cfg.qk_rope,
        'v_head_dim': cfg.v_head, 'rms_norm_eps': 1e-06, 'rope_theta': 10000.0, 'rope_interleave': True,
        'rope_scaling': {'type': 'yarn', 'rope_type': 'yarn', 'factor': cfg.yarn_factor,
                         'original_max_position_embeddings': 4096, 'beta_fast': 32.0, 'beta_slow': 1.0,
                         'mscale': 1.0, 'mscale_all_dim': 1.0},
        'max_position_embeddings': cfg.ctx, 'vocab_size': cfg.vocab, 'tie_word_embeddings': False,
        'hc_mult': 4, 'hc_sinkhorn_iters': 20, 'hc_eps': 1e-06,
        'mhc_h_res_clamp_min': -30.0, 'mhc_h_res_clamp_max': 30.0,
        'bos_token_id': 1, 'eos_token_id': 2, 'pad_token_id': 3, 'torch_dtype': 'bfloat16',
    }, indent=2) + '\n'


def type_plan(types):
    if types == 'release':
        return dict(attn=gw.T_BF16, ffn=gw.T_IQ4_NL, output=gw.T_Q6_K, file_type=25)
    if types == 'bf16':
        return dict(attn=gw.T_BF16, ffn=gw.T_BF16, output=gw.T_BF16, file_type=32)
    if types == 'f32':
        return dict(attn=gw.T_F32, ffn=gw.T_F32, output=gw.T_F32, file_type=0)
    raise ValueError(f'types {types}: release, bf16 or f32 expected')


def tensor_plan(cfg, types):
    """[(gguf name, state_dict key, ggml type)] in the order model/mkmodel.c:plan_tensors writes them."""
    tp = type_plan(types)
    A, Fq, O, F32 = tp['attn'], tp['ffn'], tp['output'], gw.T_F32
    plan = []

    def T(name, key, ty):
        plan.append((name, key, ty))

    T('token_embd.weight', 'tok_embd', A)
    T('output_norm.weight', 'output_norm', F32)
    T('output.weight', 'output', O)
    for i in range(cfg.layers + cfg.nextn):
        nextn = i >= cfg.layers
        pre = 'nextn.block.' if nextn else f'blocks.{i}.'
        b = f'blk.{i}.'
        if not nextn:
            for k in ('attn', 'ffn'):
                T(f'{b}hc_{k}_fn.weight', f'{pre}hc_{k}.fn', A)
                T(f'{b}hc_{k}_base.weight', f'{pre}hc_{k}.base', F32)
                T(f'{b}hc_{k}_scale.weight', f'{pre}hc_{k}.scale', F32)
        T(b + 'attn_norm.weight', pre + 'attn.norm', F32)
        T(b + 'ffn_norm.weight', pre + 'ffn.norm', F32)
        T(b + 'attn_q_a.weight', pre + 'attn.q_a', A)
        T(b + 'attn_q_a_norm.weight', pre + 'attn.q_a_norm', F32)
        T(b + 'attn_q_b.weight', pre + 'attn.q_b', A)
        T(b + 'attn_kv_a_mqa.weight', pre + 'attn.kv_a', A)
        T(b + 'attn_kv_a_norm.weight', pre + 'attn.kv_a_norm', F32)
        T(b + 'attn_k_b.weight', pre + 'attn.k_b', A)
        T(b + 'attn_v_b.weight', pre + 'attn.v_b', A)
        T(b + 'attn_output.weight', pre + 'attn.o', A)
        if i < cfg.dense:
            T(b + 'ffn_gate.weight', pre + 'ffn.gate', Fq)
            T(b + 'ffn_up.weight', pre + 'ffn.up', Fq)
            T(b + 'ffn_down.weight', pre + 'ffn.down', Fq)
        else:
            T(b + 'ffn_gate_inp.weight', pre + 'ffn.router', F32)
            T(b + 'exp_probs_b.bias', pre + 'ffn.bias', F32)
            T(b + 'ffn_gate_exps.weight', pre + 'ffn.gate_exps', Fq)
            T(b + 'ffn_up_exps.weight', pre + 'ffn.up_exps', Fq)
            T(b + 'ffn_down_exps.weight', pre + 'ffn.down_exps', Fq)
            if cfg.shared:
                T(b + 'ffn_gate_shexp.weight', pre + 'ffn.gate_sh', Fq)
                T(b + 'ffn_up_shexp.weight', pre + 'ffn.up_sh', Fq)
                T(b + 'ffn_down_shexp.weight', pre + 'ffn.down_sh', Fq)
        if nextn:
            T(b + 'nextn.eh_proj.weight', 'nextn.eh_proj', Fq)
            T(b + 'nextn.embed_tokens.weight', 'nextn.embed_tokens', Fq)
            T(b + 'nextn.shared_head_head.weight', 'nextn.head', Fq)
            T(b + 'nextn.enorm.weight', 'nextn.enorm', F32)
            T(b + 'nextn.hnorm.weight', 'nextn.hnorm', F32)
            T(b + 'nextn.shared_head_norm.weight', 'nextn.head_norm', F32)
    return plan


def export(model, out, vocab=None, types='release', name='xing4-demo', chat_template=None):
    """Write `out` (GGUF) and config.json next to it. vocab = (pieces, scores, types) or None for a
    synthetic one. Returns the file size."""
    cfg = model.cfg
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tp = type_plan(types)
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    if cfg.nextn and cfg.nextn_tied:
        sd['nextn.embed_tokens'], sd['nextn.head'] = sd['tok_embd'], sd['output']
    w = gw.Writer()
    w.str('general.architecture', 'xing4_0')
    w.str('general.name', name)
    w.u32('general.file_type', tp['file_type'])
    w.u32('general.quantization_version', 2)
    p = 'xing4_0.'
    w.u32(p + 'block_count', cfg.layers + cfg.nextn)
    w.u32(p + 'context_length', cfg.ctx)
    w.u32(p + 'embedding_length', cfg.hidden)
    w.u32(p + 'feed_forward_length', cfg.ff)
    w.u32(p + 'vocab_size', cfg.vocab)
    w.u32(p + 'attention.head_count', cfg.heads)
    w.u32(p + 'attention.head_count_kv', 1)
    w.u32(p + 'attention.key_length', cfg.kv_lora + cfg.qk_rope)
    w.u32(p + 'attention.value_length', cfg.kv_lora)
    w.u32(p + 'attention.key_length_mla', cfg.qk_nope + cfg.qk_rope)
    w.u32(p + 'attention.value_length_mla', cfg.v_head)
    w.u32(p + 'attention.q_lora_rank', cfg.q_lora)
    w.u32(p + 'attention.kv_lora_rank', cfg.kv_lora)
    w.f32(p + 'attention.layer_norm_rms_epsilon', 1e-6)
    w.u32(p + 'rope.dimension_count', cfg.qk_rope)
    w.f32(p + 'rope.freq_base', 10000.0)
    w.str(p + 'rope.scaling.type', 'yarn')
    w.f32(p + 'rope.scaling.factor', cfg.yarn_factor)
    w.u32(p + 'rope.scaling.original_context_length', 4096)
    w.f32(p + 'rope.scaling.yarn_beta_fast', 32.0)
    w.f32(p + 'rope.scaling.yarn_beta_slow', 1.0)
    w.f32(p + 'rope.scaling.yarn_log_multiplier', 0.1)
    w.u32(p + 'expert_count', cfg.experts)
    w.u32(p + 'expert_used_count', cfg.experts_used)
    w.u32(p + 'expert_shared_count', cfg.shared)
    w.u32(p + 'expert_feed_forward_length', cfg.expert_ff)
    w.u32(p + 'expert_gating_func', 2)
    w.bool(p + 'expert_weights_norm', True)
    w.f32(p + 'expert_weights_scale', 2.0)
    w.u32(p + 'expert_group_count', 1)
    w.u32(p + 'expert_group_used_count', 1)
    w.u32(p + 'leading_dense_block_count', cfg.dense)
    w.u32(p + 'nextn_predict_layers', cfg.nextn)
    w.u32(p + 'hyper_connection.count', 4)
    w.u32(p + 'hyper_connection.sinkhorn_iterations', 20)
    w.f32(p + 'hyper_connection.epsilon', 1e-6)
    pieces, scores, ttypes = vocab if vocab else synthetic_vocab(cfg.vocab)
    if len(pieces) != cfg.vocab:
        raise ValueError(f'tokenizer has {len(pieces)} pieces, the model {cfg.vocab}')
    for sid, s in ((0, '<_unk>'), (1, '<_start>'), (2, '<_end>'), (3, '<_pad>')):
        if pieces[sid] != s:
            raise ValueError(f'tokenizer id {sid} is {pieces[sid]!r}, {s!r} expected')
    w.str('tokenizer.ggml.model', 'llama')
    w.arr('tokenizer.ggml.tokens', gw.STR, pieces)
    w.arr('tokenizer.ggml.scores', gw.F32V, scores)
    w.arr('tokenizer.ggml.token_type', gw.I32, ttypes)
    w.u32('tokenizer.ggml.bos_token_id', 1)
    w.u32('tokenizer.ggml.eos_token_id', 2)
    w.u32('tokenizer.ggml.unknown_token_id', 0)
    w.u32('tokenizer.ggml.padding_token_id', 3)
    w.bool('tokenizer.ggml.add_bos_token', False)
    w.bool('tokenizer.ggml.add_eos_token', False)
    w.bool('tokenizer.ggml.add_space_prefix', True)
    if chat_template:
        w.str('tokenizer.chat_template', chat_template)

    for name, key, ty in tensor_plan(cfg, types):
        w.tensor(name, sd[key], ty)
    size = w.write(out)
    with open(os.path.join(os.path.dirname(os.path.abspath(out)), 'config.json'), 'w') as f:
        f.write(config_json(cfg))
    return size


def load_checkpoint(path):
    """A train.py checkpoint (a run folder or its ckpt/ folder) as a float32 model."""
    from model import Config, Xing4
    from train import load_ckpt
    cfg_d, sd, idx, _ = load_ckpt(path)
    m = Xing4(Config.from_dict(cfg_d))
    m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    return m.float().eval(), idx


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--ckpt', required=True, help='a train.py run folder or its ckpt/ folder')
    ap.add_argument('--spm', help='SentencePiece .model (default: a synthetic vocabulary)')
    ap.add_argument('--out', required=True)
    ap.add_argument('--types', default='release')
    ap.add_argument('--name', default='xing4-demo')
    ap.add_argument('--chat-template', help='a Jinja file to embed as tokenizer.chat_template')
    a = ap.parse_args()
    m, _ = load_checkpoint(a.ckpt)
    vocab = read_spm_model(a.spm) if a.spm else None
    tmpl = open(a.chat_template).read() if a.chat_template else None
    size = export(m, a.out, vocab, a.types, a.name, tmpl)
    print(f'{a.out}: {size} bytes ({size / 1e6:.2f} MB), types {a.types}')


if __name__ == '__main__':
    main()
