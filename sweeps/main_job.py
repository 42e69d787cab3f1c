"""The main job's grid and its size (``mesh-demo``, results/commands/mesh_demo.py): its defaults, and
what every grid's ``--dry-run`` sets its own steps and seeds beside (:func:`sweeps.catalogue.against_main_job`).
Nothing imported: ``mesh-demo --help`` reads it."""

MAIN_JOB = "schemes"
MAIN_JOB_STEPS = 400
MAIN_JOB_SEEDS = 2
