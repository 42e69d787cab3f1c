"""Many runs: the ablation grids of the paper and how they run (``mesh-sweep``, ``mesh-demo``
lives one layer up, in results/).

* ``conf/``: ``sweep/<grid>.yaml`` (the grids), ``launcher/`` and ``resources/`` (how they run);
* ``catalogue``: the grid catalogue (the sweep files' names and descriptions);
* ``grid``: a grid and the command line -> its cells, their plans and the grid's key;
* ``cells``: a cell, its outcome and :func:`~sweeps.cells.run_cell`, which trains one;
* ``launch/``: local, packed, parallel, submitit_local and SLURM, one class each behind one
  interface, and the launch schema (launcher, resources, seeds);
* ``slurm_jobs``: a grid's SLURM jobs (``jobs.json``), their states (squeue, sacct), scancel;
* ``packing``: how many cells at once, with how many threads, on this machine;
* ``closing``: the end of a grid (its parent run closed, its summary); ``estimate``: its cost first;
* ``search``: Optuna searches, whose trials are cells;
* ``parent``: the sweep's MLflow parent run (what the grid is, how far it got, its summary);
* ``progress``: what a grid prints: a line per cell start and end with the ETA, the summary table,
  what to run next;
* ``sweep``: ``mesh-sweep``: skipped and failed cells, Ctrl-C, ``--detach``, the end of a grid;
* ``status``: ``mesh-sweep --status`` and ``--cancel``: where a grid stands, settling what its
  processes could not close, cancelling its jobs.

Depends on ``experiments`` (one run) and ``mesh_model``; nothing here is imported by them.
"""
