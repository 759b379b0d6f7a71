"""Hints come in tiers, and the last tier is never the answer: no hint of a lab's reference quotes its
solution, and none calls itself the answer."""

import json
import re

import pytest

from labkit.course import catalog

HINT = re.compile(r"<summary>(?P<title>Hint (?P<tier>\d)[^<]*)</summary>(?P<body>.*?)</details>", re.S)
SPAN = re.compile(r"`([^`]+)`")


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def solution_lines(cells) -> set[str]:
    """Every line between `### BEGIN SOLUTION` and `### END SOLUTION`, whitespace removed, if long enough
    to be more than a name."""
    found = set()
    for cell in cells:
        inside = False
        for line in "".join(cell["source"]).splitlines():
            if "### BEGIN SOLUTION" in line:
                inside = True
            elif "### END SOLUTION" in line:
                inside = False
            elif inside and len(squeezed(line)) >= 16 and not line.strip().startswith("#"):
                found.add(squeezed(line))
    return found


def last_hints(cells):
    """(title, body) of the last hint of each group of hints."""
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        hints = list(HINT.finditer("".join(cell["source"])))
        if hints:
            yield hints[-1].group("title"), hints[-1].group("body")


@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.name)
def test_the_last_hint_of_every_exercise_quotes_no_line_of_its_solution(lab):
    cells = json.loads(lab.reference.read_text())["cells"]
    solution = solution_lines(cells)
    for title, body in last_hints(cells):
        assert "answer" not in title.lower(), f"{lab.name}: '{title}' names itself the answer"
        for span in SPAN.findall(body):
            quoted = [line for line in solution if len(squeezed(span)) >= 16 and squeezed(span) in line]
            assert not quoted, f"{lab.name}: '{title}' quotes the solution: `{span}`"
        for line in solution:
            assert line not in squeezed(body), f"{lab.name}: '{title}' holds a line of the solution: {line}"


def test_the_rule_catches_a_hint_that_spells_out_the_solution():
    cells = [
        {
            "cell_type": "code",
            "source": [
                "def f(x):\n",
                "    ### BEGIN SOLUTION\n",
                "    return jax.lax.psum(jnp.sum(x), 'data')\n",
                "    ### END SOLUTION\n",
            ],
        },
        {
            "cell_type": "markdown",
            "source": [
                "<details><summary>Hint 1 (a nudge)</summary>\n\nAdd up.\n</details>\n",
                "<details><summary>Hint 2 (the API)</summary>\n\n"
                "`return jax.lax.psum(jnp.sum(x), 'data')`\n</details>\n",
            ],
        },
    ]
    ((title, body),) = last_hints(cells)
    assert title.startswith("Hint 2")
    assert any(squeezed(span) in line for span in SPAN.findall(body) for line in solution_lines(cells))
