"""LLaDA (Nie et al., 2025), the model family ASRD is evaluated on, written here in plain torch.

The released LLaDA-8B-Instruct (hub: GSAI-ML/LLaDA-8B-Instruct) ships its architecture as
``trust_remote_code`` Python (``modeling_llada.py`` / ``configuration_llada.py``, an OLMo
derivative). This module never runs that code: it is an independent implementation of the same
network whose parameter names and shapes are those of the release's safetensors, so the
released files load into it directly (no pickle, no remote code).

Architecture (the release's ``LLaDALlamaBlock``, ``block_type: llama``): a LLaMA-style
pre-norm transformer *without* a causal mask (every position attends to every position),
RMSNorm (statistics in float32), rotary embeddings over the full head dimension (half-split
rotation, base ``rope_theta``, in float32 when ``rope_full_precision``), grouped-query attention
(``n_kv_heads``), and a SwiGLU MLP ``ff_out(silu(ff_proj(x)) * up_proj(x))``. The mask token is
``mask_token_id`` (126336 in the release), an ordinary row of the vocabulary.

Padding, as the current release: ``model(ids, attention_mask=m)`` with ``m`` (B, L), 1 at a real
token and 0 at a pad, keeps every query from attending to a pad key (a key-padding mask; the
pad positions' own outputs are computed but meaningless). The release's ``modeling_llada.py``
(the hub file's current version) turns such a mask into an additive
bias of the dtype's minimum on the pad keys, and only when the mask has a zero: a mask of all
ones, like no mask, runs the unmasked attention (here too: bit-identical to ``attention_mask=None``);
its ``generate.py`` passes the tokenizer's mask of a left-padded batch, extended with ones over the
generated span. Rotary positions are not shifted for padding: a left-padded row's tokens sit at
their canvas positions 0..L-1, pads included, as in the release (its rotary embedding indexes
positions by sequence offset and takes no position ids). Because RoPE scores depend only on
position differences and no real position attends to a pad, a left-padded row computes the same
function as the row alone; only the rounding of the rotation angles differs (tested).

Tensor names (``model.`` is the HF wrapper's ``base_model_prefix``; N = 0 .. n_layers-1)::

    model.transformer.wte.weight                      (embedding_size, d_model)
    model.transformer.blocks.N.attn_norm.weight       (d_model,)
    model.transformer.blocks.N.q_proj.weight          (d_model, d_model)
    model.transformer.blocks.N.k_proj.weight          (n_kv_heads * head_dim, d_model)
    model.transformer.blocks.N.v_proj.weight          (n_kv_heads * head_dim, d_model)
    model.transformer.blocks.N.attn_out.weight        (d_model, d_model)
    model.transformer.blocks.N.ff_norm.weight         (d_model,)
    model.transformer.blocks.N.ff_proj.weight         (mlp_hidden_size, d_model)   SwiGLU gate
    model.transformer.blocks.N.up_proj.weight         (mlp_hidden_size, d_model)
    model.transformer.blocks.N.ff_out.weight          (d_model, mlp_hidden_size)
    model.transformer.ln_f.weight                     (d_model,)
    model.transformer.ff_out.weight                   (embedding_size, d_model)    absent if weight_tying

``.bias`` tensors join the linear layers when ``include_bias`` (q/k/v also when
``include_qkv_bias``) and the norms when ``bias_for_layer_norm`` (None: ``include_bias``). With
``block_group_size`` G > 1 the blocks are stored as ``model.transformer.block_groups.g.i.``
(block g * G + i). The 8B release: d_model 4096, 32 layers, 32 heads, 32 kv heads,
mlp_hidden_size 12288, vocab / embedding 126464, rope_theta 500000, no biases, untied head:
9 tensors per block + 3 = 291.

Sources read (public; nothing copied): the release's ``modeling_llada.py`` as mirrored in
public repositories (the MindSpore port in mindspore-lab ``mindway`` and NVIDIA's modified copy
in QuentinFitteRey/LLada-Reasoning), a Megatron-Bridge LLaDA mapping (the HF tensor names
above, ``ff_proj`` = gate, ``up_proj`` = up) and config.json copies of the release's layout.
Not verified against the actual 8B files here (no network in the tests): the exact
``model.safetensors.index.json`` and ``tokenizer_config.json`` of the hub repository.

Loading (``load_llada``) follows the project's checkpoint rules (`tadm.weights_header`): the
config's sizes are bounded and the config is cross-checked against the safetensors header(s)
-- embedding shape, layer indices, every tensor's name and shape -- before a module is
allocated; the weights are then read one shard at a time into a model built on the meta device
and materialised where it runs. Every problem is one line naming the file and the field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tadm import runtime
from tadm import weights_header as wh
from tadm.errors import DataError
from tadm.models.base import CheckpointError
from tadm.models.io import read_safetensors
from tadm.models.loading import check_header_tensors

PREFIX = "model.transformer."
MASK_TOKEN_ID = 126336  # the release's mask token (its config.json's mask_token_id)
RELEASE = "GSAI-ML/LLaDA-8B-Instruct"
# files fetched from the hub: config, weights, tokenizer -- never *.py (no remote code), no pickles
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]

# config.json fields that must have this value: the layout implemented here (the release's)
FIXED = {"block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "rope": True,
         "alibi": False, "attention_layer_norm": False, "scale_logits": False, "input_emb_norm": False,
         "layer_norm_with_affine": True}
# sizes: config field -> its kind in weights_header.LIMITS
SIZES = {"d_model": "hidden", "n_heads": "heads", "n_kv_heads": "heads", "n_layers": "layers",
         "mlp_hidden_size": "intermediate", "vocab_size": "vocab", "embedding_size": "vocab",
         "block_group_size": "layers", "max_sequence_length": "seq_len"}
REQUIRED = ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size", "rope_theta", "rms_norm_eps",
            "include_bias", "weight_tying", "mask_token_id")


@dataclass(frozen=True)
class LladaConfig:
    """The fields of LLaDA's config.json this implementation reads (names as the release's)."""

    d_model: int
    n_heads: int
    n_layers: int
    mlp_hidden_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    include_bias: bool
    weight_tying: bool
    mask_token_id: int = MASK_TOKEN_ID
    n_kv_heads: int | None = None  # None: n_heads
    embedding_size: int | None = None  # None: vocab_size (rows of wte / the head)
    include_qkv_bias: bool = False
    bias_for_layer_norm: bool | None = None  # None: include_bias
    block_group_size: int = 1
    rope_full_precision: bool = True
    max_sequence_length: int = 4096
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def rows(self) -> int:
        """Rows of the embedding and the output head."""
        return self.embedding_size or self.vocab_size

    @property
    def norm_bias(self) -> bool:
        return self.include_bias if self.bias_for_layer_norm is None else bool(self.bias_for_layer_norm)

    def to_json(self) -> dict:
        """A config.json with the release's field names (and the fixed layout fields)."""
        return {"model_type": "llada", "architectures": ["LLaDAModelLM"], **FIXED, **asdict(self)}

    @classmethod
    def from_json(cls, raw: dict, where: str) -> "LladaConfig":
        """Validate a parsed config.json (`where` names it in errors): required fields present,
        sizes bounded, the layout the one implemented here."""
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise CheckpointError(f"{where}: lacks {', '.join(missing)} (not a LLaDA config.json)")
        for key, value in FIXED.items():
            if key in raw and raw[key] != value:
                raise CheckpointError(f"{where}: {key} = {raw[key]!r} is not supported (the LLaDA release has {value!r})")
        if raw.get("multi_query_attention"):
            raise CheckpointError(f"{where}: multi_query_attention is not supported (set n_kv_heads instead)")
        for key, kind in SIZES.items():
            if raw.get(key) is not None:
                wh.bounded(raw[key], key, kind, where, CheckpointError)
        for key in ("include_bias", "weight_tying", "include_qkv_bias", "rope_full_precision"):
            if key in raw and not isinstance(raw[key], bool):
                raise CheckpointError(f"{where}: {key} must be true or false, got {raw[key]!r}")
        for key in ("rope_theta", "rms_norm_eps"):
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e12:
                raise CheckpointError(f"{where}: {key} must be a positive number, got {v!r}")
        nulls = [k for k in REQUIRED if raw[k] is None]
        if nulls:
            raise CheckpointError(f"{where}: {', '.join(nulls)} must be set, got null")
        fields = {k: raw[k] for k in cls.__dataclass_fields__ if raw.get(k) is not None}
        cfg = cls(**fields)
        if cfg.d_model % cfg.n_heads or cfg.head_dim % 2:
            raise CheckpointError(f"{where}: d_model = {cfg.d_model} must be n_heads ({cfg.n_heads}) times an even head dim")
        if cfg.n_heads % cfg.kv_heads:
            raise CheckpointError(f"{where}: n_kv_heads = {cfg.kv_heads} must divide n_heads ({cfg.n_heads})")
        if cfg.rows < cfg.vocab_size:
            raise CheckpointError(f"{where}: embedding_size = {cfg.rows} is below vocab_size ({cfg.vocab_size})")
        if cfg.n_layers % cfg.block_group_size:
            raise CheckpointError(f"{where}: block_group_size = {cfg.block_group_size} must divide n_layers ({cfg.n_layers})")
        mid = cfg.mask_token_id
        if isinstance(mid, bool) or not isinstance(mid, int) or not 0 <= mid < cfg.rows:
            raise CheckpointError(f"{where}: mask_token_id = {mid!r} is not a row of the embedding ({cfg.rows} rows)")
        return cfg


