"""Methods of Table 2, one unit each (tadm.methods.base.Method), registered by run name.

    method = get_method("tadm", params)           # the objective of run "tadm"
    model = method.build_model(vocab_size, seq_len)
    loss = method.loss(model, x, gen, progress)   # (B,) nats per sequence
    METHODS["adlm"].forward_flops(...)            # a unit's formulas, without an instance

A new baseline is one module here and its import line below (docs/extending.md).
"""

from tadm.errors import ConfigError
from tadm.methods.base import EPS, Method, Row
from tadm.methods.ar import ARMethod
from tadm.methods.sedd import SEDDMethod
from tadm.methods.mdlm import MDLMMethod
from tadm.methods.adlm import ADLMMethod
from tadm.methods.tadm import TADMMethod
from tadm.registry import METHODS, TABLE2_ROWS, method_for


def get_method(name: str, p) -> Method:
    """The objective of run `name` (a name of train.models)."""
    if name not in METHODS:
        raise ConfigError("train.models", f"unknown run {name!r}; allowed: {', '.join(METHODS.names())}")
    return METHODS[name](name, p)


__all__ = ["EPS", "Method", "Row", "METHODS", "TABLE2_ROWS", "get_method", "method_for",
           "ARMethod", "SEDDMethod", "MDLMMethod", "ADLMMethod", "TADMMethod"]
