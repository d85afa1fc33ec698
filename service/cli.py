"""Serving commands of the ``flywheel`` command line (registered in :mod:`flywheel.cli`)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from flywheel.classifier.settings.config import HOME_HELP, TEACHER_HELP, TEACHER_HOST_HELP, load_config
from flywheel.classifier.settings.output import echo_json
from flywheel.service.options import BatchOptions, ServerOptions

__all__ = ["classify_command", "serve_command"]


# the options every serving command shares (one object each, reused by both commands)
MODEL_OPTION = typer.Option(None, "--model", help="Model version dir or models home with CURRENT.")
INTENTS_OPTION = typer.Option(None, "--intents", help="Intent file for the default model.")
TEACHER_OPTION = typer.Option(None, "--teacher", help=TEACHER_HELP)
# --teacher-host (alias --ollama-host) sets teacher_host, the teacher's host for either backend
TEACHER_HOST_OPTION = typer.Option(None, "--teacher-host", "--ollama-host", help=TEACHER_HOST_HELP)
LOG_OPTION = typer.Option(True, "--log/--no-log", help="Log decisions to the DuckDB traffic log.")
LOG_DB_OPTION = typer.Option(None, "--log-db", help="Traffic log DuckDB file (default: <home>/log/flywheel.duckdb).")
HOME_OPTION = typer.Option(None, "--home", help=HOME_HELP)


def classify_command(
    texts: List[str] = typer.Argument(None,
                                      help="Queries to classify; '-' or none reads one per line from stdin."),
    model: Optional[str] = MODEL_OPTION,
    intents: Optional[str] = INTENTS_OPTION,
    declared_type: Optional[str] = typer.Option(None, "--declared-type",
                                                help="Caller-declared type: bypasses the layers."),
    session: Optional[str] = typer.Option(None, "--session", help="Session id: keeps a compact history."),
    history: Optional[str] = typer.Option(None, "--history", help='JSON list of {"label","text"} earlier turns.'),
    teacher: Optional[str] = TEACHER_OPTION,
    teacher_host: Optional[str] = TEACHER_HOST_OPTION,
    log: bool = LOG_OPTION,
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Classify queries; prints one JSON decision per line."""
    cfg = load_config(home=home, model=model, intents=intents, teacher=teacher, teacher_host=teacher_host,
                      log_db=log_db)
    hist = None
    if history is not None:
        try:
            hist = json.loads(history)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--history is not valid JSON: {exc}") from None
    items = [t for t in (texts or []) if t != "-"]
    from_stdin = not texts or "-" in texts
    if not texts and _typing():
        typer.echo(STDIN_HINT, err=True)
    from flywheel.service.runtime import open_runtime  # duckdb and pyarrow: only for this command

    # reading stdin can run for hours: then follow promotions on the watcher's thread
    runtime = open_runtime(cfg, log_decisions=log, background_reload=from_stdin)
    clf = runtime.classifier
    try:
        # stdin is read line by line: each decision is printed as soon as it is made
        lines = (ln.rstrip("\n") for ln in sys.stdin if ln.strip()) if from_stdin else iter(())
        for text in itertools.chain(items, lines):
            d = clf.classify(text, history=hist, declared_type=declared_type, session_id=session)
            echo_json(d.to_dict())
    finally:
        runtime.close()


#: What ``flywheel classify`` without a query says when a person types at it: stdin is read
#: either way (a session of typed queries is a use, not a mistake, so no usage error), and the
#: line goes to stderr so that stdout stays one JSON decision per line.
STDIN_HINT = ("flywheel classify: reading queries from standard input, one per line (Ctrl-D ends; "
              "or pass them as arguments)")


def _typing() -> bool:
    """Whether stdin is a terminal (a person types the queries)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):    # closed or detached
        return False


def serve_command(
    address: str = typer.Option(ServerOptions.address, "--address",
                                help="host:port to listen on (loopback by default)."),
    uds: Optional[str] = typer.Option(None, "--uds", help="Listen on this Unix domain socket instead."),
    grace: float = typer.Option(ServerOptions.grace_s, "--grace", min=0.0,
                                help="Seconds calls in flight get to finish on SIGTERM."),
    max_message_bytes: int = typer.Option(ServerOptions.max_message_bytes, "--max-message-bytes", min=1024,
                                          help="Largest request accepted (INVALID_ARGUMENT beyond)."),
    admin_token: Optional[str] = typer.Option(None, "--admin-token", envvar="FLYWHEEL_ADMIN_TOKEN",
                                              help="Feedback then needs 'authorization: Bearer <token>'."),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help="PEM certificate (with --tls-key)."),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help="PEM private key (with --tls-cert)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", min=0, max=65535,
                                               help="Serve Prometheus /metrics on this port (off by default)."),
    metrics_address: str = typer.Option(ServerOptions.metrics_address, "--metrics-address",
                                        help="Address of /metrics."),
    max_batch: int = typer.Option(BatchOptions.max_batch, "--max-batch", min=1, help="Queries per encoder pass."),
    max_wait_ms: float = typer.Option(BatchOptions.max_wait_ms, "--max-wait-ms", min=0.0,
                                      help="Wait for a fuller batch, only while busy."),
    max_queue: int = typer.Option(BatchOptions.max_queue, "--max-queue", min=1,
                                  help="Queries waiting for the encoder; beyond: RESOURCE_EXHAUSTED."),
    teacher_workers: int = typer.Option(BatchOptions.teacher_workers, "--teacher-workers", min=1,
                                        help="Concurrent LLM calls."),
    serve_last_good: Optional[bool] = typer.Option(
        None, "--serve-last-good/--no-serve-last-good",
        help="When no stored version was trained on the configured intents file, serve the home's current "
             "version anyway (logged loudly, flywheel_serving_other_intent_set 1) instead of exiting 2 "
             "(default: the serve_last_good setting, off)."),
    model: Optional[str] = MODEL_OPTION,
    intents: Optional[str] = INTENTS_OPTION,
    teacher: Optional[str] = TEACHER_OPTION,
    teacher_host: Optional[str] = TEACHER_HOST_OPTION,
    log: bool = LOG_OPTION,
    log_db: Optional[str] = LOG_DB_OPTION,
    home: Optional[Path] = HOME_OPTION,
) -> None:
    """Run the gRPC sidecar (flywheel.v1.IntentClassifier, health, reflection) until SIGTERM."""
    from flywheel.service.server import serve

    configure_logging()
    cfg = load_config(home=home, model=model, intents=intents, teacher=teacher, teacher_host=teacher_host,
                      log_db=log_db, serve_last_good=serve_last_good)
    options = ServerOptions(address=address, uds=uds, grace_s=grace, max_message_bytes=max_message_bytes,
                            admin_token=admin_token or None, tls_cert=tls_cert, tls_key=tls_key,
                            metrics_port=metrics_port, metrics_address=metrics_address,
                            batch=BatchOptions(max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                                               teacher_workers=teacher_workers))
    raise typer.Exit(serve(cfg, options, log_decisions=log))


#: Client libraries that log every request at INFO (httpx: one ``HTTP Request: POST
#: .../api/chat "HTTP/1.1 200 OK"`` line per teacher call); the sidecar keeps their warnings.
CHATTY_LOGGERS = ("httpx", "httpcore")


def configure_logging() -> None:
    """The sidecar's logging: INFO with timestamps on stderr, without a line per HTTP request."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
