"""Model versions: what a version is on disk, where versions live, and which one is served.

- :mod:`~classifier.versions.model`: a model version on disk, checked whole on load
- :mod:`~classifier.encoders.blobs`: the models home's shared, content-addressed encoder blobs
- :mod:`~classifier.versions.registry`: a models home: versions, ``CURRENT``, prune, hot reload
- :mod:`~classifier.versions.registry_policy`: the prune and rollback rules both registries share
- :mod:`~classifier.versions.served`: what a deployment serves, and whether a version fits its intent set
- :mod:`~classifier.versions.default`: which model is served (:func:`~classifier.versions.default.served_model`),
  the default model trained on first use
"""
