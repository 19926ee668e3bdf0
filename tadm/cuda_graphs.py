"""CUDA-graph replay of the sampling network's fixed-shape pieces (``runtime.cuda_graphs``): the
DiT blocks, TADM's fusion, the conditioning and ADLM's anchor head each replay one captured
graph per input shape (:func:`cuda_graph_forwards`); off CUDA the setting is ignored with a
one-line note (:func:`cuda_graphs_note`)."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from tadm.errors import ConfigError


def cuda_graphs_note(setting: bool, device: torch.device) -> str | None:
    """None when ``runtime.cuda_graphs`` applies on `device` (on and CUDA) or is off; the one-line
    note a stage prints when it is on but ignored (any device but CUDA)."""
    if not setting or torch.device(device).type == "cuda":
        return None
    return f"runtime.cuda_graphs: ignored on {device} (CUDA graphs need a CUDA device); running eager"


def _cuda_capture(forward, args: tuple, kwargs: dict, pool):
    """Capture ``forward(*args, **kwargs)`` (static inputs) in a CUDA graph, as torch.cuda.graphs
    documents: two warm-up runs on a side stream, then the capture into `pool`. Returns (the
    static output, the graph's replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            forward(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        static_out = forward(*args, **kwargs)
    return static_out, graph.replay


class _GraphedForward:
    """A module's forward replayed from CUDA graphs: one graph per (argument structure, input
    shapes / dtypes / devices, non-tensor arguments, autocast state), captured on its first call
    (`capture`: :func:`_cuda_capture`). A call copies its tensor inputs into the graph's static
    inputs, replays it and returns a copy of the static output (a later replay of this or
    another graph of the pool may overwrite static outputs). Calls while autograd records run
    the plain forward: graphs are for inference."""

    def __init__(self, forward, pool, capture=_cuda_capture):
        self.eager, self.pool, self.capture, self.graphs = forward, pool, capture, {}

    @staticmethod
    def _key(leaves: list) -> tuple:
        parts, kind = [], "cuda"
        for a in leaves:
            if isinstance(a, torch.Tensor):
                parts.append((tuple(a.shape), a.dtype, a.device))
                kind = a.device.type
            else:
                parts.append(("value", repr(a)))
        return (tuple(parts), torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind),
                torch.is_inference_mode_enabled())

    def __call__(self, *args, **kwargs):
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return self.eager(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        key = (spec, *self._key(leaves))
        entry = self.graphs.get(key)
        if entry is None:
            static_in = [a.clone() if isinstance(a, torch.Tensor) else a for a in leaves]
            static_args, static_kwargs = tree_unflatten(static_in, spec)
            entry = self.graphs[key] = (static_in, *self.capture(self.eager, static_args, static_kwargs, self.pool))
        static_in, static_out, replay = entry
        for dst, src in zip(static_in, leaves):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, static_out)


class CudaGraphs:
    """The handle :func:`cuda_graph_forwards` returns: how many graphs its modules hold;
    ``remove()`` puts the modules' own forwards back (and drops the graphs)."""

    def __init__(self, modules: list[torch.nn.Module]):
        self.modules = modules

    @property
    def graphs(self) -> int:
        return sum(len(m.__dict__["forward"].graphs) for m in self.modules
                   if isinstance(m.__dict__.get("forward"), _GraphedForward))

    def remove(self) -> None:
        for m in self.modules:
            if isinstance(m.__dict__.get("forward"), _GraphedForward):
                del m.forward
        self.modules = []


def cuda_graph_forwards(modules, device: torch.device, *, capture=None) -> CudaGraphs:
    """Replay each module of `modules` (pieces called with fixed shapes at every step of a
    sampling run: transformer blocks, TADM's fusion, the conditioning vectors) from CUDA graphs
    (:class:`_GraphedForward`) on a CUDA `device`; the modules' forward hooks (the compute
    counters) still run around each call, with the call's own inputs and output. The graphs
    of one call of this function share one memory pool. A graph reads the weights where they
    are at capture: cast them first (:func:`cast_for_autocast`) and do not move them after.
    Off CUDA a ConfigError (stages check :func:`cuda_graphs_note` first). Modules already
    graphed are left as they are. `capture`: a stand-in for :func:`_cuda_capture` (tests)."""
    if capture is None:
        if torch.device(device).type != "cuda":
            raise ConfigError("runtime.cuda_graphs", f"CUDA graphs need a CUDA device, not {device}")
        pool, capture = torch.cuda.graph_pool_handle(), _cuda_capture
    else:
        pool = None
    done = []
    for m in modules:
        if not isinstance(m.__dict__.get("forward"), _GraphedForward):
            m.forward = _GraphedForward(m.forward, pool, capture)
        done.append(m)
    return CudaGraphs(done)
