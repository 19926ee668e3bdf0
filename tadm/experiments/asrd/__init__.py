"""The ASRD comparison (the `asrd` stage; the decoder itself is `tadm.asrd`):

    runner      what its groups share: the rows of a (task, model) group, the per-row tally and
                the batch runner that splits a task's batches over the processes
    compare     ASRD against the remasking baselines on the pipeline's models, the sweeps, the
                tables; `run` and the torchrun worker job
    llada       the same comparison on LLaDA (paper profile), ending with the training-free
                cache rows of `tadm.caches.llada`
"""
