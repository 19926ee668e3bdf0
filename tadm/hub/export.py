"""Write a hub directory from a pipeline checkpoint: what transformers loads with
``trust_remote_code=True`` and no ``tadm`` installed.

    python -m tadm.hub export models/tadm release/tadm [--run tadm] [--params params.yaml] [--tokenizer data/tokenizer]

The checkpoint (``models/<run>``: config.json + model.safetensors, `tadm.models.load_pretrained`)
is loaded strictly; the workspace it was trained in is the folder of `--params` (default: the
repository's params.yaml) and supplies metrics/train/<run>.json (the card's numbers),
data/packed/manifest.json (the data's counts, BOS / EOS ids) and data/tokenizer. The run is the
checkpoint folder's name unless `--run` names it; its method is `tadm.registry.METHODS[run]`.

OUT must be new or empty; it is written as one directory, renamed into place when complete
(`tadm.io.atomic_path`), with deterministic bytes (the same inputs give the same files):

    model.safetensors       the checkpoint's tensors, metadata {"format": "pt"} only
    config.json             the checkpoint's keys (so `tadm.models.load_pretrained` still reads it)
                            + architectures, auto_map, dtype, token ids, transformers' size aliases,
                            noise_schedule and method (`hub_config`)
    generation_config.json  the sampler of the run's Table 2 row, the first sample.budgets entry's
                            steps and K, top_p and the ReMDM settings (`generation_config`)
    tokenizer.json, tokenizer_config.json
                            the pipeline's tokenizer; masked families add the special token
                            ``<|mask|>`` with id V (= mask_token_id)
    README.md               the hub card (`tadm.hub.card`)
    configuration_tadm.py, modeling_tadm.py, generation_tadm.py
                            copied byte for byte from `tadm.hub.remote`

Every refusal is one line naming the file or option (`tadm.errors.DataError`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tadm.errors import DataError
from tadm.hub.remote import REMOTE_DIR, REMOTE_FILES
from tadm.io import atomic_path, read_manifest
from tadm.registry import METHODS

MASK_TOKEN = "<|mask|>"
ARCHITECTURES = {"mdlm": "MDLMForMaskedLM", "sedd": "SEDDForMaskedLM", "adlm": "ADLMForMaskedLM",
                 "tadm": "TADMForMaskedLM", "ar": "ARForCausalLM"}
CONFIG_CLASSES = {"mdlm": "MDLMConfig", "sedd": "SEDDConfig", "adlm": "ADLMConfig", "tadm": "TADMConfig",
                  "ar": "ARConfig"}
COND_DIM, ROPE_THETA = 128, 10000.0  # the networks' fixed sizes (tadm.models.dit)
HINT = "pass --params of the workspace that trained the checkpoint"


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise DataError(f"{path}: missing ({what}); {HINT}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not readable JSON ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a JSON object")
    return data


def _dump(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def hub_config(raw: dict, family: str, run: str, method, p, counts: dict) -> dict:
    """config.json: the checkpoint's own keys (`raw`) plus what transformers reads."""
    import transformers  # lazy: transformers takes ~2 s to import; only exporting needs it

    m, V, L = raw["model"], raw["vocab_size"], raw["seq_len"]
    masked = family != "ar"
    depth = m["anchor_layers"] + m["denoiser_layers"] if family in ("adlm", "tadm") else m["mdlm_layers"]
    auto = "AutoModelForMaskedLM" if masked else "AutoModelForCausalLM"
    about = {"run": run, "family": family, "title": method.title or family,
             "objective": _objective(family)}
    if family == "tadm":
        about.update(gamma=float(method.gamma), refresh_choices=list(p.train.refresh_choices),
                     budget_choices=list(p.train.budget_choices), anchor_layers=m["anchor_layers"],
                     denoiser_layers=m["denoiser_layers"])
    elif family == "adlm":
        from tadm.methods.adlm import ADLM_RAMP_SLOPE  # lazy: tadm.methods imports torch (~1.5 s); only exporting needs it

        about.update(anchor_loss_weight=float(p.train.gamma), anchor_loss_ramp_slope=ADLM_RAMP_SLOPE,
                     anchor_layers=m["anchor_layers"], denoiser_layers=m["denoiser_layers"])
    return {
        **raw,
        "architectures": [ARCHITECTURES[family]],
        "auto_map": {"AutoConfig": f"configuration_tadm.{CONFIG_CLASSES[family]}",
                     "AutoModel": f"modeling_tadm.{ARCHITECTURES[family]}",
                     auto: f"modeling_tadm.{ARCHITECTURES[family]}"},
        "dtype": "float32",
        "torch_dtype": "float32",
        "mask_token_id": V if masked else None,
        "bos_token_id": counts["bos_id"],
        "eos_token_id": counts["eos_id"],
        "pad_token_id": None,
        "tie_word_embeddings": False,
        "hidden_size": m["d_model"],
        "num_attention_heads": m["n_heads"],
        "num_hidden_layers": depth,
        "intermediate_size": m["mlp_ratio"] * m["d_model"],
        "max_position_embeddings": L,
        "cond_dim": COND_DIM,
        "rope_theta": ROPE_THETA,
        "noise_schedule": {"type": "loglinear", "eps": 1e-3},
        "method": about,
        "transformers_version": transformers.__version__,
    }


