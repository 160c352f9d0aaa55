"""The paper's experiments on a feature cache and a frozen captioner (``python -m avex.evaluate``).

* :mod:`.sweep`: every method at every retention (Table 2, Fig. 3);
* :mod:`.ablation`: Table 3's training-signal variants and group sizes;
* :mod:`.motivation`: Fig. 1 (attention against counterfactual gain, non-additivity);
* :mod:`.gates`: the embedded benchmark's measured gates, the analysis behind Fig. 1;
* :mod:`.diagnose`: where a trained policy's lost C_av goes (issue #33).

Captioning and scoring go through :mod:`avex.scoring`; methods come from :mod:`avex.methods`.
"""
