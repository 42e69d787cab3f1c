"""Downstream evaluation: lm-evaluation-harness tasks and perplexity, logged to the run's MLflow run.

* ``lm_eval_model.MeshLM``: our model as an lm-eval model (registered as ``mesh``).
* ``perplexity``: token-level perplexity on the run's validation sets.
* ``suites``: the task suites (``paper9``, ``local``), each task's headline metric, task loading.
* ``evaluate.evaluate``: all of it for one checkpoint; ``cli.main`` is ``mesh-eval``.
* ``tasks/``: small offline tasks (YAML + jsonl) built from held-out Shakespeare.
"""

import os

from experiments.data.cache import cache_root

# lm-eval writes its request caches under its own site-packages folder unless told otherwise; it
# reads this variable once, when lm_eval.caching is first imported. (mesh-eval never turns the
# request cache on; this only keeps a user's own lm_eval calls out of site-packages.)
os.environ.setdefault("LM_HARNESS_CACHE_PATH", str(cache_root() / "lm_eval"))
