"""`python -m labkit review OUT` (`make review`): serve the review page of a grading output folder.

It listens on 127.0.0.1 only, on a free port (or --port), and prints the page's address with a token made
at this start, as Jupyter does; a request without it is refused. The points are written as they are
given, so stopping the server (Ctrl-C) loses nothing.
"""

from __future__ import annotations

import getpass
import secrets
import socket
import sys
from pathlib import Path

from labkit.exitcodes import ExitCode
from labkit.grading.review.guard import Gate
from labkit.grading.state import course as course_mod

HOST = "127.0.0.1"


def add_parser(sub) -> None:
    review = sub.add_parser(
        "review", help="grade the class's written answers by rubric, in a browser, on this machine (TAs)"
    )
    review.add_argument("out", type=Path, help="the grading output folder (make grade's OUT)")
    review.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free one)")
    review.add_argument(
        "--ta", default=None, help="your name, kept with every point you give (default: your login)"
    )
    review.set_defaults(func=_review)


def listening(port: int) -> socket.socket:
    """A socket bound to the loopback address (`port`, or a free one where 0)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)  # from here a browser's request waits for the server, never meets a refusal
    return sock


def _review(args) -> int:
    import uvicorn

    from labkit.grading.review import app

    out = Path(args.out).absolute()
    if not out.is_dir():
        print(f"review: {args.out} is not a folder: give make grade's OUT", file=sys.stderr)
        return ExitCode.REFUSED
    if (out / course_mod.FOLDER).is_symlink():
        print(
            f"review: {out / course_mod.FOLDER} is a link: the review writes only inside {out}",
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    try:
        sock = listening(args.port)
    except OSError as e:
        print(
            f"review: cannot listen on {HOST}:{args.port} ({e.strerror}): leave PORT= out for a free port",
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    gate = Gate(token, frozenset({f"{HOST}:{port}", f"localhost:{port}"}))
    who = args.ta or getpass.getuser()
    print(f"Review the written answers of {out} (as {who}); open in a browser on this machine:", flush=True)
    print(f"    http://{HOST}:{port}/?token={token}", flush=True)
    print("Points are saved as you give them; Ctrl-C stops the server.", flush=True)
    config = uvicorn.Config(app.make(out, gate, who), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return ExitCode.OK
