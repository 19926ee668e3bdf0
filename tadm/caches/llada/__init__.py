"""Training-free caches on LLaDA: the LLaDA group's cache rows of the ASRD table (paper profile).

Each is a backend with `LladaBackend`'s interface, built from LLaDA's own blocks; the block's
maths is repeated in `block` (`block_forward`) with the few options a cache needs, so that
`tadm.models.llada` stays as it is; `base` holds what they share (the depth split, TADM's
budget on LLaDA, the full pass's head). Written from the papers' and releases' descriptions (the
design note docs/design/training-free-caches.md, §2 and §3.4); no code of theirs is used.

- `LladaPrefixCacheBackend` (`prefix`; Fast-dLLM's prefix cache). A refresh is a full pass that keeps
  every layer's K and V (after RoPE): at the block's first pass (`begin_block`) and, with an
  interval K, whenever age + 1 >= K. A reuse pass runs every layer on the rows lo.. (the
  current block and the masked suffix) only, the kept K/V of the rows before lo in front.
  ``dual=True`` (Fast-dLLM's dual cache): a reuse pass runs the block's rows lo..hi only; the
  suffix's K/V stay as the refresh left them. On a bidirectional model both are approximate
  (the prefix's states depend on the suffix); with a block-causal mask they would be exact.
  Refreshed per block, a block takes at least 2 passes (`min_block_passes`): the release's loop
  makes a cached pass after the block's full pass even when that pass decided the block, so
  `decode` then makes one reuse pass whose logits nothing reads (it changes no token).
- `LladaFeatureCacheBackend` (`feature`; dLLM-Cache as released). Per layer it keeps K, V and the
  attention and FFN branches' outputs of every row. A global pass counter over the whole
  generation refreshes the prompt rows every K_p passes and the response rows (the generated
  span, the canvas's tail) every K_r; layer 0 always computes every row. On a pass where the
  response is not due, each layer >= 1 computes V of every response row, and per sequence only
  the floor(rho G) rows whose V is least cosine-similar to the cached V are computed (V-verify);
  the cached V takes the new V of every row. A row not computed outputs its current input plus
  its cached branch outputs.
- `LladaNaiveReuseBackend` (`naive`). The depth split (2, 22, 8) of LLaDA's 32 layers, scaled to the
  model's: front layers every pass, the middle layers' output (the residual stream after them)
  computed every K passes and reused in between, back layers and head every pass. As TADM's
  naive row, the back layers then read only the reused state: a reuse pass returns its
  refresh pass's logits.

- `LladaDkvBackend` (`dkv`; dKV-Cache-Decode as released, `dkv.py`). Per semi-AR block, passes 0, 1
  and every R-th are full; the others run only the rows masked in the previous pass's input, the
  other rows' K/V (those of tokens decided two or more passes ago) read from the cache.

- `LladaD2CacheBackend` (d²Cache as released, `d2cache.py`; not registered as a row). One cache for the
  whole generation: a full first pass, then every layer runs one row set chosen after each step
  (the best certainty-weighted masked positions near the block, the positions just decoded and
  an attention-rollout nucleus), eager attention over every key.

Rows a prefix or dual reuse pass does not compute return the last full pass's logits; the
low-confidence decoders read only the current block's undecided rows, which every pass computes.

Accounting (`DecodeCounters.layer_calls_weighted`): the unit is one layer over the whole canvas
of N = P + G rows. A full pass is L; a prefix reuse pass L (N - lo) / N; a dual reuse pass
L (hi - lo) / N; a dKV cached pass, and a d²Cache pass after the first, L n / N (n the rows
computed); a feature-cache pass 1 + (L - 1) n / N with n the rows computed (P [prompt due] +
G [response due] or floor(rho G)); a naive pass s + d, + a on a refresh.
`layer_calls` counts each layer run once per pass (the naive reuse skips the middle ones).
`budget_x` is TADM's share at the same K on this depth, (s + d + a / K) / L, for the rows
matched by refresh interval (None for the rows as released).

The methods are registered by name in `tadm.registry.LLADA_CACHES` (`tadm.caches.catalog`: each
entry's rows of the table and its backend, built from a `CacheSpec`).
"""

from tadm.caches.llada.base import SPLIT, LladaCacheBackend, scaled_split, tadm_share
from tadm.caches.llada.block import block_forward, rotary_at
from tadm.caches.llada.d2cache import LladaD2CacheBackend
from tadm.caches.llada.dkv import LladaDkvBackend
from tadm.caches.llada.feature import LladaFeatureCacheBackend
from tadm.caches.llada.naive import LladaNaiveReuseBackend
from tadm.caches.llada.prefix import LladaPrefixCacheBackend

__all__ = ["SPLIT", "LladaCacheBackend", "LladaD2CacheBackend", "LladaDkvBackend", "LladaFeatureCacheBackend",
           "LladaNaiveReuseBackend", "LladaPrefixCacheBackend", "block_forward", "rotary_at", "scaled_split",
           "tadm_share"]
