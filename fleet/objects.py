"""The object store client: the one module that imports ``obstore``.

:class:`ObjectStore` wraps an ``obstore`` ``S3Store`` for the configured bucket and
prefix; every key is relative to the prefix (``models/CURRENT``, not
``PREFIX/models/CURRENT``). It offers exactly what the fleet needs: create-only and
etag-conditional writes, conditional reads, listing and deletion. One instance is
safe to share between threads.

Each request times out after ``timeout_s`` (default 10 s) and is retried a few times
with a short backoff (connection errors, 5xx), never past ``timeout_s`` in all, so a
dead store fails fast. Every client failure becomes a :class:`~fleet.errors.FleetError`
whose message names the bucket and key and never a credential:
:class:`~fleet.errors.StoreUnavailable` (unreachable, timeout, 5xx/429),
:class:`~fleet.errors.PreconditionFailed` (412: the key exists or the etag moved), else
:class:`~fleet.errors.FleetError` (denied, bad request). A missing key is ``None``.

A retried conditional write whose first try did land (the answer was lost) fails its
precondition on the retry: for :meth:`ObjectStore.put_if_absent` that is "already
exists", which callers treat as acknowledged (same bytes by construction); after a
:class:`~fleet.errors.PreconditionFailed` from :meth:`ObjectStore.put_if_match`, read
the key again to see who won.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from flywheel.fleet.config import StoreConfig
from flywheel.fleet.errors import FleetError, PreconditionFailed, StoreConfigError, StoreUnavailable

try:  # the optional extra flywheel-intent[fleet]
    import obstore
    from obstore import exceptions as obx
    from obstore.store import S3Store
    _HAVE_OBSTORE = True
except ImportError:  # pragma: no cover - exercised only without the extra
    _HAVE_OBSTORE = False
if TYPE_CHECKING:  # typing-only names in obstore's stubs (not importable at runtime)
    from obstore import GetOptions, PutMode
    from obstore.store import S3Credential

__all__ = ["NOT_MODIFIED", "NotModified", "ObjectInfo", "ObjectStore"]

_STATUS = re.compile(r"status code: (\d{3})")


class NotModified(enum.Enum):
    """The type of :data:`NOT_MODIFIED`."""

    NOT_MODIFIED = "NOT_MODIFIED"


#: What :meth:`ObjectStore.get` returns when the object's etag still equals ``if_none_match``.
NOT_MODIFIED = NotModified.NOT_MODIFIED


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key relative to the store's prefix, size in bytes, and
    last-modified time (UTC)."""

    key: str
    size: int
    last_modified: datetime


