"""Who may reach the review page, and what every answer carries: the gate in front of the app.

A request is answered only where it comes from the loopback address, names this server as its host (so a
page of another site that rebinds a name to 127.0.0.1 reaches nothing), and carries the token: in the
address the command printed (`?token=`, then traded for a cookie of this server only, and the address
shown again without it) or in that cookie. A POST must also come from the page's own origin. Every
answer says that the page runs only its own script and style, loads nothing from elsewhere and is never
framed or cached.

What the page reads of a grading run that ran a student's code (an executed notebook in OUT/work/) is read with
`read_below`: each step of its path a folder of its own below the output folder, never a link, never `..`.
"""

from __future__ import annotations

import errno
import hmac
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "labkit_review"
LOOPBACK = frozenset({"127.0.0.1", "::1"})
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "content-security-policy": POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # no-referrer would make a form's Origin "null"
    "x-frame-options": "DENY",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


@dataclass(frozen=True)
class Gate:
    token: str
    hosts: frozenset[str]  # the Host headers this server answers to: 127.0.0.1:PORT, localhost:PORT
    clients: frozenset[str] = LOOPBACK

    def origins(self) -> set[str]:
        return {f"http://{h}" for h in self.hosts}

    def cookie(self) -> str:
        """The cookie's name: its own for each start, since a browser's cookies for 127.0.0.1 are shared by
        every port."""
        return f"{COOKIE}_{hmac.new(self.token.encode(), b'cookie', 'sha256').hexdigest()[:12]}"

    def csrf(self) -> str:
        """The value each form sends back (bound to the token, so it changes with every start)."""
        return hmac.new(self.token.encode(), b"review form", "sha256").hexdigest()[:32]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


class Guard:
    """ASGI middleware: refuses what Gate does not let through, and adds HEADERS to every answer."""

    def __init__(self, app: ASGIApp, gate: Gate):
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in HEADERS.items():
                    headers[key] = value
            await send(message)

        refusal, cookie = self._refusal(scope)
        if refusal:
            await _answer(with_headers, 403, refusal)
        elif cookie:
            query = urlencode(
                [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode()) if k != "token"]
            )
            where = scope["path"] + (f"?{query}" if query else "")
            extra = [(b"set-cookie", cookie.encode()), (b"location", where.encode())]
            await _answer(with_headers, 303, "", extra)
        else:
            await self.app(scope, receive, with_headers)

    def _refusal(self, scope: Scope) -> tuple[str, str]:
        """(why the request is refused, or ''; the cookie to set where the address carried the token)."""
        client = (scope.get("client") or ("", 0))[0]
        if client not in self.gate.clients:
            return "the review page answers only on this machine's loopback address", ""
        if _header(scope, b"host") not in self.gate.hosts:
            return "the review page answers only to the address its command printed", ""
        given = dict(parse_qsl(scope.get("query_string", b"").decode())).get("token")
        cookies = SimpleCookie(_header(scope, b"cookie") or "")
        name = self.gate.cookie()
        held = cookies[name].value if name in cookies else None
        ok = any(
            t is not None and hmac.compare_digest(t.encode(), self.gate.token.encode()) for t in (given, held)
        )
        if not ok:
            return "open the page at the address `make review` printed: it carries the page's token", ""
        if scope["method"] not in ("GET", "HEAD", "POST"):
            return "the review page takes GET and POST only", ""
        if scope["method"] == "POST" and _header(scope, b"origin") not in self.gate.origins():
            return "a form of another site cannot save points here", ""
        if given is not None and scope["method"] == "GET":
            return "", f"{name}={self.gate.token}; HttpOnly; SameSite=Strict; Path=/"
        return "", ""


async def _answer(
    send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class NotBelow(OSError):
    """A path the page does not read: a step that is a link, not a folder, or not one name."""


def read_below(root: Path, steps: Sequence[str], limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of the file at `root`/steps[0]/.../steps[-1], and whether there was more.
    Each step is opened from the one before without following a link (so a link anywhere, or a step such as
    `..`, is refused: NotBelow), and the file is opened without blocking (a FIFO put in its place hangs
    nothing). FileNotFoundError where a step is not there."""
    for step in steps:
        if not step or step in (".", "..") or "/" in step or "\0" in step:
            raise NotBelow(f"{step!r} is not one name")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n, step in enumerate(steps, 1):
            below = _step(fd, step, os.O_NONBLOCK if n == len(steps) else os.O_DIRECTORY)
            os.close(fd)
            fd = below
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotBelow(f"{steps[-1]} is not a file")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    return data[:limit], len(data) > limit


def _step(fd: int, name: str, flags: int) -> int:
    """`name` opened below the folder `fd`, never through a link."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | flags, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotBelow(f"{name} is a link or not a folder") from None
        raise
