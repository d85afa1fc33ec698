"""The review queue over HTTP (issue 25): a JSON API and one server-rendered page, behind
``flywheel ui``; standard library only (:mod:`http.server`), loopback by default.

:class:`ReviewApp` answers one request (method, path, query, headers, body) without any
server around it, so tests call it directly; :func:`make_server` puts it behind a
:class:`http.server.ThreadingHTTPServer`.

======================  =====================================================================
``GET /``               the queue as a page (:mod:`training.review.page`: every logged text
                        escaped; a small script labels the focused item with one key, as
                        ``flywheel review`` does, or with any intent typed into its box)
``GET /api/queue``      the queue as JSON: ``limit``, ``intent``, ``tier``, ``layer``,
                        ``reason`` (repeatable), ``min_confidence``, ``max_confidence``, ``days``,
                        ``language`` (``en``, ``es``, ``unknown``: the logged language; the page
                        takes the same parameters and offers the logged languages in a select),
                        and ``labels``: the intents a label may be (the served version's; ``null``: any)
``POST /api/labels``    ``{"decision_id", "label", "author"?}`` or ``{"labels": [...]}``: human
                        labels (they win at the next retrain); needs
                        ``Authorization: Bearer <admin token>``
``GET /dashboard``      the dashboard (:mod:`training.review.dashboard`): pictures drawn on the server
``GET /api/dashboard``  what it shows, as JSON (``window``: decisions per window, default sized to the
                        log: :func:`~training.review.dashboard.auto_window`; ``languages``: per
                        logged language)
``GET /api/health``     ``{"ok": true, "writable": bool}``
``GET /favicon.ico``    the pages' icon (an SVG; the pages also declare it inline)
======================  =====================================================================

The labels the page offers and the API takes are those of the version served now, as the
sidecar's are: read through the site (:meth:`fleet.site.Site.served_labels`) by the writer
and read again once they are :data:`LABELS_MAX_AGE_S` old (``flywheel ui``'s writer:
:meth:`fleet.human_labels.HumanLabels.following`), so after a promotion with another intent
set the page offers the new intents and a label of a removed one is refused, without a
restart; a label is checked against them again when it is written.

Bad input is a 4xx with ``{"error": "..."}`` naming what was wrong: 400 (bad JSON, a bad
filter, an unknown label, a content-length that is not a whole number of bytes), 401 (no or
a wrong token), 404 (an unknown path or decision), 405 (a wrong method), 413 (a body over
:data:`MAX_BODY`). Without an admin token the app is read-only: every write is refused
with 403. A batch of labels is checked whole before any is written, so a bad item loses
nothing and writes nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from flywheel.classifier.errors import ConfigError, FlywheelError, UnknownLabelError
from flywheel.classifier.settings.listen import check_listen, check_port
from flywheel.logstore.errors import UnknownDecisionError
from flywheel.training.review.page import ICON_SVG, render_page
from flywheel.training.review.queue import ReviewError, ReviewFilters, review_queue

if TYPE_CHECKING:
    from flywheel.fleet.human_labels import HumanLabels
    from flywheel.logstore.reads import LogReader

__all__ = ["LABELS_MAX_AGE_S", "MAX_BODY", "ReviewApp", "Response", "make_server"]

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20       # bytes a POST may carry
MAX_LABELS = 1000        # labels one POST may carry
MAX_DRAIN = 8 << 20      # an oversize body up to this is read and dropped before the 413
#: seconds ``flywheel ui`` keeps the served labels before it asks the site again (a promotion shows within it)
LABELS_MAX_AGE_S = 2.0


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes

    @classmethod
    def json(cls, status: int, doc: Any) -> "Response":
        return cls(status, "application/json; charset=utf-8", json.dumps(doc, ensure_ascii=False).encode("utf-8"))

    @classmethod
    def error(cls, status: int, message: str) -> "Response":
        return cls.json(status, {"error": message})


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ReviewApp:
    """The API and page over one traffic log.

    Parameters
    ----------
    store : logstore.reads.LogReader
        The log the queue, the page and the dashboard read (a :class:`logstore.LogStore`;
        its named reads).
    writer : fleet.human_labels.HumanLabels
        The site's one writer of human labels (:meth:`fleet.site.Site.human_labels`): its
        ``labels`` (the served model's; ``flywheel ui`` gives one that follows the served
        version, :meth:`~fleet.human_labels.HumanLabels.following`) are the ones a label
        must be one of and the page offers, asked for on each request; a POSTed label is
        parsed and its decision id checked by it, and recorded through it, which checks the
        label again (locally an id not in the log is a 404).
    admin_token : str, optional
        The token writes need; ``None``: read-only.
    history : callable, optional
        The dashboard's retrain history (``[]`` without; ``flywheel ui``:
        :func:`training.review.dashboard.retrain_history` of the site's versions' reports).
    """

    def __init__(self, store: LogReader, writer: HumanLabels, *, admin_token: str | None = None,
                 history: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.store = store
        self.writer = writer
        self.admin_token = admin_token or None
        self.history = history or list

    @property
    def labels(self) -> Sequence[str] | None:
        """The labels of the version served now (the writer's: ``None``, any)."""
        return self.writer.labels

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
        """Answer one request; never raises for bad input."""
        url = urlsplit(target)
        query = parse_qs(url.query, keep_blank_values=False)
        routes: dict[str, dict[str, Callable[[], Response]]] = {
            "/": {"GET": lambda: self._page(query)},
            "/api/queue": {"GET": lambda: Response.json(200, self._queue_doc(query))},
            "/api/labels": {"POST": lambda: self._post_labels(headers, body)},
            "/api/health": {"GET": lambda: Response.json(200, {"ok": True, "writable": bool(self.admin_token)})},
            "/dashboard": {"GET": lambda: self._dashboard(query, page=True)},
            "/api/dashboard": {"GET": lambda: self._dashboard(query, page=False)},
            "/favicon.ico": {"GET": lambda: Response(200, "image/svg+xml", ICON_SVG.encode("utf-8"))},
        }
        route = routes.get(url.path)
        if route is None:
            return Response.error(404, f"no such path {url.path!r}")
        fn = route.get(method)
        if fn is None:
            return Response.error(405, f"{url.path} takes {', '.join(route)}, not {method}")
        try:
            return fn()
        except _BadRequest as exc:
            return Response.error(exc.status, str(exc))
        except ReviewError as exc:
            return Response.error(400, str(exc))

    # ------------------------------------------------------------------- reading
    def _filters(self, query: Mapping[str, list[str]]) -> tuple[ReviewFilters, int]:
        known = {"limit", "intent", "tier", "layer", "reason", "min_confidence", "max_confidence", "days",
                 "language"}
        unknown = sorted(set(query) - known)
        if unknown:
            raise _BadRequest(400, f"unknown query parameter(s) {', '.join(unknown)} "
                                   f"(known: {', '.join(sorted(known))})")

        def one(name: str) -> str | None:
            v = query.get(name)
            return v[-1] if v else None

        def number(name: str) -> float | None:
            v = one(name)
            if v is None:
                return None
            try:
                return float(v)
            except ValueError:
                raise _BadRequest(400, f"{name} must be a number, got {v!r}") from None

        limit = number("limit")
        if limit is not None and (limit != int(limit) or not 1 <= limit <= 1000):
            raise _BadRequest(400, f"limit must be a whole number from 1 to 1000, got {one('limit')!r}")
        days = number("days")
        if days is not None and days < 0:
            raise _BadRequest(400, f"days must be at least 0, got {one('days')!r}")
        f = ReviewFilters(intent=one("intent"), tier=one("tier"), layer=one("layer"),
                          reasons=tuple(query.get("reason", ())), min_confidence=number("min_confidence"),
                          max_confidence=number("max_confidence"),
                          since=None if days is None else time.time() - days * 86_400,
                          language=one("language") or None)
        return f, int(limit or 50)

    def _queue_doc(self, query: Mapping[str, list[str]], labels: Sequence[str] | None = None) -> dict[str, Any]:
        f, limit = self._filters(query)
        labels = self.labels if labels is None else labels
        items = review_queue(self.store, f, limit=limit, labels=labels)
        return {"items": [it.to_dict() for it in items], "n": len(items),
                "labels": None if labels is None else list(labels)}

    def _page(self, query: Mapping[str, list[str]]) -> Response:
        labels = self.labels       # one answer for the whole page
        doc = self._queue_doc(query, labels)
        logged = self.store.logged_languages()
        html = render_page(doc["items"], writable=bool(self.admin_token), labels=labels,
                           languages=logged, language=(query.get("language") or [""])[-1] or None)
        return Response(200, "text/html; charset=utf-8", html.encode("utf-8"))

    def _dashboard(self, query: Mapping[str, list[str]], *, page: bool) -> Response:
        from flywheel.training.review.dashboard import dashboard_data, render_dashboard

        unknown = sorted(set(query) - {"window"})
        if unknown:
            raise _BadRequest(400, f"unknown query parameter(s) {', '.join(unknown)} (known: window)")
        given = query.get("window")
        raw = given[-1] if given else None
        if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= 1_000_000):
            raise _BadRequest(400, f"window must be a whole number of decisions from 1 to 1000000, got {raw!r}")
        data = dashboard_data(self.store, self.history(), window=None if raw is None else int(raw))
        if not page:
            return Response.json(200, data)
        return Response(200, "text/html; charset=utf-8", render_dashboard(data).encode("utf-8"))

    # ------------------------------------------------------------------- writing
    def _authorize(self, headers: Mapping[str, str]) -> None:
        if self.admin_token is None:
            raise _BadRequest(403, "this review server is read-only: start flywheel ui with --admin-token "
                                   "(or FLYWHEEL_ADMIN_TOKEN) to write labels")
        scheme, _, given = (headers.get("authorization") or headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8"),
                                                                 self.admin_token.encode("utf-8")):
            raise _BadRequest(401, "writing labels needs 'Authorization: Bearer <admin token>'")

    def _post_labels(self, headers: Mapping[str, str], body: bytes) -> Response:
        self._authorize(headers)
        if len(body) > MAX_BODY:
            raise _BadRequest(413, f"the body is over {MAX_BODY} bytes")
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest(400, f"the body is not JSON: {exc}") from None
        raw = doc.get("labels") if isinstance(doc, dict) and "labels" in doc else [doc]
        if not isinstance(raw, list) or not raw or len(raw) > MAX_LABELS:
            raise _BadRequest(400, f"'labels' must be a list of 1 to {MAX_LABELS} objects")
        checked = [self._check_item(i, item) for i, item in enumerate(raw)]   # all, before any write
        done: list[dict[str, str | None]] = []
        for did, label, author in checked:
            try:
                self.writer.record(did, label, author=author)
            except UnknownDecisionError:
                raise _BadRequest(404, f"item {len(done)}: no decision {did!r} in the log; "
                                       f"{len(done)} label(s) before it were recorded") from None
            except UnknownLabelError as exc:   # another version was promoted since the check
                raise _BadRequest(400, f"item {len(done)}: {exc}; {len(done)} label(s) before it "
                                       f"were recorded") from None
            done.append({"decision_id": did, "label": label})
        return Response.json(200, {"recorded": done, "n": len(done)})

    def _check_item(self, i: int, item: Any) -> tuple[str, str | None, str | None]:
        if not isinstance(item, dict):
            raise _BadRequest(400, f"item {i}: expected an object with decision_id and label")
        author = item.get("author")
        try:
            did = self.writer.check_id(item.get("decision_id"))
        except UnknownDecisionError as exc:     # a fleet's: cannot be a decision of the fleet's
            raise _BadRequest(404, f"item {i}: {exc}; nothing was recorded") from None
        except FlywheelError as exc:
            raise _BadRequest(400, f"item {i}: {exc}") from None
        if author is not None and not isinstance(author, str):
            raise _BadRequest(400, f"item {i}: author must be a string")
        if "label" not in item:
            raise _BadRequest(400, f"item {i}: label is missing (OUT_OF_SCOPE for none)")
        try:
            label = self.writer.parse(item["label"])
        except FlywheelError as exc:
            raise _BadRequest(400, f"item {i}: {exc}") from None
        return did, label, author


