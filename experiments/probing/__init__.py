"""The paper's hidden-state probes for every run (the math is :mod:`mesh_model.probes`).

* ``callback``: :class:`ProbeCallback`, probing during and at the end of training;
* ``files``: ``probes.json`` and the figures of one report, written and read back (no Lightning);
* ``cli``: ``mesh-probe``, the probes of a saved checkpoint.
"""
