"""flywheel's offline side: retraining from the traffic log, encoder tuning, human review,
statistics and the offline commands. Unlike :mod:`classifier`, it may import duckdb,
pyarrow and scikit-learn; torch only in :mod:`~training.tuner`.

The retrain and its data, at the top:

- :mod:`~training.retrain`: ``flywheel retrain``, the job step by step (its module docs list the steps)
- :mod:`~training.trial`: the run's records (the job, the champion, the challengers, their evaluation)
- :mod:`~training.options`: the retrain's options and error, importable without scikit-learn
- :mod:`~training.protocols`: what the jobs need from the traffic log
- :mod:`~training.trainset`: the training set and the fixed evaluation split, distilled from the log
- :mod:`~training.rows`: labelled rows with their vectors, and the training set
- :mod:`~training.followups`: logged follow-ups as training rows, in the form layer 2 scores them
- :mod:`~training.teacher_noise`: the teacher's noise, and the filter of the teacher rows the evidence contradicts
- :mod:`~training.layer2`: layer 2 as the retrain sees it (tiered answers for a batch of vectors)
- :mod:`~training.cutoffs`: the ``confident`` cutoff re-tuned for a target precision or an LLM budget
- :mod:`~training.gate`: the promotion gate (layer-2 metrics, the rule that keeps the champion)
- :mod:`~training.metrics`: label metrics of predictions against the truth (the gate's and eval's)
- :mod:`~training.report`: the retrain's report, assembled, rendered (``report.md``) and written
- :mod:`~training.labeling`: ``flywheel label``, the teacher asked for the decisions left pending

The wings:

- :mod:`~training.tuner`: encoder tuning (fine-tuning, the adapter, the ONNX export, the
  retrain's tuning step, layer 2 fitted on a tuned encoder), the only importer of a model
  library in ``training``
- :mod:`~training.eval`: ``flywheel eval``, a classifier measured on labelled queries (the run,
  the measurement, held-out calibration, the data loaders, the text report and the plots)
- :mod:`~training.review`: human review (the queue, Label Studio, labels from Python, the
  local page and its API, the dashboard)
- :mod:`~training.stats`: ``flywheel stats`` (convergence per window, the shadow, anchoring)
- :mod:`~training.cli`: the offline commands (typer), registered in :mod:`flywheel.cli`

Top-level modules never import a wing, except the retrain and its records, which import
:mod:`~training.tuner`; the wings do not import one another, except eval, which fits on a
tuned encoder (:mod:`~training.tuner`), the review's dashboard, which draws flywheel stats,
and the commands, which call them all (``tests/test_architecture.py``). Nothing is imported
here.
"""
