"""Paper-style results from the runs: tables, figures, claims and a report (``mesh-results``).

The sub-packages are the stages of one flow, in the order :mod:`results.pipeline` runs them:

* :mod:`results.runs`: reading runs, I/O only: the MLflow store (runs, validation curves, routing
  curves, train-loss histories, probe files), a committed ``runs.csv`` / ``curves.csv``, the
  ``seeds=auto`` stages record and the confirmatory family;
* :mod:`results.rows`: seeds grouped into rows (one configuration) and blocks (compute-matched
  rows), mean ± sd with n; the runs frame's columns; the paper's numbers matched to rows;
* :mod:`results.stats`: numbers in, numbers out: the paired / Welch tests, Holm and BH, power, the
  group-sequential design, bands over seeds;
* :mod:`results.verdicts`: the claims decided, as data: the claims file, the verdict engine
  (:mod:`results.verdicts.engine`, run once per report by :func:`results.verdicts.decide.decide`),
  the design's decisions, rankings, the best LR, where along training a comparison held;
* :mod:`results.render`: Markdown, LaTeX, CSV, figures and terminal lines of what was decided; it
  reads no run and runs no verdict engine (import-linter contracts in ``pyproject.toml``);
* :mod:`results.publish`: the output folder (written beside its place, moved in whole) and the
  report on the sweeps' MLflow parent runs;
* :mod:`results.pipeline`: the stages in order (``build_report``), and ``claims.md`` rebuilt from a
  committed ``runs.csv`` (``rebuild_claims``);
* :mod:`results.commands`: the console commands: ``mesh-results``, ``mesh-demo`` (the main job and
  its regime lines) and ``mesh-sweep GRID seeds=auto`` / ``--plan``.

Nothing imports upward (commands -> pipeline -> publish -> render -> runs -> verdicts -> rows ->
stats); ``make lint`` checks it.
"""
