"""The offline commands of the ``flywheel`` command line (registered in :mod:`flywheel.cli`);
the only typer in :mod:`training`. Each command parses its options, calls the library and
prints the result.

- :mod:`~training.cli.offline`: ``train``, ``eval``, ``feedback``, ``label``, ``stats`` and ``prune-log``
- :mod:`~training.cli.models`: ``models`` (list, promote, shadow, push, rollback, prune)
- :mod:`~training.cli.retrain`: ``retrain``
- :mod:`~training.cli.review`: ``review`` (the terminal walk, Label Studio files) and ``ui``
- :mod:`~training.cli.check`: ``check`` (what is served, what is configured, whether they agree)
- :mod:`~training.cli._options`: the options several commands share (``--home``, ``--log-db``,
  ``--models``, ``--json``, ``--quiet``, ``--tune-encoder``, ``--tune-budget``)

Nothing is imported here, so the command line's root loads each module, and no model library.
"""
