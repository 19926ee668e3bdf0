"""Typed run configuration, loaded from ``params.yaml`` and validated at load.

``params.yaml`` is the single source of run parameters (DVC tracks it). It is rendered from a
*profile*: ``profiles/default.yaml`` holds every key; ``profiles/<name>.yaml`` overlays only
what that profile changes. ``python -m tadm profile paper`` switches profile; one-off changes
go through ``dvc exp run -S section.key=value``.

Validation is strict: an unknown key, a wrong type, a value out of range or a missing file
raises :class:`~tadm.errors.ConfigError` whose message is one line naming the key and what
is allowed.

Every key must be present. A params file (``load``, ``from_dict``) is complete on its own:
a missing key is an error naming the dotted key and the file (with the value the file's
``profile`` would give it), never filled from the defaults of the dataclasses below (those
exist only for code that builds a section directly, e.g. tests). Inheritance happens in one
place only, when a profile is rendered: ``profiles/default.yaml`` must hold every key, and
``profiles/<name>.yaml`` overlays it key by key (``render_profile``); the rendered mapping is
what ``params.yaml`` holds, so DVC sees every parameter. The one exception is the fields
of a ``sft.hub_sources`` entry marked ``optional`` (a hub source's config, split, message
field and no-think filter), which are per-entry options of a list, not params keys.

Reading is guarded: a file that is not UTF-8, empty, not a mapping at the top, nested more
than ``MAX_DEPTH`` levels, expanding (through YAML aliases) to more than ``MAX_NODES``
nodes, or holding a key twice in one mapping is one ``ConfigError`` line, checked on the
YAML event stream before anything is built (no recursion, no expansion).

The package is split by section (``data``, ``pretrain``, ``sampling``, ``posttrain``, ``asrd``,
``params`` for the run-wide ones and the top level); ``loader`` holds the loading, every
cross-key check and the profiles; ``reading`` the guarded YAML reading. Every public name is
importable from ``tadm.config``.
"""

from tadm.config.asrd import AsrdConfig, DllmCacheConfig
from tadm.config.data import CorpusConfig, HubSftSource, PackingConfig, SftConfig, TokenizerConfig
from tadm.config.fields import spec
from tadm.config.loader import (
    PARAMS_FILE,
    PARAMS_HEADER,
    PROFILES_DIR,
    ROOT,
    as_bool,
    available_profiles,
    deep_merge,
    from_dict,
    load,
    merged_profile,
    override,
    render_profile,
    to_dict,
    write_profile,
)
from tadm.config.params import ClaimsConfig, Params, RuntimeConfig, TimingConfig
from tadm.config.posttrain import DiffusionGemmaSize, PosttrainConfig
from tadm.config.pretrain import ModelConfig, TrainConfig
from tadm.config.reading import MAX_BYTES, MAX_DEPTH, MAX_NODES, read_yaml
from tadm.config.sampling import Budget, EvalConfig, SampleConfig, TrainedEvaluatorConfig
from tadm.errors import ConfigError  # what every check raises (tadm.errors), as before the split

__all__ = [
    "AsrdConfig", "ClaimsConfig", "TimingConfig", "ConfigError", "CorpusConfig", "DiffusionGemmaSize", "EvalConfig", "HubSftSource", "MAX_BYTES",
    "DllmCacheConfig", "MAX_DEPTH", "MAX_NODES", "ModelConfig", "PARAMS_FILE", "PARAMS_HEADER", "PROFILES_DIR", "PackingConfig", "Params",
    "PosttrainConfig", "ROOT", "RuntimeConfig", "Budget", "SampleConfig", "SftConfig", "TokenizerConfig", "TrainConfig",
    "TrainedEvaluatorConfig", "as_bool", "available_profiles", "deep_merge", "from_dict", "load", "merged_profile",
    "override", "read_yaml", "render_profile", "spec", "to_dict", "write_profile",
]
