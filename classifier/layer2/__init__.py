"""Layer 2: fitting the head on encoder vectors, scoring it, and the cutoffs that make tiers.

- :mod:`~classifier.layer2.head`: the head, a scikit-learn estimator (cutoffs by cross-validation)
- :mod:`~classifier.layer2.scoring`: the one numpy scoring path serving and the estimator share
- :mod:`~classifier.layer2.calibration`: softmax, temperature scaling, expected calibration error
- :mod:`~classifier.layer2.tiers`: layer-2 scores to confident / ambiguous / weak / no_match
- :mod:`~classifier.layer2.shift`: the training rows per language, and the undertrained ones whose rejections are unsure
- :mod:`~classifier.layer2.operating_point`: the trade curves as one cutoff moves, and the cutoff a target picks
- :mod:`~classifier.layer2.targets`: a target (precision, coverage) with its interval
- :mod:`~classifier.layer2.negatives`: synthetic nonsense that trains the out-of-scope class
- :mod:`~classifier.layer2.fitter`: fit layer 2 from an intent set into a model version

Imports the top level and :mod:`~classifier.encoders`; never :mod:`~classifier.versions`,
except the fitter, which makes a version.
"""
