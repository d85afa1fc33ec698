"""Serving flywheel: the runtime wiring shared by ``flywheel classify`` and the gRPC
sidecar. It builds on :mod:`classifier` and :mod:`logstore`, never on :mod:`training`."""
