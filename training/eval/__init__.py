"""``flywheel eval``: a classifier measured on labelled queries, the command's library (the
command in :mod:`training.cli.offline` only parses its options into an
:class:`~training.eval.run.EvalOptions`, calls :func:`~training.eval.run.run_eval` and prints).

- :mod:`~training.eval.run`: one run, step by step (the options, the model fitted, tuned or
  loaded, the held-out calibration, the rows the model does not know, the measurement)
- :mod:`~training.eval.measure`: the measurement (:func:`~training.eval.measure.evaluate`: the
  report's figures, layer 2 alone, the cutoffs, tiers, latency)
- :mod:`~training.eval.held_out`: the prediction sets and a target's cutoff placed on held-out rows
- :mod:`~training.eval.loaders`: labelled query files (CLINC150 JSON, CSV, JSON Lines) and unlabelled texts
- :mod:`~training.eval.sessions`: multi-turn test files (each turn with its session's history) and
  the follow-up figures
- :mod:`~training.eval.render`: what the command prints and draws (the text report, the trade
  tables, both sets of plots)

The label metrics it shares with the promotion gate are :mod:`training.metrics`. The wing
imports :mod:`~training.tuner` (to fit on a tuned encoder) and no other wing. Nothing is
imported here.
"""
