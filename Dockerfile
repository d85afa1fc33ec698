# flywheel gRPC sidecar (`flywheel serve`): the image a pod runs beside the application.
#
#   docker build -t flywheel:0.1.0 .
#   docker run --rm -p 127.0.0.1:50051:50051 -v flywheel-home:/var/lib/flywheel flywheel:0.1.0 --teacher off
#
# Arguments after the image name are appended to the entrypoint (`flywheel serve ...`):
# e.g. `--grace 10`, `--metrics-port 9090 --metrics-address 0.0.0.0`, `--teacher off`.
# The admin token for Feedback comes from the environment (FLYWHEEL_ADMIN_TOKEN), never
# from the command line.
#
# tests/test_wheel.py::test_installed_sidecar_serves_and_stops_cleanly does what this file
# does (build the wheel, install it into a fresh venv, run `flywheel serve` from an empty
# directory, classify, SIGTERM -> exit 0), since CI cannot build images.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- build: the wheel only
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --disable-pip-version-check --no-deps -w /dist .

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

# The package pins torch (torch==2.13.0); this extra index makes pip pick the CPU build
# (2.13.0+cpu) instead of PyPI's CUDA wheels (gigabytes). Pass an empty value to use
# only the default index, or point PIP_INDEX_URL at a mirror.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu

RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/flywheel flywheel \
 && mkdir -p /var/lib/flywheel \
 && chown 10001:10001 /var/lib/flywheel

COPY --from=build /dist/ /tmp/dist/
# the fleet extra (obstore) lets the same image ship to an object store (FLYWHEEL_STORE)
RUN python -m venv /opt/flywheel \
 && WHEEL="$(ls /tmp/dist/flywheel_intent-*.whl)" \
 && /opt/flywheel/bin/pip install --no-cache-dir --disable-pip-version-check "${WHEEL}[fleet]" \
 && rm -rf /tmp/dist

# FLYWHEEL_HOME holds the traffic log (log/flywheel.duckdb), the default model trained on
# first start (cache/, ~10 s) and promoted versions (models/): mount a volume there.
# The default encoders (USE multilingual for the starter set, MiniLM for English-only sets)
# ship inside installed packages, so nothing is downloaded at run time (HF_HUB_OFFLINE);
# unset it for an intent set whose encoder must be fetched. MiniLM's ONNX export is cached
# on first use in FLYWHEEL_ONNX_CACHE, on the volume so a new container does not export again.
ENV FLYWHEEL_HOME=/var/lib/flywheel \
    FLYWHEEL_ONNX_CACHE=/var/lib/flywheel/cache/onnx \
    HOME=/home/flywheel \
    PATH=/opt/flywheel/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
VOLUME ["/var/lib/flywheel"]
WORKDIR /home/flywheel
USER 10001:10001

EXPOSE 50051
# `flywheel serve` shuts down gracefully on SIGTERM (health NOT_SERVING, new calls
# UNAVAILABLE, calls in flight get --grace seconds, the log is flushed) and exits 0.
STOPSIGNAL SIGTERM
# For `docker run` only (Kubernetes ignores HEALTHCHECK and uses its native gRPC probes).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["/opt/flywheel/bin/python", "-c", "import sys, grpc; from grpc_health.v1 import health_pb2 as p, health_pb2_grpc as g; r = g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(p.HealthCheckRequest(service='flywheel.v1.IntentClassifier'), timeout=3); sys.exit(r.status != p.HealthCheckResponse.SERVING)"]

# Inside a pod the sidecar must listen beyond loopback: the kubelet's gRPC readiness and
# liveness probes connect to the pod IP, not to 127.0.0.1. The application container in
# the same pod still reaches it on localhost:50051 (containers of a pod share the network
# namespace). Outside Kubernetes, publish the port on loopback only (as above) or pass
# `--address 127.0.0.1:50051` (a later --address wins).
ENTRYPOINT ["/opt/flywheel/bin/flywheel", "serve", "--address", "0.0.0.0:50051"]
