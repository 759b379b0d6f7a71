"""The scoreboard in markdown: the class summary (pass rates, the multi-device bugs most often hit,
points, the leaderboards) and each student's feedback.
"""

from __future__ import annotations

import re

from markupsafe import Markup

from labkit.grading.publish import context


def _md(text) -> str:
    """Text from a submission, safe inside a Markdown table cell: markup is escaped with backslashes, which
    Markdown shows as the characters themselves (an HTML entity would read as `&lt;` in a plain-text view)."""
    return (
        str(text)
        .replace("\\", "\\\\")
        .replace("|", "\\|")
        .replace("<", "\\<")
        .replace(">", "\\>")
        .replace("`", "\\`")
        .replace("\r", " ")
        .replace("\n", " ")
    )


def _finalize(value) -> str:
    """Every {{ }} of a Markdown template: escaped, but for text a filter marked as already safe (Markup)."""
    if value is None:
        return ""
    return str(value) if isinstance(value, Markup) else _md(value)


def _code(text) -> Markup:
    """Text inside a ``` fence: shown as is, with no backtick that could close the fence."""
    return Markup(str(text).replace("`", "'"))


_TEMPLATES = None


def _templates():
    """The Markdown templates (labkit/grading/publish/templates/*.md.j2): every value escaped for Markdown."""
    global _TEMPLATES
    if _TEMPLATES is None:
        from jinja2 import Environment, PackageLoader, StrictUndefined

        _TEMPLATES = Environment(
            loader=PackageLoader("labkit.grading.publish", "templates"),
            autoescape=False,
            finalize=_finalize,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        _TEMPLATES.filters["code"] = _code
    return _TEMPLATES


def to_markdown(results: dict) -> str:
    """The class summary (templates/scoreboard.md.j2), from the data scoreboard.html draws (context.klass)."""
    text = _templates().get_template("scoreboard.md.j2").render(k=context.klass(results))
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def feedback(results: dict, student: str) -> str:
    """What one student is told (labkit/grading/publish/context.py's context, the HTML page's): public tests with their
    messages, hidden tests by name and outcome only, each lab's points, late penalty and adjustments."""
    text = _templates().get_template("feedback.md.j2").render(f=context.feedback(results, student))
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
