"""What the tests share besides fixtures. Test modules import from here, never from one
another (tests/test_architecture.py checks it); fixtures live in tests/conftest.py.

- ``paths``: ``ROOT``, ``TESTS``, ``DATA`` (tests/data), for a test at any depth.
- ``docs``: the tiny intent document ``DOC``, the ``ALWAYS_SURE``/``ALWAYS_UNSURE``
  thresholds, toy topics, and the nonsense inputs.
- ``fakes``: ``HashEmbedder``, ``ScriptedTeacher``, ``ListSink``, ``make_classifier``.
- ``worlds``: ``blobs`` of vectors, and the synthetic traffic world of the retrain tests.
- ``records``: hand-built decision records for the log's tests.
- ``servers``: free ports, bounded waits, the ``flywheel`` command line for subprocesses.
- ``sidecar``: the gRPC sidecar in process (``serving``, ``client``) and a ``Load`` generator.
- ``s3``: the real S3 server (``weed mini``) and its fixtures.
- ``bucket``: model versions and spool sinks on that server's bucket.
- ``simulated_ollama``: a local HTTP server that speaks Ollama's API with a known accuracy
  (tests and benchmarks; ``python -m tests.support.simulated_ollama --help``).
"""
