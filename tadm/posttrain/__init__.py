"""TADM:Post-train: time-anchorize a frozen pretrained DiffusionGemma (paper Sec. 4, App. C.1).

- :mod:`~tadm.posttrain.backbone` -- the real ``DiffusionGemmaForBlockDiffusion`` decoder run as
  shared S / anchor A / denoiser D (2 / 20 / 8 of 30 layers at 26B), bit-identical to the base.
- :mod:`~tadm.posttrain.fusion` -- the paired-attention fusion Phi in a low-rank space, with the
  cached shallow state C0 so that the correction vanishes exactly when nothing changed.
- :mod:`~tadm.posttrain.anchored` -- generation through transformers' own ``generate`` with the
  anchor refreshed every K denoising steps, and layer-call counters.
- :mod:`~tadm.posttrain.objective` / :mod:`~tadm.posttrain.train` -- the base's uniform-state
  block diffusion (default profile) and the fusion's on-policy CE + KD training, its replicates
  (posttrain.replicates: seeds seed + 1, ... under replicates/) and its held-out validation curve.
- :mod:`~tadm.posttrain.model`, :mod:`~tadm.posttrain.data` -- loading / saving, SFT canvases.

Table 1, the experiment that compares these rows, is :mod:`tadm.experiments.table1`.
"""
