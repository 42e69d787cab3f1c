"""Paper-style results from the MLflow store: tables, figures and a report (``mesh-results``).

* :mod:`results.collect`: the runs of one or more experiments as a tidy frame (one row per run);
* :mod:`results.aggregate`: rows of runs that differ only by seed, blocks of compute-matched rows,
  mean ± sample std with n;
* :mod:`results.stats`: the tests over seeds (paired t / Welch t, 95% CI, Holm) behind every difference;
* :mod:`results.tables`: what goes in the main and probe tables (columns, cells, tests, best per block);
* :mod:`results.render`: those tables as Markdown, LaTeX (booktabs) and CSV;
* :mod:`results.paper`: the paper's numbers (``paper_numbers.csv``) matched to our rows;
* :mod:`results.plots`: PPL vs parameters, the B ablation, training curves, probe comparisons;
* :mod:`results.claims`: the paper's claims (``paper_claims.yaml``) and their verdicts on the runs;
  :mod:`results.claims_md`: ``claims.md``;
* :mod:`results.report`: ``report.md`` tying them together; :mod:`results.cli`: ``mesh-results``.
"""
