"""What the notebooks run: the paper's experiments as functions (notebooks stay thin).

    sampling    one saved sample set per (row, T): tokens + the sampling record
    table2      Table 2's rows, the scorer (MAUVE, Gen PPL, entropy), run_row
    staleness   anchor staleness along real reverse trajectories, and its figure
    tables      Markdown / CSV tables and the quality-compute figure from the results
    table1      Table 1: the post-train rows (base, TADM:Post-train at K, control, training-free
                caches) decoded on the tasks, scored, counted and timed; its timing blocks
    table1_stats        its statistics over fusion runs and seeds (deltas, between-run variance, speed-ups)
    table1_speed        its timing blocks' files and the speed combined across blocks
    table1_render       its table, notes and metrics from results/table1.json
    frontier    Table 1's accuracy-speed frontier figure
    asrd        the ASRD comparison (runners, sweeps, tables; on LLaDA with its cache rows)
    worker      runs in several processes (Table 2 rows, the sweep, Table 1, the ASRD
                comparison): how many, and their torchrun launch
    jobs        `python -m tadm.experiments.jobs`: the program of each of those processes
"""
