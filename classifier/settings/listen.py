"""Addresses a server listens on, checked before it tries: a port is a whole number from 0
to :data:`MAX_PORT` (never taken modulo 65536, as the socket layer would), and a host:port
is bound and released once so that a taken port or a foreign host is one line, not a
traceback. The sidecar (``--address``, ``--metrics-port``) and ``flywheel ui`` (``--host``,
``--port``) share it; the teacher's host setting is checked by :mod:`~classifier.settings.config`.
"""

from __future__ import annotations

from typing import Any

from flywheel.classifier.errors import ConfigError

__all__ = ["MAX_PORT", "check_listen", "check_port", "split_address"]

#: The highest port a TCP address may name (0: any free port, where something listens).
MAX_PORT = 65535


def check_port(port: object, what: str) -> int:
    """``port`` as a whole number from 0 to :data:`MAX_PORT`, else a one-line
    :class:`ConfigError` naming ``what`` (the flag, key or variable it came from) and the
    value: a port outside the range is refused, never taken modulo 65536 as the socket
    layer would (``:99999`` listened on port 34463)."""
    text = port.strip() if isinstance(port, str) else None
    if isinstance(port, int) and not isinstance(port, bool):
        value = port
    elif text is not None and text.isascii() and text.isdigit():
        value = int(text)
    else:
        raise ConfigError(f"{what}: port {port!r} is not a whole number from 0 to {MAX_PORT}")
    if not 0 <= value <= MAX_PORT:
        raise ConfigError(f"{what}: port {value} is out of range (0 to {MAX_PORT})")
    return value


def split_address(address: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT``) as ``(host, port)``, the port checked by
    :func:`check_port`; a :class:`ConfigError` naming ``what`` and the address otherwise."""
    host, sep, port_text = str(address).strip().rpartition(":")
    if not sep or not port_text:
        raise ConfigError(f"cannot listen on {address!r} ({what}): expected host:port")
    return host, check_port(port_text, f"{what} {address}")


def check_listen(host: str, port: object, what: str | None = None, *, shown: str | None = None) -> None:
    """Raise a one-line :class:`ConfigError` when a TCP server cannot listen on ``host:port``
    here, before it tries (and before anything slow is loaded): the port out of range, the
    host unknown or not an address of this machine, the port taken (``address already in use
    (port N: another process listens there)``) or the system's reason. Bound and released as
    grpc and :mod:`http.server` bind (address reuse on, IPv6 dual-stack); like them, one
    address of the host that binds is enough. Port 0 (any free port): only the host is
    checked. ``what`` (the flags) and ``shown`` (the address as given) go into the message."""
    import errno
    import socket

    port = check_port(port, what or "port")
    where = shown or (f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}")
    where += f" ({what})" if what else ""
    try:
        found = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(f"cannot listen on {where}: unknown host ({reason})") from None
    errors = [e for e in (_try_bind(family, addr) for family, _, _, _, addr in found) if e is not None]
    if len(errors) < len(found):
        return
    if any(e.errno == errno.EADDRINUSE for e in errors):
        raise ConfigError(f"cannot listen on {where}: address already in use (port {port}: another process "
                          "listens there)")
    if any(e.errno == errno.EADDRNOTAVAIL for e in errors):
        raise ConfigError(f"cannot listen on {where}: {host} is not an address of this machine")
    raise ConfigError(f"cannot listen on {where}: {errors[0].strerror or errors[0]}")


def _try_bind(family: int, addr: Any) -> OSError | None:
    """Bind (and release) a socket as grpc and http.server would (address reuse on, IPv6
    dual-stack)."""
    import socket

    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
    except OSError as exc:
        return exc
    return None
