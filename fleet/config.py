"""Where the fleet's store is: ``s3://BUCKET/PREFIX`` plus the standard AWS environment.

The URL comes from ``FLYWHEEL_STORE`` or the config file's ``store`` key (the same
string, surrounding blanks and a trailing ``/`` allowed). The endpoint, region and
credentials come only from the environment, as every S3 tool reads them:
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (``http://`` allowed, for on-prem and
tests; unset means AWS itself), ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (default
``us-east-1``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and the optional
``AWS_SESSION_TOKEN``.

No credential ever appears in ``repr``/``str`` or in a message built here; run any
text that may echo a request through :meth:`StoreConfig.redact`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from flywheel.fleet.errors import StoreConfigError

__all__ = ["CREDENTIAL_VARS", "StoreConfig"]

#: The environment variables that hold secrets (their values are never shown).
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
DEFAULT_REGION = "us-east-1"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class StoreConfig:
    """A parsed store location; build it with :meth:`parse`."""

    bucket: str
    prefix: str                    # "" or "a/b" (no leading or trailing "/")
    endpoint: str | None           # None: AWS's regional endpoint
    region: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str | None, env: Mapping[str, str] = os.environ) -> StoreConfig:
        """Parse ``s3://BUCKET[/PREFIX]`` and read the rest from ``env``.

        Raises :class:`StoreConfigError` for a URL that is not ``s3://`` with a valid
        bucket, an endpoint that is not ``http(s)://host``, or missing credentials (the
        message names the missing variables, never a value)."""
        bucket, prefix = _split_url(url)
        endpoint = _endpoint(env)
        missing = [v for v in CREDENTIAL_VARS[:2] if not (env.get(v) or "").strip()]
        if missing:
            raise StoreConfigError(f"s3://{bucket}: missing credentials: set {' and '.join(missing)} "
                                   "in the environment (credentials are read only from there)")
        return cls(bucket=bucket, prefix=prefix, endpoint=endpoint,
                   region=(env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION).strip(),
                   access_key_id=env["AWS_ACCESS_KEY_ID"], secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                   session_token=env.get("AWS_SESSION_TOKEN") or None)

    @property
    def url(self) -> str:
        """``s3://bucket/prefix`` (``s3://bucket`` without a prefix)."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def location(self, key: str) -> str:
        """The full ``s3://`` address of ``key`` (relative to the prefix), for messages."""
        return f"{self.url}/{key}" if key else self.url

    def redact(self, text: str) -> str:
        """``text`` with every credential value (also URL-encoded) replaced by ``***``."""
        secrets = {s for v in (self.access_key_id, self.secret_access_key, self.session_token) if v
                   for s in (v, quote(v, safe=""))}
        for s in sorted(secrets, key=len, reverse=True):
            text = text.replace(s, "***")
        return text

    def __str__(self) -> str:
        return f"{self.url} at {self.endpoint or 'AWS'} ({self.region})"


def _split_url(url: str | None) -> tuple[str, str]:
    text = (url or "").strip()
    if not text:
        raise StoreConfigError("no store configured: set FLYWHEEL_STORE or the config key 'store' to "
                               "s3://BUCKET/PREFIX")
    parts = urlsplit(text)
    shown = re.sub(r"//[^/@]*@", "//***@", text)  # never echo user info
    if parts.scheme.lower() != "s3":
        raise StoreConfigError(f"store must be an s3://BUCKET/PREFIX URL, got {shown!r}")
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise StoreConfigError(f"store URL {shown!r}: no user, query or fragment allowed (credentials "
                               "come from the environment)")
    bucket = parts.netloc
    if not bucket:
        raise StoreConfigError(f"store URL {shown!r} has no bucket: use s3://BUCKET/PREFIX")
    if not _BUCKET.fullmatch(bucket):
        raise StoreConfigError(f"store URL {shown!r}: {bucket!r} is not a valid bucket name "
                               "(3-63 of a-z, 0-9, '.', '-')")
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        raise StoreConfigError(f"store URL {shown!r}: the prefix has an empty, '.' or '..' segment")
    return bucket, "/".join(segments)


def _endpoint(env: Mapping[str, str]) -> str | None:
    name = "AWS_ENDPOINT_URL_S3" if env.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
    value = (env.get(name) or "").strip().rstrip("/")
    if not value:
        return None
    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # not a number, or out of range
        port_ok = False
    if not (port_ok and parts.scheme in ("http", "https") and parts.hostname and "@" not in parts.netloc):
        raise StoreConfigError(f"{name} must be http(s)://HOST[:PORT] without user info, got "
                               f"{parts.scheme or '?'}://{parts.hostname or '?'}...")
    return value
