"""Many runs: the ablation grids of the paper and how they run (``mesh-sweep``, ``mesh-demo``
lives one layer up, in results/).

* ``conf/``: ``sweep/<grid>.yaml`` (the grids), ``launcher/`` and ``resources/`` (how they run);
* ``grids``: the grid catalogue; ``config``: the launch schema (launcher, resources, seeds);
* ``grid``: a grid and the command line -> its cells;
* ``cells``: a cell, its outcome and :func:`~sweeps.cells.run_cell`, which trains one;
* ``launchers``: local, parallel, submitit_local and SLURM, one class each behind one interface;
* ``search``: Optuna searches, whose trials are cells;
* ``sweep``: ``mesh-sweep``: parent MLflow run, skipped and failed cells, the summary.

Depends on ``experiments`` (one run) and ``mesh_model``; nothing here is imported by them.
"""
