"""Small references of released cache algorithms, written from reading the releases and sharing
no code with `tadm.caches`: each is a literal loop of the release's branches over the weights of
the project's LLaDA modules (their `nn.Linear` / norm objects only; RoPE, attention, the cache
bookkeeping and the decode loop are written here).

- `ref_dkv_decode`: dKV-Cache-Decode (horseee/dKV-Cache @49a76fc,
  `generation_utils/llada_dkv_cache_decode.py: generate` with `enable_cache=True`, and the block
  of `models/modeling_llada_dkv_cache_decode.py`): K/V kept before RoPE, keys in
  [computed; kept] order, the kept set rebuilt after every pass by scattering [computed; kept]
  back to canvas order and taking the rows decided in that pass's input; no key mask unless one
  is given. The mask class's logit is set to −inf before the argmax, as everywhere in this
  project's LLaDA decoding (docs/deviations.md, LLaDA row).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _rope_tables(length: int, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """The release's RotaryEmbedding tables: sin, cos of cat(freqs, freqs), (length, head_dim)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = torch.einsum("i,j->ij", torch.arange(length, dtype=torch.float), inv_freq)
    both = torch.cat((freqs, freqs), dim=-1)
    return both.sin(), both.cos()


def _rotate_half(t: Tensor) -> Tensor:
    b, nh, n, hs = t.shape
    x1, x2 = t.view(b, nh, n, 2, hs // 2).unbind(dim=-2)
    return torch.cat((-x2, x1), dim=-1)


def _rope(t: Tensor, positions: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """t (B, heads, n, hs) with row j at canvas position positions[b, j]."""
    s, c = sin[positions].unsqueeze(1), cos[positions].unsqueeze(1)  # (B, 1, n, hs)
    return (t.float() * c + _rotate_half(t.float()) * s).to(t.dtype)


def _split_heads(t: Tensor, heads: int) -> Tensor:
    b, n, d = t.shape
    return t.view(b, n, heads, d // heads).transpose(1, 2)


def _layer(block, x: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, pad: Tensor | None,
           sin: Tensor, cos: Tensor) -> Tensor:
    """The release's block after its projections: q (from x's rows) at q_pos, keys k / v
    (B, Tk, D) before RoPE at k_pos, SDPA, output projection, then the SwiGLU MLP."""
    cfg = block.cfg
    q = _rope(_split_heads(block.q_proj(block.attn_norm(x)), cfg.n_heads), q_pos, sin, cos)
    kh = _rope(_split_heads(k, cfg.n_heads), k_pos, sin, cos)
    vh = _split_heads(v, cfg.n_heads)
    mask = None if pad is None else torch.gather(pad, 1, k_pos)[:, None, None, :]
    att = F.scaled_dot_product_attention(q, kh, vh, attn_mask=mask, is_causal=False)
    b, _, n, _ = q.shape
    x = x + block.attn_out(att.transpose(1, 2).reshape(b, n, cfg.d_model))
    h = block.ff_norm(x)
    return x + block.ff_out(F.silu(block.ff_proj(h)) * block.up_proj(h))


def _head(model, x: Tensor) -> Tensor:
    t = model.transformer
    h = t["ln_f"](x)
    out = (F.linear(h, t["wte"].weight) if model.cfg.weight_tying else t["ff_out"](h)).float()
    out[..., model.mask_id] = float("-inf")
    return out


def _rows(mask: Tensor) -> Tensor:
    """Positions of the True entries of each row of mask (B, T), same count per row: (B, n)."""
    return torch.nonzero(mask, as_tuple=True)[1].view(mask.shape[0], -1)


def _full_pass(model, x: Tensor, keep: Tensor | None, pad: Tensor | None, sin: Tensor, cos: Tensor):
    """A full pass; with `keep` (B, T) the kept K, V (before RoPE) of those rows per layer."""
    b, t = x.shape
    h = model.transformer["wte"](x)
    pos = torch.arange(t).expand(b, t)
    kept = []
    for block in model.blocks:
        hn = block.attn_norm(h)
        k, v = block.k_proj(hn), block.v_proj(hn)
        if keep is not None:
            d = k.shape[-1]
            kept.append((k[keep].view(b, -1, d), v[keep].view(b, -1, d)))
        h = _layer(block, h, k, v, pos, pos, pad, sin, cos)
    return _head(model, h), kept


def _cached_pass(model, x: Tensor, prv: Tensor, cur: Tensor, kept: list, pad: Tensor | None,
                 sin: Tensor, cos: Tensor):
    """A cached pass: the rows ~prv computed, keys [computed; kept (rows prv)]; the new kept set
    is the rows cur of [computed; kept] scattered back to canvas order."""
    b, t = x.shape
    sel = ~prv
    q_pos = _rows(sel)
    k_pos = torch.cat([q_pos, _rows(prv)], dim=1)
    h = model.transformer["wte"](x[sel].view(b, -1))
    new_kept = []
    for block, (past_k, past_v) in zip(model.blocks, kept):
        hn = block.attn_norm(h)
        k = torch.cat([block.k_proj(hn), past_k], dim=1)
        v = torch.cat([block.v_proj(hn), past_v], dim=1)
        d = k.shape[-1]
        index = k_pos.unsqueeze(-1).expand(b, t, d)
        canvas_k = torch.zeros(b, t, d, dtype=k.dtype).scatter_(1, index, k)
        canvas_v = torch.zeros(b, t, d, dtype=v.dtype).scatter_(1, index, v)
        new_kept.append((canvas_k[cur].view(b, -1, d), canvas_v[cur].view(b, -1, d)))
        h = _layer(block, h, k, v, q_pos, k_pos, pad, sin, cos)
    return _head(model, h), new_kept, q_pos


def _transfer_counts(block_masked: Tensor, steps: int) -> Tensor:
    """LLaDA's get_num_transfer_tokens: masked // steps a step, the remainder on the first steps."""
    total = block_masked.sum(dim=1, keepdim=True)
    counts = torch.zeros(block_masked.shape[0], steps, dtype=torch.int64) + total // steps
    for i in range(block_masked.shape[0]):
        counts[i, : int(total[i] % steps)] += 1
    return counts


@torch.no_grad()
def ref_dkv_decode(model, prompt: Tensor, steps: int, gen: int, block: int, reload: int,
                   pad: Tensor | None = None, trace: list | None = None) -> tuple[Tensor, list[int]]:
    """dKV-Cache-Decode's `generate` (temperature 0, low-confidence) on the prompts (B, P); `pad`
    (B, P + gen) bool, True at a token, masks pad keys when given (the release gives none).
    Returns (the canvas, the rows each pass computed); `trace` receives each pass's
    (positions computed (B, n), their logits (B, n, V))."""
    mask_id = model.mask_id
    b, p = prompt.shape
    x = torch.full((b, p + gen), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    sin, cos = _rope_tables(p + gen, model.cfg.head_dim, model.cfg.rope_theta)
    blocks = gen // block
    per_block = steps // blocks
    rows: list[int] = []
    for nb in range(blocks):
        kept, prv, cur = None, None, None
        end = p + (nb + 1) * block
        counts = _transfer_counts(x[:, p + nb * block: end] == mask_id, per_block)
        for i in range(per_block):
            masked = x == mask_id
            if i % reload != 0 and i > 1:
                logits, kept, q_pos = _cached_pass(model, x, prv, cur, kept, pad, sin, cos)
                rows.append(q_pos.shape[1])
            else:
                logits, kept = _full_pass(model, x, cur if i > 0 else None, pad, sin, cos)
                q_pos = None
                rows.append(x.shape[1])
            if trace is not None:
                trace.append((torch.arange(x.shape[1]).expand(b, -1) if q_pos is None else q_pos, logits))
            x0 = logits.argmax(-1)
            x0_p = torch.gather(F.softmax(logits.to(torch.float64), dim=-1), -1, x0.unsqueeze(-1)).squeeze(-1)
            if q_pos is not None:  # refill the rows not computed: confidence -inf, token mask
                x0_p = torch.full(x.shape, float("-inf"), dtype=torch.float64).scatter_(1, q_pos, x0_p)
                x0 = torch.full(x.shape, mask_id, dtype=torch.long).scatter_(1, q_pos, x0)
            x0_p[:, end:] = float("-inf")
            x0 = torch.where(masked, x0, x)
            confidence = torch.where(masked, x0_p, torch.tensor(float("-inf"), dtype=torch.float64))
            transfer = torch.zeros_like(x, dtype=torch.bool)
            for j in range(b):
                transfer[j, torch.topk(confidence[j], k=int(counts[j, i])).indices] = True
            x[transfer] = x0[transfer]
            prv, cur = cur, x != mask_id
    return x, rows


# --------------------------------------------------------------------------- d²Cache
# Kamichanw/d2Cache @72feb60: the loop `src/generation/vanilla.py` (vanilla_generate / generate_step /
# confidence_unmasking, num_transfer_tokens 1, temperature 0, its `sigma` None: ranking by confidence),
# `check_can_generate` (`src/generation/utils.py`: the caller's block mask shrunk in place to the block's
# still-masked positions), the cache `src/cache/d2cache.py` and `src/utils/common.py`'s helpers, eager
# attention as in `src/models/llada/modeling_llada.py` (softmax in float32, additive dtype-minimum mask).


def ref_certainty_density(mask: Tensor, sigma: float) -> Tensor:
    """`certainty_density` by FFT as the release computes it: the span padded left with 1 and right
    with its last value, circular convolution with a Gaussian over 6 L, normalised by the full kernel."""
    b, n = mask.shape
    padded = F.pad(mask.float(), (n, n), "constant", 1.0)
    padded[mask[:, -1] == False, 2 * n:] = 0.0  # noqa: E712  (the release's test)
    ext = 3 * n
    dist = torch.cat((torch.arange(ext), torch.arange(-ext, 0)))
    kernel = torch.fft.fft(torch.exp(-(dist ** 2) / (2 * sigma ** 2)), n=2 * ext)
    weighted = torch.fft.ifft(torch.fft.fft(F.pad(padded, (0, ext)), n=2 * ext) * kernel, n=2 * ext).real
    total = torch.fft.ifft(torch.fft.fft(torch.ones(b, 2 * ext), n=2 * ext) * kernel, n=2 * ext).real
    return weighted[..., n: 2 * n] / total[..., n: 2 * n].clamp_min(1e-8)


def _ref_nucleus(scores: Tensor, top_p: float, allowed: Tensor, min_k: int = 1) -> Tensor:
    s = torch.where(allowed, scores, 0.0)
    probs = s / (s.sum(dim=-1, keepdim=True) + 1e-9)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    keep = (torch.cumsum(sorted_probs, dim=-1) <= top_p) | (torch.arange(s.shape[-1]) < min(min_k, s.shape[-1]))
    keep &= torch.gather(allowed, 1, order)
    return torch.zeros_like(s, dtype=torch.bool).scatter_(1, order, keep)


def _ref_top_up(q: Tensor, importance: Tensor, density_score: Tensor) -> Tensor:
    q = q.clone()
    counts = q.sum(-1)
    if not torch.any(counts != counts.max()):
        return q
    g = density_score.shape[1]
    combined = torch.where(q, -torch.inf, importance)
    combined[:, -g:] += combined.max() + density_score
    need = (int(counts.max()) - counts).clamp(min=0)
    scores = torch.where(q, -torch.inf, combined)
    idx = torch.topk(scores, k=int(need.max()), dim=-1).indices
    chosen = idx.masked_select(torch.arange(int(need.max())).expand(q.shape[0], -1) < need.unsqueeze(-1))
    rows = torch.repeat_interleave(torch.arange(q.shape[0]), need)
    q[rows, chosen] = True
    return q


def _ref_inflate(q: Tensor, width: int) -> Tensor:
    b, t = q.shape
    ar = torch.arange(t).expand(b, -1)
    nxt = torch.flip(torch.cummin(torch.flip(torch.where(q, ar, t), dims=[-1]), dim=-1).values, dims=[-1])
    prv = torch.cummax(torch.where(q, ar, -1), dim=-1).values
    return q | (((nxt - ar) + (ar - prv) <= width) & (prv >= 0) & (nxt < t))


def _eager_layer(block, h: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, kv_pos: Tensor, bias: Tensor | None,
                 sin: Tensor, cos: Tensor) -> tuple[Tensor, Tensor]:
    """The block with eager attention: (output rows, head-mean attention weights (B, n, T))."""
    cfg = block.cfg
    q = _rope(_split_heads(block.q_proj(block.attn_norm(h)), cfg.n_heads), q_pos, sin, cos)
    kh = _rope(_split_heads(k, cfg.n_heads), kv_pos, sin, cos)
    vh = _split_heads(v, cfg.n_heads)
    w = torch.matmul(q, kh.transpose(2, 3)) / (q.size(-1) ** 0.5)
    if bias is not None:
        w = w + bias
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    att = torch.matmul(w, vh)
    b, _, n, _ = q.shape
    h = h + block.attn_out(att.transpose(1, 2).reshape(b, n, cfg.d_model))
    f = block.ff_norm(h)
    return h + block.ff_out(F.silu(block.ff_proj(f)) * block.up_proj(f)), w.mean(dim=1)


def _rollout_step(rollout: Tensor, effective: Tensor) -> Tensor:
    t = effective.shape[-1]
    residual = effective + torch.eye(t)
    return (residual / residual.sum(dim=-1, keepdim=True)) @ rollout


@torch.no_grad()
def ref_vanilla_d2cache(model, prompt: Tensor, gen: int, block: int, rollout_p: float, current_k: int, sigma: float,
                        inflate_w: int, pad: Tensor | None = None, shifted: bool = False,
                        prior: float | None = None) -> tuple[Tensor, list[Tensor]]:
    """The release's vanilla loop with d²Cache on the prompts (B, P): `pad` (B, P + gen) bool
    (True at a token) masks pad keys; `shifted` places positions by the padding (the release's
    LLaDA: cumsum - 1, pads at 0) instead of 0..T-1; `prior`: the decoder's certainty prior
    (generation.sigma: the pick ranks confidence x certainty density of the decided positions,
    vanilla.py's generate_step), None: confidence alone. Returns (the canvas, each pass's row set
    (B, T) bool after the top-up)."""
    mask_id = model.mask_id
    b, p = prompt.shape
    t = p + gen
    x = torch.cat([prompt, torch.full((b, gen), mask_id, dtype=torch.long)], dim=1)
    if shifted and pad is not None:
        pos = (pad.long().cumsum(-1) - 1).masked_fill(~pad, 0)
    else:
        pos = torch.arange(t).expand(b, t)
    bias = None if pad is None else ((1.0 - pad.float()) * torch.finfo(torch.float32).min)[:, None, None, :]
    sin, cos = _rope_tables(t, model.cfg.head_dim, model.cfg.rope_theta)
    wte = model.transformer["wte"]
    key_cache: list[Tensor] = []
    value_cache: list[Tensor] = []
    conf_cache = full_q = importance = density_score = None
    passes: list[Tensor] = []
    for nb in range(gen // block):
        block_mask = torch.zeros(b, gen, dtype=torch.bool)
        block_mask[:, nb * block: (nb + 1) * block] = True
        while True:
            block_mask &= x[:, p:] == mask_id  # check_can_generate, in place
            if not block_mask.any():
                break
            h = wte(x)
            rollout = torch.eye(t).expand(b, t, t)
            if full_q is None:  # the first pass: everything, the cache filled
                q_used = torch.ones(b, t, dtype=torch.bool)
                for block_ in model.blocks:
                    hn = block_.attn_norm(h)
                    k, v = block_.k_proj(hn), block_.v_proj(hn)
                    key_cache.append(k)
                    value_cache.append(v)
                    h, w = _eager_layer(block_, h, k, v, pos, pos, bias, sin, cos)
                    rollout = _rollout_step(rollout, w)
                logits = _head(model, h)
            else:
                q_used = _ref_top_up(full_q, importance, density_score)
                d = h.shape[-1]
                h = h[q_used].view(b, -1, d)
                q_pos = pos[q_used].view(b, -1)
                for i, block_ in enumerate(model.blocks):
                    hn = block_.attn_norm(h)
                    key_cache[i][q_used] = block_.k_proj(hn).flatten(0, 1)
                    value_cache[i][q_used] = block_.v_proj(hn).flatten(0, 1)
                    h, w = _eager_layer(block_, h, key_cache[i], value_cache[i], q_pos, pos, bias, sin, cos)
                    effective = torch.eye(t).repeat(b, 1, 1)
                    effective[q_used] = w.reshape(-1, t)
                    rollout = _rollout_step(rollout, effective)
                rows = _head(model, h)  # the mask class at -inf (this project's convention)
                logits = torch.zeros(b, t, rows.shape[-1]).masked_scatter_(q_used.unsqueeze(-1), rows)
                logits[..., mask_id] = float("-inf")
            passes.append(q_used)
            probs = torch.softmax(logits[:, p:], dim=-1)
            conf, x0 = probs.max(dim=-1)
            remaining_before = x[:, p:] == mask_id
            confidence = torch.where(remaining_before, conf, -torch.inf)
            candidates = remaining_before & block_mask
            ranked = confidence if prior is None else confidence * ref_certainty_density(~remaining_before, prior)
            picked = torch.topk(torch.where(candidates, ranked, -torch.inf), k=1, dim=-1).indices
            new_x = x.clone()
            new_x[torch.arange(b).unsqueeze(-1), p + picked] = torch.gather(x0, 1, picked)
            # on_step_end
            if conf_cache is None:
                conf_cache = confidence
            remaining = new_x[:, p:] == mask_id
            size = block_mask.sum(dim=1, keepdim=True)
            meets = torch.cumsum(remaining.int(), dim=1) >= current_k
            min_end = torch.argmax(meets.int(), dim=1, keepdim=True)
            min_end[~meets.any(dim=1, keepdim=True)] = gen - 1
            search_end = ((min_end // size) + 1) * size - 1
            start = torch.argmax(block_mask.int(), dim=1, keepdim=True)
            cols = torch.arange(gen)
            search = (cols >= start) & (cols <= search_end)
            scores = conf_cache * ref_certainty_density(~remaining, sigma)
            scores[block_mask] += scores.max()
            idx = torch.topk(torch.where(search & remaining, scores, -torch.inf), k=min(current_k, gen), dim=-1).indices
            selected = torch.zeros_like(remaining).scatter_(1, idx, True) & remaining
            response = selected.clone()
            response[torch.arange(b).unsqueeze(-1), picked] = True
            q_mask = F.pad(response, (p, 0), value=False)
            importance = rollout.sum(dim=1)
            q_mask |= _ref_nucleus(importance, rollout_p, ~q_mask)
            if inflate_w > 0:
                q_mask = _ref_inflate(q_mask, inflate_w)
            full_q, density_score = q_mask, scores
            x = new_x
    return x, passes
