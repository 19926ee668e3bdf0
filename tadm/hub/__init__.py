"""Hub directories: a pipeline checkpoint written so that transformers loads it with
``trust_remote_code=True`` and no ``tadm`` installed (docs/hub.md).

    python -m tadm.hub export models/tadm release/tadm

`export` writes the directory, `card` its README, and `remote` holds the standalone
configuration / modeling / generation files every directory carries. Nothing here is a pipeline
stage's dependency: exporting never makes a stage stale.
"""
