"""Paper-style results from the MLflow store: tables, figures and a report (``mesh-results``).

* :mod:`results.collect`: the runs of one or more experiments as a tidy frame (one row per run);
* :mod:`results.tables`: rows of runs that differ only by seed, blocks of compute-matched rows,
  mean ± sample std with n, and the Markdown / LaTeX / CSV writers;
* :mod:`results.paper`: the paper's numbers (``paper_numbers.csv``) matched to our rows;
* :mod:`results.plots`: PPL vs parameters, the B ablation, training curves, probe comparisons;
* :mod:`results.report`: ``report.md`` tying them together; :mod:`results.cli`: ``mesh-results``.
"""
