"""Settings: the intent file, the config file and environment, and the command line's helpers.

- :mod:`~classifier.settings.intents`: intent files (intents, rules, thresholds, embedder, teacher)
- :mod:`~classifier.settings.followups`: the intent file's ``followups`` (resolve, defer or off)
- :mod:`~classifier.settings.config`: settings, flag > environment > config file > default
- :mod:`~classifier.settings.label_names`: a label as a string, one meaning for "out of scope"
- :mod:`~classifier.settings.listen`: the addresses a server listens on, checked before it tries
- :mod:`~classifier.settings.output`: the command line's JSON lines

Imports only the top level's :mod:`~classifier.errors`, a target's cutoff rule from :mod:`~classifier.layer2`
and, of :mod:`~classifier.encoders`, the backends' descriptions (:mod:`~classifier.encoders.backends`).
"""