# --------------------------------------------------------------------------- the network


class RMSNorm(nn.Module):
    """x / rms(x) in float32, cast back, then scaled (and shifted, with a bias)."""

    def __init__(self, size: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        h = self.weight * h
        return h if self.bias is None else h + self.bias


def rotary(x: Tensor, theta: float, full_precision: bool) -> Tensor:
    """Rotary position embedding of x (B, heads, L, head_dim) at positions 0..L-1: the two
    halves of each head are the (real, imaginary) parts rotated by position * theta^(-2i/d)."""
    _, _, length, dim = x.shape
    work = torch.float32 if full_precision else x.dtype
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(length, device=x.device, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos().to(work), angles.sin().to(work)
    h = x.to(work)
    first, second = h[..., : dim // 2], h[..., dim // 2:]
    out = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return out.to(x.dtype)


def padding_keys(attention_mask: Tensor | None, shape: tuple[int, int], device: torch.device) -> Tensor | None:
    """The attention's key mask (B, 1, 1, L) bool from a padding mask (B, L) of 0 / 1 (or bool):
    None when there is no mask or it has no zero (the release skips its bias then too). A row
    with no real token is refused: its positions would attend to nothing."""
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != shape:
        raise ValueError(f"LladaModel: attention_mask has shape {tuple(attention_mask.shape)}, "
                         f"the input is {shape} (batch, length)")
    if attention_mask.dtype != torch.bool:
        if attention_mask.is_floating_point() or attention_mask.is_complex():
            raise ValueError(f"LladaModel: attention_mask must be bool or integer 0 / 1, got {attention_mask.dtype}")
        if ((attention_mask != 0) & (attention_mask != 1)).any():
            raise ValueError("LladaModel: attention_mask must hold only 0 (pad) and 1 (token)")
    keep = attention_mask.to(device=device, dtype=torch.bool)
    if bool(keep.all()):
        return None
    if not bool(keep.any(dim=1).all()):
        raise ValueError("LladaModel: attention_mask has a row with no 1 (no token to attend to)")
    return keep[:, None, None, :]


class LladaBlock(nn.Module):
    """One pre-norm block: bidirectional GQA attention with RoPE, then the SwiGLU MLP."""

    def __init__(self, cfg: LladaConfig):
        super().__init__()
        self.cfg = cfg
        d, kv, hidden, bias = cfg.d_model, cfg.kv_heads * cfg.head_dim, cfg.mlp_hidden_size, cfg.include_bias
        qkv_bias = cfg.include_bias or cfg.include_qkv_bias
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_bias)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, kv, bias=qkv_bias)
        self.v_proj = nn.Linear(d, kv, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=bias)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_bias)
        self.ff_proj = nn.Linear(d, hidden, bias=bias)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.ff_out = nn.Linear(hidden, d, bias=bias)

    def attention(self, x: Tensor, keys: Tensor | None = None) -> Tensor:
        """Self-attention of x (B, L, d); `keys` (B, 1, 1, L) bool, False at a pad key, or None
        (every key attended, the unpadded path)."""
        cfg = self.cfg
        b, length, _ = x.shape
        q = self.q_proj(x).view(b, length, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, length, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, length, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q = rotary(q, cfg.rope_theta, cfg.rope_full_precision)
        k = rotary(k, cfg.rope_theta, cfg.rope_full_precision)
        if cfg.kv_heads != cfg.n_heads:  # each kv head serves n_heads / kv_heads consecutive query heads
            k = k.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
            v = v.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
        # bidirectional; with padding, a boolean key mask (a masked key's weight is exactly 0, as the
        # release's dtype-minimum bias gives)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=False)
        return self.attn_out(out.transpose(1, 2).reshape(b, length, cfg.d_model))

    def forward(self, x: Tensor, keys: Tensor | None = None) -> Tensor:
        x = x + self.attention(self.attn_norm(x), keys)
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class LladaModel(nn.Module):
    """LLaDA's network with the release's parameter names: ``model(ids)`` or
    ``model(inputs_embeds=e)`` -> logits (B, L, embedding_size) in the parameters' dtype."""

    model_type = "llada"

    def __init__(self, cfg: LladaConfig):
        super().__init__()
        self.cfg = cfg
        blocks = [LladaBlock(cfg) for _ in range(cfg.n_layers)]
        parts: dict[str, nn.Module] = {"wte": nn.Embedding(cfg.rows, cfg.d_model)}
        g = cfg.block_group_size
        if g > 1:
            parts["block_groups"] = nn.ModuleList(nn.ModuleList(blocks[i: i + g]) for i in range(0, cfg.n_layers, g))
        else:
            parts["blocks"] = nn.ModuleList(blocks)
        parts["ln_f"] = RMSNorm(cfg.d_model, cfg.rms_norm_eps, cfg.norm_bias)
        if not cfg.weight_tying:
            parts["ff_out"] = nn.Linear(cfg.d_model, cfg.rows, bias=cfg.include_bias)
        self.model = nn.Module()  # the HF wrapper's `model.` prefix
        self.model.transformer = nn.ModuleDict(parts)

    @property
    def transformer(self) -> nn.ModuleDict:
        return self.model.transformer

    @property
    def blocks(self) -> list[LladaBlock]:
        t = self.transformer
        if "block_groups" in t:
            return [b for group in t["block_groups"] for b in group]
        return list(t["blocks"])

    @property
    def mask_id(self) -> int:
        return self.cfg.mask_token_id

    @property
    def vocab_size(self) -> int:
        """Output classes (the embedding's rows; the mask token is one of them)."""
        return self.cfg.rows

    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    def embed(self, ids: Tensor) -> Tensor:
        return self.transformer["wte"](ids)

    def forward(self, ids: Tensor | None = None, inputs_embeds: Tensor | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits of `ids` (B, L) or `inputs_embeds` (B, L, d). `attention_mask` (B, L): 1 (True)
        at a real token, 0 at a pad that no position may attend to; None or all ones: no masking
        (the same computation, bit for bit)."""
        if (ids is None) == (inputs_embeds is None):
            raise ValueError("LladaModel: pass exactly one of ids and inputs_embeds")
        x = self.embed(ids) if inputs_embeds is None else inputs_embeds
        keys = padding_keys(attention_mask, tuple(x.shape[:2]), x.device)
        for block in self.blocks:
            x = block(x, keys)
        x = self.transformer["ln_f"](x)
        if self.cfg.weight_tying:
            return F.linear(x, self.transformer["wte"].weight)
        return self.transformer["ff_out"](x)


# --------------------------------------------------------------------------- checkpoints


def read_llada_config(directory: str | Path) -> LladaConfig:
    """``<directory>/config.json`` (at most wh.MAX_CONFIG_BYTES) as a validated LladaConfig."""
    path = Path(directory) / "config.json"
    raw = wh.read_json(path, error=CheckpointError)
    return LladaConfig.from_json(raw, repr(str(path)))


def check_llada_checkpoint(directory: str | Path, cfg: LladaConfig, device=runtime.CPU,
                           dtype: torch.dtype = torch.float32) -> wh.Header:
    """Cross-check `cfg` against the safetensors header(s) of `directory` without reading a tensor
    or allocating a module: the embedding is (embedding_size, d_model), the blocks hold exactly
    the layer indices 0..n_layers-1, every tensor's name and shape is the model's (built on the
    meta device), and the model fits where it is built. CheckpointError (one line) otherwise."""
    directory = Path(directory)
    header = wh.read_weights(directory, CheckpointError)
    weights = directory / (wh.WEIGHTS_FILE if (directory / wh.WEIGHTS_FILE).is_file() else wh.INDEX_FILE)
    where = f"{str(directory / 'config.json')!r} vs {str(weights)!r}"
    emb = header.shapes.get(PREFIX + "wte.weight")
    if emb is None:
        raise CheckpointError(f"{where}: the weights have no {PREFIX}wte.weight (not a LLaDA checkpoint)")
    if len(emb) != 2 or emb[0] != cfg.rows:
        key = "embedding_size" if cfg.embedding_size else "vocab_size"
        raise CheckpointError(f"{where}: {key} = {cfg.rows} but {PREFIX}wte.weight is {emb}")
    if emb[1] != cfg.d_model:
        raise CheckpointError(f"{where}: d_model = {cfg.d_model} but {PREFIX}wte.weight is {emb}")
    if cfg.block_group_size == 1:
        found = wh.layer_counts(header.shapes).get(PREFIX + "blocks", [])
        if found != list(range(cfg.n_layers)):
            have = f"{len(found)} (indices {found[0]}..{found[-1]})" if found else "none"
            raise CheckpointError(f"{where}: n_layers = {cfg.n_layers} but the weights hold {have} blocks")
    with torch.device("meta"):
        meta = LladaModel(cfg).to(dtype)
    model_sd = meta.state_dict()
    check_header_tensors(where, model_sd, header, "LLaDA", tally=True, dtypes="kind")  # released bf16, cast on load
    model_bytes = sum(v.numel() * v.element_size() for v in model_sd.values())
    wh.check_fits(max(_shard_bytes(header).values(), default=0), str(weights), None, CheckpointError)  # a shard, on the host
    wh.check_fits(model_bytes, str(directory), device, CheckpointError)  # the model, where it is built
    return header


def _shard_bytes(header: wh.Header) -> dict[str, int]:
    """Approximate bytes of each shard file (the header's byte total split by element share):
    the loader holds one shard on the host at a time."""
    per_file: dict[str, int] = {}
    for name, shape in header.shapes.items():
        per_file[header.files[name]] = per_file.get(header.files[name], 0) + math.prod(shape)
    total = max(sum(per_file.values()), 1)
    return {f: header.nbytes * n // total for f, n in per_file.items()}


def resolve_source(source: str | Path) -> Path:
    """A local LLaDA directory, or a hub id fetched (config, safetensors, tokenizer files only;
    never the repository's Python) into the hub cache. An explicit path that does not exist is
    a one-line DataError, never a download."""
    local = Path(source).expanduser()
    if local.exists() or str(source).startswith((".", "/", "~")):
        if not local.is_dir():
            raise DataError(f"LLaDA checkpoint {str(source)!r}: no such directory")
        return local
    try:
        from huggingface_hub import snapshot_download  # lazy: snapshot_download takes ~0.4 s to import; only a hub download needs it

        return Path(snapshot_download(repo_id=str(source), allow_patterns=HUB_PATTERNS))
    except Exception as e:  # offline, unknown repository, ...
        raise DataError(f"LLaDA checkpoint {str(source)!r}: cannot fetch from the hub "
                        f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def load_llada(source: str | Path, device: str | torch.device = runtime.CPU,
               dtype: torch.dtype = torch.float32) -> LladaModel:
    """LLaDA from a local directory (config.json + model.safetensors, or shards listed by
    model.safetensors.index.json) or a hub id (`resolve_source`), in `dtype` on `device`, eval
    mode. config.json is bounded and cross-checked against the headers before anything is built;
    the model is built on the meta device, materialised on `device` and filled shard by shard
    (every parameter is written: the header check guarantees exact key coverage)."""
    directory = resolve_source(source)
    cfg = read_llada_config(directory)
    device = torch.device(device)
    header = check_llada_checkpoint(directory, cfg, device, dtype)
    with torch.device("meta"):
        model = LladaModel(cfg).to(dtype)
    model = model.to_empty(device=device)
    params = model.state_dict()
    written: set[str] = set()
    with torch.no_grad():
        for shard in sorted(set(header.files.values())):
            tensors = read_safetensors(directory / shard)
            for name, t in tensors.items():
                params[name].copy_(t)
                written.add(name)
            del tensors
    if written != set(params):  # cannot happen after the header check; never run on garbage memory
        raise CheckpointError(f"{directory}: {len(set(params) - written)} parameter(s) were not in the shards")
    return model.eval().requires_grad_(False)


def save_llada(model: LladaModel, directory: str | Path, shards: int = 1) -> Path:
    """Write config.json and the weights in the release's layout (one model.safetensors, or
    `shards` files plus model.safetensors.index.json) -- the tests' stand-in for the release."""
    import json  # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)

    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: runtime.host(v).contiguous() for k, v in model.state_dict().items()}
    if shards <= 1:
        save_file(tensors, str(directory / wh.WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        names = list(tensors)
        weight_map, size = {}, math.ceil(len(names) / shards)
        for i in range(shards):
            part = names[i * size: (i + 1) * size]
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: tensors[k] for k in part}, str(directory / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, file))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (directory / wh.INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (directory / "config.json").write_text(json.dumps(model.cfg.to_json(), indent=2, sort_keys=True) + "\n")
    return directory


# --------------------------------------------------------------------------- tokenizer and prompts


def load_llada_tokenizer(directory: str | Path):
    """The release's tokenizer (transformers AutoTokenizer from the local directory, no remote code)."""
    from transformers import AutoTokenizer  # lazy: transformers takes ~2 s to import; only loading LLaDA's tokenizer needs it

    try:
        tok = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise DataError(f"LLaDA tokenizer {str(directory)!r}: cannot load ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not getattr(tok, "chat_template", None):
        raise DataError(f"LLaDA tokenizer {str(directory)!r}: has no chat template (LLaDA-Instruct prompts need it)")
    return tok


def chat_ids(tokenizer, user_text: str) -> list[int]:
    """LLaDA-Instruct's prompt for one user turn: the tokenizer's own chat template with the
    assistant header appended (``add_generation_prompt``), as the release's README renders it;
    the template writes the BOS itself, so the text is encoded without adding special tokens."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": user_text}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
