"""flywheel: an intent classifier for LLM applications that gets cheaper the longer it runs.

The distribution is ``flywheel-intent``; everything it installs lives under this one
namespace: :mod:`flywheel.classifier` (runtime), :mod:`flywheel.logstore` (traffic log),
:mod:`flywheel.fleet` (object storage), :mod:`flywheel.service` (serving),
:mod:`flywheel.training` (offline) and :mod:`flywheel.cli` (the ``flywheel`` command).

A source checkout keeps those rooms as folders at the repository root and links each
into this folder (``flywheel/classifier -> ../classifier``, committed as a symlink), so
``flywheel.classifier`` is ``flywheel/classifier/`` in a checkout, in the wheel and to
any static reader alike; nothing here extends the import system.
"""
