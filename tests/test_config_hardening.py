"""Missing or odd params: every key must be set; duplicate keys, non-UTF-8
bytes, deep nesting, alias bombs and a non-mapping top level are one-line errors; `check`
refuses a model the machine cannot hold, with the estimate in the message."""

import copy
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tadm import config
from tadm import memory_estimate as me
from tadm.errors import ConfigError


def _default_params_text() -> str:
    """params.yaml as `python -m tadm profile default` writes it (the committed one), never the
    checkout's params.yaml, which may be switched to another profile."""
    with tempfile.TemporaryDirectory() as scratch:
        return config.write_profile("default", Path(scratch) / "params.yaml").read_text()


PARAMS_TEXT = _default_params_text()
DEFAULT = config.from_dict(config.render_profile("default"))


def _check(path, limit_bytes=None):
    """`python -m tadm --params path check` from the repository root (this checkout's tadm)."""
    def cap():  # a loader that expanded an alias bomb would hit this instead of the machine
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "tadm", "--params", str(path), "check"], capture_output=True,
                          text=True, cwd=config.ROOT, timeout=120, preexec_fn=cap if limit_bytes else None)


def _one_line_error(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _write(tmp_path, text, name="params.yaml"):
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def _raw():
    return copy.deepcopy(config.render_profile("default"))


# --------------------------------------------------------------------------- every key set


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"], ids=["empty", "comment", "empty-document"])
def test_empty_params_file_is_refused(tmp_path, text):
    """Before: an empty params.yaml was "valid" and trained the paper-scale built-in defaults."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match="params.yaml: is empty"):
        config.load(path)
    _one_line_error(_check(path), "params.yaml: is empty", "python -m tadm profile default")


def test_missing_key_names_the_key_the_file_and_the_profile_value(tmp_path):
    raw = _raw()
    del raw["model"]["d_model"]
    path = _write(tmp_path, yaml.safe_dump(raw, sort_keys=False))
    line = _one_line_error(_check(path), "params.yaml: model.d_model: missing key", "profile 'default' sets model.d_model: 128")
    assert "768" not in line  # the paper-scale code default is nowhere


def test_missing_keys_are_counted_and_sections_named():
    raw = _raw()
    for k in ("steps", "lr", "ema", "gamma", "log_every"):
        del raw["train"][k]
    with pytest.raises(ConfigError, match=r"train\.steps: missing key \(and 4 more: train\.lr, train\.ema, train\.gamma, \.\.\.\)"):
        config.from_dict(raw)
    raw = _raw()
    del raw["posttrain"]["base"]
    with pytest.raises(ConfigError, match=r"posttrain\.base: missing section"):
        config.from_dict(raw)
    raw = _raw()
    del raw["profile"]
    with pytest.raises(ConfigError, match=r"params.yaml: profile: missing key"):
        config.from_dict(raw)


def test_no_key_is_filled_from_code_defaults():
    """from_dict is strict too: a mapping that leaves out any key of any section is refused."""
    full = _raw()
    for section, body in full.items():
        keys = list(body) if isinstance(body, dict) else [None]
        for key in keys:
            raw = copy.deepcopy(full)
            if key is None:
                del raw[section]
                dotted = section
            else:
                del raw[section][key]
                dotted = f"{section}.{key}"
            with pytest.raises(ConfigError, match=re.escape(f"{dotted}: missing")):
                config.from_dict(raw)


def test_profiles_inherit_only_from_default_yaml():
    """The rendered profiles are complete and differ from the code defaults where they say so:
    a profile overlay inherits default.yaml, never the dataclass defaults."""
    micro = config.render_profile("micro")
    assert micro["model"]["d_model"] == 32 and micro["train"]["steps"] == 6
    assert micro["train"]["lr"] == config.render_profile("default")["train"]["lr"] != config.TrainConfig().lr
    for name in config.available_profiles():
        assert config.from_dict(config.render_profile(name)).profile == name


def test_hub_source_entries_keep_their_optional_fields():
    """sft.hub_sources entries are records with a few optional fields (the paper profile names
    only what differs); their required fields are still required."""
    p = config.from_dict(config.render_profile("paper"))
    assert p.sft.hub_sources[0].config is None and p.sft.hub_sources[2].config == "Knowledge"
    assert p.sft.hub_sources[2].split == "no_think" and p.sft.hub_sources[2].reasoning_field is None  # UltraData: modes are splits
    raw = config.render_profile("paper")
    del raw["sft"]["hub_sources"][0]["count"]
    with pytest.raises(ConfigError, match=re.escape("sft.hub_sources[0].count: missing key")):
        config.from_dict(raw)


# --------------------------------------------------------------------------- odd YAML


def test_duplicate_key_names_the_key_and_both_lines(tmp_path):
    text = PARAMS_TEXT.replace("  d_model: 128\n", "  d_model: 128\n  d_model: 4096\n", 1)
    line_no = text.splitlines().index("  d_model: 4096") + 1
    path = _write(tmp_path, text)
    _one_line_error(_check(path), f"params.yaml: model.d_model: duplicate key on line {line_no} (first set on line {line_no - 1})")


@pytest.mark.parametrize("old,new,key", [
    ("profile: default\n", "profile: default\nprofile: micro\n", "profile"),
    ("    hidden_size: 128\n", "    hidden_size: 128\n    hidden_size: 64\n", "posttrain.base.hidden_size"),
    ("model:\n", "model:\n  n_heads: 4\n", "model.n_heads"),
    ("asrd:\n", "model:\n  d_model: 64\nasrd:\n", "model"),
])
def test_duplicate_keys_at_any_depth(tmp_path, old, new, key):
    path = _write(tmp_path, PARAMS_TEXT.replace(old, new, 1))
    with pytest.raises(ConfigError, match=re.escape(f"params.yaml: {key}: duplicate key on line")):
        config.load(path)


def test_duplicate_key_inside_a_list_entry(tmp_path):
    raw = _raw()
    raw["sft"]["hub_sources"] = []
    text = yaml.safe_dump(raw, sort_keys=False).replace(
        "  hub_sources: []\n", "  hub_sources:\n  - {name: a, name: b, dataset: d, category: math, count: 1}\n")
    with pytest.raises(ConfigError, match=re.escape("sft.hub_sources[0].name: duplicate key")):
        config.load(_write(tmp_path, text))


def test_non_utf8_bytes_name_the_file_and_offset(tmp_path):
    data = PARAMS_TEXT.encode().replace(b"source: shakespeare", b"source: shakesp\xe9are", 1)
    offset = data.index(b"\xe9")
    path = _write(tmp_path, data)
    _one_line_error(_check(path), f"params.yaml: not UTF-8 text: byte 0xe9 at byte offset {offset}")
    utf16 = _write(tmp_path, PARAMS_TEXT.encode("utf-16"), "utf16.yaml")
    with pytest.raises(ConfigError, match="utf16.yaml: not UTF-8 text: byte 0xff at byte offset 0"):
        config.load(utf16)
    bom = _write(tmp_path, b"\xef\xbb\xbf" + PARAMS_TEXT.encode(), "bom.yaml")  # a UTF-8 BOM is fine
    assert config.load(bom) == DEFAULT


@pytest.mark.parametrize("kind", ["flow-sequence", "flow-mapping", "block-mapping"])
def test_ten_thousand_deep_nesting_is_one_line(tmp_path, kind):
    depth = 10_000
    if kind == "flow-sequence":
        text = "profile: " + "[" * depth + "]" * depth + "\n"
    elif kind == "flow-mapping":
        text = "profile: " + "{a: " * depth + "1" + "}" * depth + "\n"
    else:  # block style indents once per level: 1,000 levels (500 KB) stand for the 10,000
        text = "".join(" " * i + "a:\n" for i in range(1000)) + " " * 1000 + "a: 1\n"
    path = _write(tmp_path, text)
    _one_line_error(_check(path), "params.yaml: line ", f"nested more than {config.MAX_DEPTH} levels deep")


def test_alias_bomb_is_refused_without_expanding(tmp_path):
    """Nine levels of nine aliases: 9^9 (387M) strings once expanded. Before: 2.2 GB and a
    MemoryError traceback after 30 s (under a 3 GB cap), since the type error's message printed
    the whole structure."""
    anchors = "[&a [x,x,x,x,x,x,x,x,x], " + ", ".join(
        f"&{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)) + "]"
    text = PARAMS_TEXT.replace("  hf_dataset: Skylion007/openwebtext\n", "", 1).replace(
        "  local_paths: []", "  local_paths: " + anchors + "\n  hf_dataset: *i", 1)
    path = _write(tmp_path, text)
    _one_line_error(_check(path, limit_bytes=1 << 30), "params.yaml: line ",
                    f"expands to more than {config.MAX_NODES} YAML nodes")


def test_small_aliases_still_load(tmp_path):
    text = PARAMS_TEXT.replace("seed: 0\n", "seed: &zero 0\n", 1).replace("  eval_examples: 0\n  seeds:\n  - 0\n  - 1\n  batch_size: 32",
                                                                          "  eval_examples: *zero\n  seeds:\n  - 0\n  - 1\n  batch_size: 32")
    assert "*zero" in text
    assert config.load(_write(tmp_path, text)) == DEFAULT


@pytest.mark.parametrize("text,got", [("- a\n- b\n", "a list"), ("just a string\n", "str"), ("42\n", "int")])
def test_non_mapping_top_level_is_one_line(tmp_path, text, got):
    path = _write(tmp_path, text)
    _one_line_error(_check(path), "params.yaml: (top level): must be a mapping of sections", f"got {got}")


def test_other_odd_files_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="a second YAML document"):
        config.load(_write(tmp_path, PARAMS_TEXT + "---\nseed: 1\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(_write(tmp_path, "seed: \x07\n"))
    with pytest.raises(ConfigError, match=re.escape("corpus.local_paths[0]: expected a string, got a list of 2 entries")):
        config.load(_write(tmp_path, PARAMS_TEXT.replace("  local_paths: []", "  local_paths: [[[a, b], c]]", 1)))


def test_committed_params_and_profiles_load_unchanged(tmp_path):
    from committed import read_bytes  # as HEAD commits them (the working params.yaml may be another profile's)

    committed = config.load(_write(tmp_path, read_bytes("params.yaml")))
    assert committed == config.load(_write(tmp_path, read_bytes("profiles/default.yaml"), "default.yaml"))
    assert config.load(config.PROFILES_DIR / "default.yaml") == DEFAULT == config.load(_write(tmp_path, PARAMS_TEXT))


# --------------------------------------------------------------------------- memory in `check`


@pytest.mark.parametrize("profile", ["micro", "default", "paper"])
def test_parameter_formula_matches_the_models(profile):
    import torch

    from tadm.models import build_model, count_parameters

    p = config.from_dict(config.render_profile(profile))
    with torch.device("meta"):
        for kind in ("mdlm", "adlm", "tadm", "sedd", "ar"):
            real = count_parameters(build_model(kind, p.model, p.tokenizer.vocab_size, p.packing.seq_len))
            assert me.model_parameters(kind, p.model, p.tokenizer.vocab_size) == real, kind


MEASURE = r"""
import copy, json, resource, sys
import torch
torch.set_num_threads(1)
from tadm import config
from tadm.memory_estimate import training_estimate
from tadm.methods import get_method
from tadm.train.trainer import EMA, adamw

kind, d, anchor, denoiser, vocab, batch, seq = sys.argv[1], *map(int, sys.argv[2:8])
raw = copy.deepcopy(config.render_profile("default"))
raw["model"].update(d_model=d, n_heads=d // 32, mdlm_layers=anchor + denoiser, anchor_layers=anchor, denoiser_layers=denoiser)
raw["tokenizer"]["vocab_size"] = vocab
raw["packing"]["seq_len"] = seq
raw["train"].update(micro_batch=batch, global_batch=batch)
p = config.from_dict(raw)
x = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
import os, threading
PAGE = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE
# the peak resident size above the footprint before the model exists, sampled every millisecond
# (ru_maxrss would also count a transient peak of the imports before `before`)
before, high, done = rss(), [0], threading.Event()
def poll():
    while not done.is_set():
        high[0] = max(high[0], rss())
        done.wait(0.001)
watcher = threading.Thread(target=poll, daemon=True)
watcher.start()
method = get_method(kind, p)
model = method.build_model(vocab, seq)
ema = EMA(model, p.train.ema)
opt = adamw(model.parameters(), torch.device("cpu"), lr=1e-4)
gen = torch.Generator().manual_seed(0)
for _ in range(2):  # two steps: the AdamW moments exist from the first
    method.loss(model, x, gen).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ema.update(model)
done.set()
watcher.join()
peak = max(high[0], rss()) - before
print(json.dumps({"estimate": training_estimate(kind, p).total, "peak": peak}))
"""


@pytest.mark.parametrize("kind,shape", [("tadm", (192, 3, 2, 4096, 16, 128)), ("mdlm", (256, 2, 2, 512, 8, 256))])
def test_estimate_is_within_a_factor_of_two_of_a_measured_peak(kind, shape):
    """Peak resident memory of two real training steps (the trainer's method, AdamW, EMA) on
    the CPU, above the process's footprint before the model exists, against the estimate."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, kind, *map(str, shape)], capture_output=True, text=True,
                          cwd=config.ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["peak"] > 200 * 2**20  # big enough that the measurement is not noise
    assert 0.5 <= r["estimate"] / r["peak"] <= 2.0, r


def test_absurd_model_is_refused_with_the_estimate(tmp_path):
    raw = _raw()
    raw["runtime"]["device"] = "cpu"
    raw["model"].update(d_model=65536, n_heads=512, mdlm_layers=1000, anchor_layers=1000, denoiser_layers=1000)
    p = config.from_dict(raw)
    need = me.training_estimate("mdlm", p).total / me.GIB
    path = _write(tmp_path, yaml.safe_dump(raw, sort_keys=False))
    line = _one_line_error(_check(path), "params.yaml: model: train mdlm needs about", f"{need:.1f} GiB",
                           "d_model 65536 x 1000 layers", "GiB of RAM")
    have = float(re.search(r"the machine has ([\d.]+) GiB", line).group(1))
    assert have > 0 and need > have


def test_estimate_refuses_against_the_given_memory():
    p = config.from_dict(config.render_profile("default"))
    fits = me.check_memory(p, available=8 * me.GIB, where="RAM")  # the default profile: < 8 GiB
    assert {e.name for e in fits} >= {"train tadm", "train posttrain base (dg_base)"}
    assert max(e.total for e in fits) < 8 * me.GIB
    with pytest.raises(ConfigError, match=r"params.yaml: (model|posttrain.base): train .* needs about [\d.]+ GiB .* "
                                          r"but the machine has 0.1 GiB of RAM"):
        me.check_memory(p, available=me.GIB // 10, where="RAM")
    paper = config.from_dict(config.render_profile("paper"))
    base = me.base_estimate(paper)
    assert base.parameters == 26_000_000_000 and base.state_bytes == 52_000_000_000  # bf16, frozen


def test_check_reports_the_memory_of_the_committed_params(tmp_path):
    path = _write(tmp_path, PARAMS_TEXT)  # the default profile's, as committed
    proc = subprocess.run([sys.executable, "-m", "tadm", "--params", str(path), "check"], capture_output=True, text=True,
                          cwd=config.ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"{path}: valid (profile 'default')"
    assert re.match(r"memory: the largest need is about [\d.]+ GiB \(.+\) of [\d.]+ GiB ", proc.stdout.splitlines()[1])
    p = DEFAULT
    line = proc.stdout.splitlines()[2]  # the committed micro-batch (the whole global batch) fits this machine
    assert line == (f"micro-batch: train.micro_batch is {p.train.micro_batch}; the largest that fits this machine: "
                    + ", ".join(f"{p.train.global_batch} ({m})" for m in p.train.models)), line


@pytest.mark.parametrize("text,read_as", [("010", 8), ("0x10", 16), ("0b11", 3), ("1:30", 90), ("-07", -7)])
def test_a_non_decimal_integer_is_refused_not_silently_converted(tmp_path, text, read_as):
    # YAML 1.1 reads `steps: 010` as 8; a params file means decimal
    path = tmp_path / "params.yaml"
    path.write_text(f"train:\n  steps: {text}\n")
    with pytest.raises(ConfigError, match=rf"train\.steps: '{re.escape(text)}' on line 2 is not a decimal integer .*as {read_as}"):
        config.read_yaml(path)
    path.write_text("train:\n  steps: 1_000\n  lr: 0.001\n  name: '010'\n")
    assert config.read_yaml(path)["train"] == {"steps": 1000, "lr": 0.001, "name": "010"}


def test_a_device_as_params_file_is_named_as_such():
    with pytest.raises(ConfigError, match="/dev/zero: is not a regular file"):
        config.read_yaml(__import__("pathlib").Path("/dev/zero"))


def test_notebook_boolean_parameters_parse_papermills_text():
    # `papermill ... -p unsafe_host_execution false` hands the notebook the string "false"
    assert config.as_bool("false", "unsafe_host_execution") is False and config.as_bool("False", "x") is False
    assert config.as_bool("true", "x") is True and config.as_bool(True, "x") is True and config.as_bool(0, "x") is False
    with pytest.raises(ConfigError, match="unsafe_host_execution: must be true or false, got 'maybe'"):
        config.as_bool("maybe", "unsafe_host_execution")
    import json

    for nb in sorted((config.ROOT / "notebooks").glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert "bool(" not in code.replace("as_bool(", ""), f"{nb.name}: a parameter through bool() reads 'false' as True"