class ObjectStore:
    """Keys under ``cfg``'s bucket and prefix; see the module docstring for the contract."""

    def __init__(self, cfg: StoreConfig, timeout_s: float = 10.0, *, connect_timeout_s: float | None = None,
                 max_retries: int = 3) -> None:
        if not _HAVE_OBSTORE:
            raise StoreConfigError("fleet mode needs the optional extra: pip install 'flywheel-intent[fleet]'")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.cfg = cfg
        self.timeout_s = float(timeout_s)
        connect = min(self.timeout_s, 5.0) if connect_timeout_s is None else connect_timeout_s

        def credentials() -> S3Credential:  # read once; keeps the secrets out of the client's config
            return {"access_key_id": cfg.access_key_id, "secret_access_key": cfg.secret_access_key,
                    "token": cfg.session_token, "expires_at": None}

        self._store = S3Store(
            cfg.bucket, prefix=cfg.prefix or None, region=cfg.region,
            endpoint=cfg.endpoint or f"https://s3.{cfg.region}.amazonaws.com",
            credential_provider=credentials,
            client_options={"allow_http": cfg.allow_http, "timeout": timedelta(seconds=self.timeout_s),
                            "connect_timeout": timedelta(seconds=connect)},
            retry_config={"max_retries": max_retries, "retry_timeout": timedelta(seconds=self.timeout_s),
                          "backoff": {"init_backoff": timedelta(milliseconds=100),
                                      "max_backoff": timedelta(seconds=1), "base": 2}})

    def __repr__(self) -> str:
        return f"ObjectStore({self.cfg})"

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists: True created, False it already existed
        (its content is left as it was)."""
        try:
            self.put_if_match(key, data, None)
        except PreconditionFailed:
            return False
        return True

    def put(self, key: str, data: bytes) -> str:
        """Write ``key`` whatever is there (create or replace); return the new etag."""
        try:
            result = obstore.put(self._store, _checked(key), data, mode="overwrite")
        except Exception as exc:  # every client error is mapped
            raise self._error("put", key, exc) from None
        return str(result.get("e_tag") or "")

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        """Write ``key`` only if its current etag is ``etag`` (``None``: only if it does not
        exist); return the new etag. Raises :class:`PreconditionFailed` when that does not hold."""
        path = _checked(key)
        mode: PutMode = "create" if etag is None else {"e_tag": etag}
        try:
            result = obstore.put(self._store, path, data, mode=mode)
        except Exception as exc:  # every client error is mapped
            raise self._error("put", key, exc) from None
        new_etag = result.get("e_tag")
        if not new_etag:
            raise FleetError(f"put {self.cfg.location(key)}: the store returned no etag")
        return new_etag

    def get(self, key: str, if_none_match: str | None = None
            ) -> tuple[bytes, str] | Literal[NotModified.NOT_MODIFIED] | None:
        """``(data, etag)``; ``None`` when ``key`` does not exist; :data:`NOT_MODIFIED` when its
        etag equals ``if_none_match``."""
        path = _checked(key)
        options: GetOptions = {"if_none_match": if_none_match} if if_none_match else {}
        try:
            result = obstore.get(self._store, path, options=options)
            return bytes(result.bytes()), result.meta.get("e_tag") or ""
        except obx.NotModifiedError:
            return NOT_MODIFIED
        except obx.PreconditionError as exc:
            if if_none_match:  # SeaweedFS answers 412 to a conditional GET of a missing key
                return self.get(key)
            raise self._error("get", key, exc) from None
        except FileNotFoundError as exc:
            self._missing("get", key, exc)
            return None
        except Exception as exc:
            raise self._error("get", key, exc) from None

    def head(self, key: str) -> str | None:
        """The etag of ``key``, ``None`` when it does not exist."""
        path = _checked(key)
        try:
            return obstore.head(self._store, path).get("e_tag") or ""
        except FileNotFoundError as exc:
            self._missing("head", key, exc)
            return None
        except Exception as exc:
            raise self._error("head", key, exc) from None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix`` (a key prefix ending at a ``/``: ``log`` lists ``log/...``,
        not ``logs/...``), sorted by key; keys are relative to the store's prefix."""
        prefix = prefix.strip("/")
        path = _checked(prefix) if prefix else None
        try:
            metas = obstore.list(self._store, path).collect()
        except Exception as exc:
            raise self._error("list", prefix, exc) from None
        return sorted((ObjectInfo(m["path"], m["size"], m["last_modified"]) for m in metas), key=lambda o: o.key)

    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error."""
        path = _checked(key)
        try:
            obstore.delete(self._store, path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._error("delete", key, exc) from None

    def _missing(self, op: str, key: str, exc: Exception) -> None:
        """A missing key is not an error (the caller returns ``None``); a missing bucket is."""
        if "NoSuchBucket" in str(exc):
            raise self._error(op, key, exc) from None

    def _error(self, op: str, key: str, exc: Exception) -> FleetError:
        """The named error for a client exception; its text is redacted and cut short."""
        text = self.cfg.redact(str(exc).split("\n\nDebug source")[0])   # cut obstore's dump, then redact
        text = " ".join(text.split())[:600]
        where = f"{op} {self.cfg.location(key)}"
        if isinstance(exc, (obx.AlreadyExistsError, obx.PreconditionError)):
            return PreconditionFailed(f"{where}: precondition failed (the key exists or its etag moved)")
        if isinstance(exc, (obx.PermissionDeniedError, obx.UnauthenticatedError)):
            return FleetError(f"{where}: access denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY): {text}")
        if isinstance(exc, ValueError):
            return FleetError(f"{where}: {text}")
        if "NoSuchBucket" in text:
            return FleetError(f"{where}: the bucket {self.cfg.bucket!r} does not exist: {text}")
        status = _STATUS.search(text)
        code = int(status.group(1)) if status else None
        if code in (401, 403):  # obstore reports a refused list as a GenericError with the status
            return FleetError(f"{where}: access denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY): {text}")
        if isinstance(exc, (obx.GenericError, OSError)) and (code is None or code >= 500 or code in (408, 429)):
            return StoreUnavailable(f"{where}: store unavailable: {text}")
        return FleetError(f"{where}: {text}")


def _checked(key: str) -> str:
    """``key`` if it is a valid relative key (no leading/trailing ``/``, no empty, ``.`` or
    ``..`` segment, no control character); else ``ValueError`` (a caller's bug)."""
    if not isinstance(key, str) or not key or any(s in ("", ".", "..") for s in key.split("/")) \
            or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(f"invalid object key {key!r}")
    return key
