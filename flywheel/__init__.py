"""The ``flywheel`` command line (:mod:`flywheel.cli`). The library lives in
:mod:`classifier` (runtime), :mod:`logstore` (traffic log), :mod:`service` (serving)
and :mod:`training` (offline)."""