def _objective(family: str) -> str:
    from tadm.hub.card import OBJECTIVES  # lazy: tadm.hub.card imports torch (~1.5 s); only exporting needs it

    return OBJECTIVES.get(family, family)


def generation_config(family: str, run: str, method, p, counts: dict, seq_len: int) -> dict:
    """generation_config.json: transformers' standard keys and the project sampler's settings."""
    import transformers  # lazy: transformers takes ~2 s to import; only exporting needs it

    from tadm.train.card import row_sampler  # lazy: tadm.train.card imports torch (~1.5 s); only exporting needs it

    masked = family != "ar"
    budget = p.sample.budgets[0]
    gen = {
        "do_sample": True,
        "top_p": float(p.sample.nucleus_p),
        "max_length": seq_len,
        "bos_token_id": counts["bos_id"],
        "eos_token_id": counts["eos_id"],
        "pad_token_id": None,
        "sampler": "ar" if not masked else row_sampler(method, run, p),
        "precision": p.sample.precision,
        "transformers_version": transformers.__version__,
    }
    if masked:
        block = p.sample.block_size
        gen.update(mask_token_id=counts["vocab_size"], steps=budget.T,
                   budgets=[{"T": b.T, "K": b.K} for b in p.sample.budgets],
                   eta=float(p.sample.eta), t_on=float(p.sample.t_on), t_off=float(p.sample.t_off),
                   alpha_on=float(p.sample.alpha_on),
                   block_size=None if block >= seq_len or seq_len % block else block)
        if method.refreshes:
            gen["refresh_every"] = budget.K
    return gen


def tokenizer_files(directory: Path, vocab_size: int, seq_len: int, masked: bool) -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json for the hub: the pipeline's tokenizer, checked to
    have V tokens, plus the mask token with id V for a masked family."""
    from tokenizers import AddedToken, Tokenizer  # lazy: tokenizers (~15 ms) is needed only to write the tokenizer files

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"{path}: missing (the pipeline's tokenizer); pass --tokenizer")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception type
        raise DataError(f"{path}: not a tokenizers file ({' '.join(str(e).split())})") from None
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise DataError(f"{path}: {tok.get_vocab_size(with_added_tokens=True)} tokens, the checkpoint's vocab_size is "
                        f"{vocab_size}: not the tokenizer it was trained with; pass --tokenizer")
    source = _read_json(directory / "tokenizer_config.json", "the tokenizer's settings")
    settings = {k: v for k, v in source.items() if k not in ("backend", "tokenizer_class", "model_max_length",
                                                             "added_tokens_decoder")}
    settings.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=seq_len)
    if masked:
        tok.add_special_tokens([AddedToken(MASK_TOKEN, special=True, normalized=False)])
        if tok.token_to_id(MASK_TOKEN) != vocab_size:
            raise DataError(f"{path}: the mask token would get id {tok.token_to_id(MASK_TOKEN)}, not V = {vocab_size}")
        settings["mask_token"] = MASK_TOKEN
    return {"tokenizer.json": (tok.to_str(pretty=True) + "\n").encode(), "tokenizer_config.json": _dump(settings)}


def weights_bytes(net) -> bytes:
    """model.safetensors: every tensor of `net`, on the host, metadata {"format": "pt"} only (one
    key: safetensors writes its metadata in hash order, so more would make the bytes vary)."""
    from safetensors.torch import save  # lazy: safetensors.torch imports torch (~1.5 s); only writing the weights needs it

    tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    return save(tensors, metadata={"format": "pt"})


def check_out(out: Path) -> None:
    """OUT must be new or an empty folder (a one-line DataError otherwise)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"OUT {str(out)!r} exists and is not an empty folder; refused: name a new or empty folder")


