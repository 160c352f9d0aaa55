"""Training the AVEX policy (``python -m avex.train``; ``avex.train.train(TrainConfig(...))``).

    config.py               TrainConfig: every setting, its presets, checks and flags
    loop.py                 train(config): the run's phases (warmup, RL, the final table)
    steps.py                one micro-batch's losses: the warmup BCE, L_RL, the exchange term
    losses.py               L_RL and L_ex themselves
    exchange_search.py      the local search of exchanges and its distillation
    exchange_diagnostics.py reward ties, exchange labels and gradients, per type
    warmup_teachers.py      the scores whose balanced keep-sets the warmup imitates
    run_records.py          what a run keeps in its directory, and how it resumes
    checkpoint.py           atomic checkpoints (the run's files are named in avex.run_files)
    stopping.py             stop at a step boundary; a run that learns nothing
    distributed.py          one process or many (torchrun)
    results_table.py        the end-of-run table

Nothing is imported here, so ``import avex.training.config`` loads the settings alone.
"""
