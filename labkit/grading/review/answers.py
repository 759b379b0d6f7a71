"""The class's written answers, as the review page shows them: found in OUT/writeups/, numbered so that a TA
grades without names, and drawn as inert HTML.

A write-up is the student's text (labkit/grading/intake/writeups.py writes it inside a fence). Everything
read here is the student's word: a link, a folder that is not one, a file larger than MAX_BYTES is not
followed or read whole; the text is drawn by markdown-it with HTML off (a tag is shown as text), and what
it draws goes through nh3 with a short list of tags, no attribute but a link's address, and only http,
https and mailto addresses. Images are not drawn at all.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import nh3
from markdown_it import MarkdownIt

FOLDER = "writeups"  # OUT/writeups/<student>/lab-<N>.md
MAX_BYTES = 256_000  # a write-up larger than this is shown cut, and says so
_NAME = re.compile(r"lab-(\d{1,3})\.md")
_FENCED = re.compile(r"\A```text\n(.*)\n```(\n\n\(cut at .*\))?\s*\Z", re.S)
TAGS = {
    *("p", "br", "hr", "em", "strong", "code", "pre", "blockquote"),
    *("ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "a"),
    *("table", "thead", "tbody", "tr", "th", "td"),
}


@dataclass(frozen=True)
class Answer:
    lab: int
    student: str
    number: int  # its place among the lab's answers, 1 first: what the page shows instead of a name
    path: Path


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as found:
            return sorted(found, key=lambda e: e.name)
    except OSError:
        return []


def _is_student(name: str) -> bool:
    """A folder a grading run could have named for a student (collect's rule: any name but a hidden one)."""
    return not name.startswith(".") and name.isprintable() and len(name) <= 200


def find(out: Path) -> dict[int, list[Answer]]:
    """lab -> its answers, in the order the page shows them: by a digest of student and lab, so that the
    order says nothing of a name, and the same on every start."""
    found: dict[int, list[tuple[str, str, Path]]] = {}
    for student in _entries(Path(out) / FOLDER):
        if not student.is_dir(follow_symlinks=False) or not _is_student(student.name):
            continue
        for entry in _entries(Path(student.path)):
            match = _NAME.fullmatch(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                lab = int(match.group(1))
                key = hashlib.sha256(f"{lab}/{student.name}".encode()).hexdigest()
                found.setdefault(lab, []).append((key, student.name, Path(entry.path)))
    return {
        lab: [Answer(lab, s, n, p) for n, (_, s, p) in enumerate(sorted(rows), 1)]
        for lab, rows in sorted(found.items())
    }


def read(path: Path) -> tuple[str, bool]:
    """The text of a write-up (at most MAX_BYTES, never through a link) and whether it was cut."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return f"(this write-up cannot be read: {e.strerror})", False
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    return data[:MAX_BYTES].decode("utf-8", errors="replace"), len(data) > MAX_BYTES


def body(text: str) -> str:
    """The student's words in a write-up file: without its first line (it names the student) and without the
    fence the grading run put around them."""
    if text.startswith("# "):
        text = text.partition("\n")[2].lstrip("\n")
    fenced = _FENCED.match(text)
    return fenced.group(1) + (fenced.group(2) or "") if fenced else text


_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table").disable("image")


def html(words: str) -> str:
    """The answer drawn as HTML that can run nothing: markdown without raw HTML, then nh3's sanitiser."""
    return nh3.clean(
        _MARKDOWN.render(words),
        tags=TAGS,
        attributes={"a": {"href"}},
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