def write_directory(out: Path, files: dict[str, bytes]) -> Path:
    """`files` ({name: bytes}) written as the directory `out`, renamed into place when complete."""
    with atomic_path(out, kind="dir") as tmp:
        tmp.mkdir()
        for name in sorted(files):
            (tmp / name).write_bytes(files[name])
    return out


def export(model_dir: str | Path, out: str | Path, *, run: str | None = None, params: str | Path | None = None,
           tokenizer: str | Path | None = None) -> Path:
    """Write the hub directory of the checkpoint `model_dir` into `out` (module docstring); returns `out`."""
    from tadm import config  # lazy: tadm.config (+ yaml, ~60 ms) only to read --params; `python -m tadm.hub --help` skips it
    from tadm.hub.card import hub_card  # lazy: tadm.hub.card imports torch (~1.5 s); only exporting needs it
    from tadm.models import load_pretrained  # lazy: tadm.models imports torch (~1.5 s); only exporting needs it

    model_dir, out = Path(model_dir), Path(out)
    check_out(out)
    net = load_pretrained(model_dir)  # strict; a bad checkpoint is a one-line CheckpointError
    raw = _read_json(model_dir / "config.json", "the checkpoint's config")
    family = net.model_type
    run = run or model_dir.resolve().name
    if run not in METHODS.names():
        raise DataError(f"--run: {run!r} is not a run of any method (known: {', '.join(METHODS.names())}); "
                        "name the run with --run")
    method_cls = METHODS[run]
    if method_cls.model.model_type != family:
        raise DataError(f"--run: run {run!r} trains model_type {method_cls.model.model_type!r}, the checkpoint "
                        f"{str(model_dir)!r} is a {family!r}")
    params_path = Path(params) if params is not None else config.PARAMS_FILE
    p = config.load(params_path)
    root = params_path.resolve().parent
    if dataclasses.asdict(p.model) != raw["model"]:
        differ = sorted(k for k in raw["model"] if raw["model"][k] != dataclasses.asdict(p.model).get(k))
        raise DataError(f"{params_path}: params.yaml no longer describes this checkpoint (model."
                        f"{', model.'.join(differ)} differ from {model_dir / 'config.json'}): pass --params")
    method = method_cls(run, p)
    summary = _read_json(root / "metrics" / "train" / f"{run}.json", "the run's training summary")
    if summary.get("model_type") != family or summary.get("run") != run:
        raise DataError(f"{root / 'metrics' / 'train' / f'{run}.json'}: the summary of run {summary.get('run')!r} "
                        f"({summary.get('model_type')!r}), not of {run!r} ({family!r}); {HINT}")
    counts = read_manifest(root / "data" / "packed", "pack", HINT)["counts"]
    if (counts.get("vocab_size"), counts.get("seq_len")) != (net.vocab_size, net.seq_len):
        raise DataError(f"{root / 'data' / 'packed' / 'manifest.json'}: vocabulary {counts.get('vocab_size')} and "
                        f"sequences of {counts.get('seq_len')}, the checkpoint's {net.vocab_size} and "
                        f"{net.seq_len}; {HINT}")
    tokenizer_dir = Path(tokenizer) if tokenizer is not None else root / "data" / "tokenizer"

    gen = generation_config(family, run, method, p, counts, net.seq_len)
    files = {
        "model.safetensors": weights_bytes(net),
        "config.json": _dump(hub_config(raw, family, run, method, p, counts)),
        "generation_config.json": _dump(gen),
        **tokenizer_files(tokenizer_dir, net.vocab_size, net.seq_len, family != "ar"),
        "README.md": hub_card(summary, p, method, counts, {
            "sampler": gen["sampler"], "steps": gen.get("steps"), "refresh_every": gen.get("refresh_every", 1),
            "top_p": gen["top_p"]}).encode(),
        **{name: (REMOTE_DIR / name).read_bytes() for name in REMOTE_FILES},
    }
    return write_directory(out, files)


__all__ = ["check_out", "write_directory", "export", "hub_config", "generation_config", "tokenizer_files", "weights_bytes", "MASK_TOKEN",
           "ARCHITECTURES"]