def _content_length(raw: str | None) -> int | None:
    """A request's body length: ``0`` without the header, ``None`` (a 400) unless it is
    plain decimal digits (``-5``, ``+5``, ``1.5``, ``0x10``, ``1_000`` and blank are refused)."""
    if raw is None:
        return 0
    raw = raw.strip()
    return int(raw) if raw.isascii() and raw.isdigit() else None


def make_server(app: ReviewApp, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for ``app`` on ``host:port`` (``0``: a free port); not started. An
    address it cannot listen on (the port taken or out of range, the host not this
    machine's) is a one-line :class:`~classifier.errors.ConfigError` naming it and why."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "flywheel-ui"

        def _answer(self, method: str) -> None:
            length = _content_length(self.headers.get("content-length"))
            if length is None:
                res = Response.error(400, f"content-length must be a whole number of bytes (0 or more), "
                                          f"got {self.headers.get('content-length')!r}")
                self.close_connection = True
            elif length > MAX_BODY:
                res = Response.error(413, f"the body is over {MAX_BODY} bytes")
                self.close_connection = True
                # read (and drop) a body up to MAX_DRAIN, so the client gets the 413 instead
                # of a reset while it is still sending; a larger one is cut off
                left = length if length <= MAX_DRAIN else 0
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    left -= len(chunk)
            else:
                body = self.rfile.read(length) if length > 0 else b""
                try:
                    res = app.handle(method, self.path, dict(self.headers.items()), body)
                except Exception:  # noqa: BLE001 - a bug answers 500, never a dropped connection
                    log.exception("review server: %s %s failed", method, self.path)
                    res = Response.error(500, "internal error (see the server's log)")
            self.send_response(res.status, HTTPStatus(res.status).phrase)
            self.send_header("content-type", res.content_type)
            self.send_header("content-length", str(len(res.body)))
            self.send_header("x-content-type-options", "nosniff")
            self.send_header("content-security-policy", "default-src 'self'; script-src 'unsafe-inline' 'self'; "
                                                        "style-src 'unsafe-inline' 'self'; img-src 'self' data:")
            self.end_headers()
            self.wfile.write(res.body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._answer("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._answer("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._answer("DELETE")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            log.info("review server: " + format, *args)

    check_port(port, "--port")
    try:
        return ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        check_listen(host, port, "--host/--port")      # the reason in words, when it still fails
        raise ConfigError(f"cannot listen on {host}:{port} (--host/--port): {exc.strerror or exc}") from None
