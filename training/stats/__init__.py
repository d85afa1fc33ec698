"""``flywheel stats``: what the traffic log says about the flywheel.

- :mod:`~training.stats.traffic`: the convergence statistics per window (layers, tiers,
  audits, the teacher's noise) and their table
- :mod:`~training.stats.shadow`: the shadow version's section (its agreement with the champion)
- :mod:`~training.stats.anchoring`: the anchoring section (a teacher echoing the history)
- :mod:`~training.stats.language`: the per-language section (each language's share and how it fares)

Nothing is imported here.
"""
