"""The MLflow store: where runs go and the local sqlite store's life (:mod:`~experiments.store.sqlite`),
the checks that a store and a runs folder can be used before anything runs
(:mod:`~experiments.store.check`), and where the UI shows the runs (:mod:`~experiments.store.views`).
The record a training run keeps in it is :mod:`experiments.tracking`."""
