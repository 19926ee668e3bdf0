"""What the notebooks run: the paper's experiments as functions (notebooks stay thin).

    sampling    one saved sample set per (row, T): tokens + the sampling record
    table2      Table 2's rows, the scorer (MAUVE, Gen PPL, entropy), run_row
    staleness   anchor staleness along real reverse trajectories, and its figure
    tables      Markdown / CSV tables and the quality-compute figure from the results
    worker      `python -m tadm.experiments.worker`: the torchrun entry point of runs with
                runtime.nproc > 1 (Table 2 rows, the sweep, Table 1, the ASRD comparison)
"""
