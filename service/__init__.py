"""Serving flywheel: the runtime wiring shared by ``flywheel classify``, Python callers
and the gRPC sidecar. It builds on :mod:`classifier`, :mod:`logstore` and :mod:`fleet`
(the site: where the log and the models live), never on :mod:`training`.

- :mod:`~service.runtime`: :func:`~service.runtime.open_runtime`, the classifier that logs,
  follows promotions and closes cleanly, with its log, audits, shadow and fleet sync
- :mod:`~service.cli`: the serving commands (``flywheel classify``, ``flywheel serve``)
- :mod:`~service.options`: the sidecar's settings and their one set of defaults
- :mod:`~service.server`: the gRPC server: built, run until SIGTERM, drained
- :mod:`~service.servicer`: the gRPC servicer: converts messages and maps errors to status codes
- :mod:`~service.convert`: Python types to and from the gRPC messages, pure functions
- :mod:`~service.core`: what the sidecar does with a request apart from gRPC (batching, the
  teacher's bounded pool, feedback, readiness)
- :mod:`~service.batcher`: micro-batching of layer 2 across concurrent requests
- :mod:`~service.auth`: who may write labels (the admin token)
- :mod:`~service.metrics`: the Prometheus metrics
- :mod:`~service.errors`: the sidecar's own errors
- :mod:`~service.client`: a thin typed client for the sidecar
"""
