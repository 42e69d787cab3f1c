"""Where the cells of a grid run: the interface and resources (:mod:`~sweeps.launch.base`), this
machine's launchers (:mod:`~sweeps.launch.local`, with the process pool of
:mod:`~sweeps.launch.pool`), submitit's and SLURM's (:mod:`~sweeps.launch.slurm`, with what runs in
each job in :mod:`~sweeps.launch.cell_job`), and the launch config with its registry
(:mod:`~sweeps.launch.config`)."""
