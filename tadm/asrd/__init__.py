"""ASRD: anchor-supervised revocable decoding for diffusion LMs (training-free).

"Follow the Latent Roadmap: Navigating Revocable Decoding for Diffusion LLMs with Anchor
Tokens" (arXiv 2606.16847) describes the method in prose only and has no public code; this is
an implementation from that description. Its pieces, one module each:

- `atc`        the Anchor Tokens Cache: tokens whose prediction held for k passes (k = 2),
               at most `capacity` (12-20) per sequence, updated every step;
- `guidance`   anchor-guided generation: the entropy-weighted anchor centroid added to the
               embeddings of masked positions before the model call;
- `verify`     anchor-perturbed verification: perturbations orthogonal to a candidate's own
               embedding; candidates whose prediction flips are remasked;
- `backends`   one decoding interface for the project's masked models (MDLM, TADM with its
               anchor reused between refreshes), the post-train DiffusionGemma and LLaDA;
- `decode`     the loop with semi-autoregressive blocks, shared by ASRD and the baselines it
               is compared with (plain MDLM, ReMDM-loop, LLaDA's low-confidence remasking);
- `tasks`, `train`   the comparison's tasks and its masked model.

The comparison of the `asrd` stage (runs, sweeps, tables, LLaDA's group) is
`tadm.experiments.asrd`; the training-free caches on LLaDA it runs are `tadm.caches.llada`.

Details the paper leaves open, and what we chose:

1. *Base sampler.* ASRD sits on LLaDA's low-confidence remasking (front-loaded n_j =
   ceil(undecided / steps left) per block) with a Fast-dLLM-style parallel threshold: every
   prediction at least `threshold` confident is also kept, and a block ends once decided. The
   comparison lists this base (low-confidence + threshold) as its own row.
2. *Temporal consistency.* A position's streak counts consecutive passes with the same argmax.
   On a uniform-state model (DiffusionGemma) decided tokens keep being re-predicted, so one
   whose prediction changes leaves the cache. On an absorbing-state model the output at a
   visible token is untrained (MDLM's SUBS copies it), so a decided token keeps the streak it
   had when committed -- it is an anchor if the model predicted it for k passes in a row while
   it was masked -- and leaves only by being remasked.
3. *Cache membership.* Among eligible tokens (decided, streak >= k, prediction == token) the
   `capacity` with the lowest latest entropy; recomputed after every step.
4. *Guidance.* centroid g = sum_a softmax(-H_a) e(x_a) over the anchors; masked position l
   gets e_l + w (H_l / log V) g: more signal where the model is less sure. Zero when the cache
   is empty; w = 0 turns it off.
5. *Verification, in the generation pass.* The pending candidates of the block (decided, not
   an anchor, committed with confidence < `verify_below`) are perturbed inside the next
   step's generation pass -- no extra forward: delta _|_ e(x), ||delta|| = rho ||e(x)|| is
   added to their input; survive = that pass's argmax at the candidate is still x, otherwise
   it is remasked and decided again at a later step. A uniform-state model reads the
   candidate as its token + delta (the undecided positions of that pass see the perturbed
   token); an absorbing-state model as the mask + delta (its only trained reading; the
   undecided positions of that pass then see the candidate masked). The reading is a
   prediction of the candidate's position, so the cache observes it: a survivor gains one
   consistent pass and after k of them is an anchor, no longer verified. Not at a block's last
   step; with the threshold a decided block ends only once no candidate awaits its check.
   rho = 0 turns it off, so ASRD at w = 0, rho = 0 is its base method step for step.
6. *Randomness.* ASRD's perturbation directions come from their own generator, so the base
   method's draws are identical with the mechanisms on or off.
7. *Beyond the paper.* On a time-anchored model (TADM; DiffusionGemma + the post-train
   fusion) the generation passes, checks included, refresh the anchor every K and reuse it
   otherwise. The comparison's matched row (low-confidence + threshold on the same
   time-anchored model, same K) separates ASRD's effect on TADM from TADM's own.
"""

from tadm.asrd.atc import AnchorTokensCache
from tadm.asrd.backends import Backend, DecodeCounters, DiffusionGemmaBackend, MaskedBackend
from tadm.asrd.decode import DECODE_RULES, DecodeResult, DecodeSettings, StepRecord, decode
from tadm.asrd.guidance import anchor_centroid, guidance_signal
from tadm.asrd.verify import orthogonal_perturbation, survivors

__all__ = [
    "AnchorTokensCache", "Backend", "DecodeCounters", "DiffusionGemmaBackend", "MaskedBackend", "DECODE_RULES",
    "DecodeResult", "DecodeSettings", "StepRecord", "decode", "anchor_centroid", "guidance_signal",
    "orthogonal_perturbation", "survivors",
]
