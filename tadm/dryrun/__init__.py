"""The paper profile's dry run: every stage of its ``dvc repro``, on CPU, at toy sizes.

``make dry-run`` (``python -m tadm.dryrun``) copies the working tree into a scratch directory,
renders ``params.yaml`` from ``profiles/paper.yaml`` with the size-only overlay
``profiles/dry-run/paper.yaml``, fills a Hugging Face home with local stand-ins of every hub
input in its real format (:mod:`tadm.dryrun.standins`), and runs ``dvc repro`` there offline,
with 2 processes through torchrun (gloo) where the paper profile runs several. It ends with the
paper's tables and figures regenerated; their numbers are meaningless, their shapes and files
real. See :mod:`tadm.dryrun.run`.
"""
