"""The paper's hidden-state probes for every run (the math is :mod:`mesh_model.probes`).

* ``callback``: :class:`ProbeCallback`, probing during and at the end of training;
* ``routing``: a mixture-of-experts run's routing per loop iteration (expert load, router
  entropy, Jaccard overlap of the chosen experts), beside the hidden-state probes;
* ``files``: ``probes.json`` and the figures of one report, written and read back (no Lightning);
* ``figures``: the probe figures (matplotlib on the Agg canvas), and the canvas and files of every
  figure of the project; ``routing_figures``: a mixture-of-experts run's routing figures;
* ``cli``: ``mesh-probe``, the probes of a saved checkpoint.
"""
