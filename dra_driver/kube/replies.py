"""The API server's replies, read: JSON bodies, watch events, and errors as the port's.

Why it exists apart from :mod:`dra_driver.kube.client` (which request goes where): decoding a
reply is the same over the lean transport and through the library, and every way one can go
wrong — not JSON (the wrong server: an HTML page named by its title), a non-2xx status (the
port's :class:`~dra_driver.kube.api.ApiError` family with the server's ``Status`` message), a
watch that broke off or went silent — must end as one clear error, never a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

from dra_driver.kube import api, transport


def events(
    chunks: Iterator[bytes], silence: float, what: str, release: Callable[[], None]
) -> Iterator[api.WatchEvent]:
    """The watch events in a streamed body's ``chunks`` (one JSON object a line); a read
    silent past ``silence`` seconds or a connection that broke off ends it with
    :class:`~dra_driver.kube.api.ApiError` (status 0); ``release`` is called at the end."""
    buffer = b""
    try:
        for chunk in chunks:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield event(line, what)
        if buffer.strip():
            yield event(buffer, what)
    except Exception as exc:
        if timed_out(exc):
            raise api.ApiError(
                0, f"watch of {what} silent for {silence:g}s: connection presumed dead"
            ) from exc
        if isinstance(exc, api.ApiError) or not broken(exc):
            raise
        raise api.ApiError(0, f"watch of {what} broke off: {exc}") from exc
    finally:
        release()


def timed_out(exc: BaseException) -> bool:
    """A watch read that waited past its timeout (our transport's, or urllib3's)."""
    if isinstance(exc, transport.TransportError):
        return exc.timed_out
    return type(exc).__name__ == "ReadTimeoutError"


def broken(exc: BaseException) -> bool:
    """A connection that broke off: ours, an OSError, or any of urllib3's HTTP errors."""
    if isinstance(exc, transport.TransportError | OSError):
        return True
    return any(
        c.__module__.startswith("urllib3") and c.__name__ == "HTTPError" for c in type(exc).__mro__
    )


def decoded(status: int, data: bytes, method: str, path: str) -> api.Obj:
    try:
        decoded = json.loads(data) if data else {}
    except ValueError as exc:
        raise api.ApiError(
            status, f"{method} {path}: not a Kubernetes API server: {not_json(data)}"
        ) from exc
    if not isinstance(decoded, dict):
        raise api.ApiError(status, f"{method} {path}: reply is not a JSON object")
    return decoded


def event(line: bytes, what: str) -> api.WatchEvent:
    try:
        raw = json.loads(line)
        return api.WatchEvent(raw["type"], raw["object"])
    except (ValueError, KeyError, TypeError) as exc:
        raise api.ApiError(0, f"watch of {what} sent an unreadable event: {exc}") from exc


def error(method: str, path: str, status: int, data: bytes) -> api.ApiError:
    """The port's error for a non-2xx reply, with the server's Status message."""
    message, reason = "", ""
    try:
        body = json.loads(data) if data else {}
        if isinstance(body, dict):
            message, reason = str(body.get("message") or ""), str(body.get("reason") or "")
    except ValueError:  # a proxy's or another web server's page, not a Kubernetes Status
        message = f"not a Kubernetes API server: {not_json(data)}"
    text = message or f"{method} {path}: HTTP {status}"
    if status == 404:
        return api.NotFound(text)
    if status == 409:
        return api.Conflict(text, reason=reason or "Conflict")
    if status in (400, 422):
        return api.Invalid(text, status=status)
    return api.ApiError(status, text, reason=reason)


def not_json(data: bytes) -> str:
    """One line saying what a reply that is not JSON is (an HTML page and its title, or its
    first line), never the body itself: an operator pointed us at the wrong server."""
    text = data[:4096].decode(errors="replace")
    title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
    if title:
        name = " ".join(title.group(1).split())[:80]
        return f"the reply is an HTML page titled {name!r}"
    if re.match(r"\s*<", text):
        return "the reply is an HTML or XML page"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"the reply is not JSON: {first[:80]!r}" if first else "the reply is empty"
