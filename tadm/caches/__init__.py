"""Training-free caches, one subpackage per base: `diffusiongemma` (Table 1's cache rows, on the same
frozen DiffusionGemma as TADM, at matched layer calls) and `llada` (the LLaDA group of the ASRD table).

TADM:Post-train reuses a stale deep state through a *trained* fusion. The training-free
alternatives it is compared with, on the same base, the same sampler and the same refresh
interval K:

- **Naive anchor reuse** (:mod:`tadm.caches.diffusiongemma.naive`): TADM's split and schedule with the fusion
  bypassed, h = H0. Its layer calls are TADM's, (s + d) T + a ceil(T / K) per canvas; since D
  reads only h (and the step's fixed side inputs), a reuse step returns its refresh step's logits.
- **Feature cache** in dLLM-Cache's style (:mod:`tadm.caches.diffusiongemma.feature`): every layer caches its
  canvas K, V and the outputs of its attention and FFN branches; a refresh every K_r steps
  recomputes everything, a reuse step recomputes, per layer >= 1, only the rows whose V moved most
  (V-verify) and reuses the cached branch outputs elsewhere.
- **dKV-Cache's rule** (:mod:`tadm.caches.diffusiongemma.dkv`) on the feature cache's state: a reuse
  step recomputes, at every layer, only the canvas rows that were not decided (accepted by the
  sampler) in the previous step's input or whose token changed since; the others keep their
  cached K, V and branch outputs. Its layer calls are counted (the rows follow the sampler).
- **d²Cache's rule** (:mod:`tadm.caches.diffusiongemma.d2cache`) on the same state: a reuse step
  recomputes the still-undecided rows ranked first by first-step confidence x certainty density,
  the rows whose decided token moved and a nucleus of the others by attention rollout; counted too.
- **Fast-dLLM's prefix KV cache is already built into the base.** DiffusionGemma decodes block by
  block: a *causal* encoder writes the K/V of the prompt and of every finished canvas into a KV
  cache once per canvas, and all the denoising steps of the next canvas only read it (the
  decoder's layers concatenate it in front of the canvas's own K/V). That is Fast-dLLM's prefix
  cache refreshed per block, and here it is exact, because no prefix state depends on the canvas
  being denoised (on a bidirectional base such as LLaDA it is an approximation). Every row of
  Table 1 -- base, TADM, the caches above -- already reads it, so "TADM + prefix cache" is the
  TADM row. Fast-dLLM's **dual cache** additionally freezes the K/V of the masked *suffix* after
  the current block; DiffusionGemma has no suffix (the next canvas does not exist until this one
  is finished), so it has nothing to apply to. Inside a canvas nothing is ever finished either
  (unaccepted positions are re-noised every step), so there is no in-canvas prefix to cache; the
  dKV row keeps the rows that stayed decided instead, wherever they are.

Matched share. Per canvas of T steps, with R = ceil(T / K) refreshes, the split (s, a, d) and
L = s + a + d layers, the feature cache (layer 0 always full, n_sel of N rows recomputed on
layers >= 1 of a reuse step) makes

    C_fc = T + (L - 1) [R + (T - R) rho]        (rho = n_sel / N)

layer calls, and TADM at the same K makes C_T = (s + d) T + a R. Setting C_fc = C_T:

    (L - 1)(T - R) rho = (s + d - 1) T + (a - L + 1) R = (s + d - 1)(T - R)     (L - 1 - a = s + d - 1)

so rho* = (s + d - 1) / (L - 1) (:func:`tadm.caches.budget.matched_share`), for every K and T: 4/14 at the default
split 1/10/4, 9/29 at the paper's 2/20/8 (close to dLLM-Cache's released 0.25). Flooring
n_sel = floor(rho* N) leaves the feature cache at most (L - 1)(T - R) / N layer calls below TADM.

LLaDA (:mod:`tadm.caches.llada`), the ASRD paper's bidirectional base, has no prefix cache of its
own, so there the caches are Fast-dLLM's prefix and dual KV caches (approximate on a bidirectional
model), dLLM-Cache as released (prompt and response rows refreshed every K_p and K_r passes,
V-verify between) and naive reuse of the middle layers' output; each is a backend of the ASRD
decoder (`tadm.asrd.backends.LladaBackend`'s interface), and the rows matched to TADM are
refreshed every K at TADM's share on that depth, (s + d + a / K) / L.

Each method is registered by name (:mod:`tadm.caches.catalog`): DiffusionGemma's in
`tadm.registry.DG_CACHES` (posttrain.cache_methods), with its Table 1 label and a builder
``(base, p, refresh_every) -> model`` whose ``generate(ids, refresh_every=K, ...)`` is transformers'
generate; LLaDA's in `tadm.registry.LLADA_CACHES` (asrd.llada_cache_methods), with its rows and a
backend builder. The catalog names builders by module path, so it imports neither torch nor
transformers; `budget` holds the layer-call closed forms.
"""
