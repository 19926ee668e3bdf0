"""Hub directories: a pipeline checkpoint written so that transformers loads it with
``trust_remote_code=True`` and no ``tadm`` installed (docs/hub.md).

    python -m tadm.hub export models/tadm release/tadm
    python -m tadm.hub export-fusion models/dg_tadm release/dg_tadm --base google/diffusiongemma-26B-A4B-it

`export` writes the directory, `card` its README, and `remote` holds the standalone
configuration / modeling / generation files every directory carries; `export_fusion` writes a
TADM:Post-train fusion's directory (its card, config naming the base, the remote code that loads
the base and the fusion). Nothing here is a pipeline stage's dependency: exporting never makes a
stage stale.
"""
