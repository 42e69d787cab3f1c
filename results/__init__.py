"""Paper-style results from the MLflow store: tables, figures and a report (``mesh-results``).

Reading the runs:

* :mod:`results.collect`: the runs of one or more experiments as a tidy frame (one row per run);
* :mod:`results.aggregate`: rows of runs that differ only by seed, blocks of compute-matched rows,
  mean ± sample std with n;
* :mod:`results.curves`: every validation step of every run (``curves.csv``), the claims there;
* :mod:`results.routing`: how each looped row passes state along the loop (``routing.csv``, figures);

Testing them:

* :mod:`results.stats`: the tests over seeds (paired t / Welch t, 95% CI, Holm) behind every difference;
* :mod:`results.claims_schema`: the paper's claims file (``paper_claims.yaml``), read and checked;
* :mod:`results.claims`: the claims' verdicts on the runs;
* :mod:`results.sequential`: the group-sequential design over seeds (stages, boundaries, alpha);
* :mod:`results.sequential_verdicts`: a ``seeds=auto`` grid's decisions as its verdicts;
* :mod:`results.paper`: the paper's numbers (``paper_numbers.csv``) matched to our rows;
* :mod:`results.lr_sensitivity`: each variant's PPL at every peak LR, its best LR;
* :mod:`results.open_choices`: the open-choices screen's declared rule applied (``decision.md``);

Writing them:

* :mod:`results.tables`: what goes in the main and probe tables (columns, cells, tests, best per block);
* :mod:`results.render`: those tables as Markdown, LaTeX (booktabs) and CSV;
* :mod:`results.plots`: PPL vs parameters, the B ablation, training curves, probe comparisons;
* :mod:`results.ranking`: each block's rows ranked, with Δ vs base and the claim's verdict;
* :mod:`results.terminal_summary`: that ranking in plain text for the terminal;
* :mod:`results.claims_md`: ``claims.md``;
* :mod:`results.report_markdown`: the Markdown of ``report.md``;
* :mod:`results.report`: the ``mesh-results`` pipeline (read, aggregate, write, draw, publish);
* :mod:`results.outdir`: a report folder written beside its place and moved in whole;
* :mod:`results.publish`: the report on the sweeps' MLflow parent runs and the runs themselves;
* :mod:`results.from_csv`: ``claims.md`` (and the report's claims) again from a committed ``runs.csv``;

The commands:

* :mod:`results.cli`: ``mesh-results``; :mod:`results.main_job`: ``mesh-demo``, the main job, and
  :mod:`results.main_job_regime`: what it measures, said before its ranking;
* :mod:`results.seeds_auto`: ``mesh-sweep GRID seeds=auto`` (seeds in stages) and ``--plan``.
"""
