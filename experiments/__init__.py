"""One training run: from a config to a trained, probed, evaluated model in MLflow.

* ``conf/``, ``config``: the Hydra config tree (``conf/<group>/<option>.yaml``) and its typed schema;
* ``compose``, ``overrides``: composing configs from any process; one-line answers for bad overrides;
* ``identity``: what makes two runs the same run (the run hash, table rows, ``scheme=vanilla``);
* ``plan``, ``store.check``: every input (the MLflow store and the step's memory included) checked
  and the run's identity decided, before compute; ``hardware``: what this machine has (free
  memory, devices, the process's rank);
* ``train``: ``mesh-train`` (``train(cfg) -> result``); ``trainer``: the Lightning Trainer and callbacks;
* ``lit_module``, ``schedule``: the paper's optimisation recipe around the model;
* ``callbacks/``: atomic checkpoints, wall-time accounting, Optuna pruning;
* ``probing/``: the hidden-state probes (callback, files, ``mesh-probe``);
* ``store/``: the MLflow store (where, its creation and checks, the UI's views and links);
* ``tracking``: a run's record in the store; ``locks``: one process per run;
* ``checkpoints``: reading runs back (mesh-probe, mesh-eval);
* ``data/``: corpora, tokenizers, token caches, the data module; ``evaluation/``: ``mesh-eval``.

Depends on ``mesh_model`` only; ``sweeps`` and ``results`` build on it.
"""
