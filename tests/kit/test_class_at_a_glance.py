"""The class at a glance, on a small class: each test's failure rate per configuration and the
submissions to look at together, kept by the grading run's own collection code and drawn into the
scoreboard's page, rendered in headless Chromium (a screenshot is kept in build/test-artifacts/).

No notebook is run: the submissions are real notebooks collected as `grade` collects them, and the
rows of their grading are written by hand.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_scoreboard import one_device_bug, passing, render, row

from labkit.course import catalog
from labkit.grading.classwide import similarity
from labkit.grading.intake import handin
from labkit.grading.publish import merge as merging
from labkit.grading.publish import scoreboard

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("LABKIT_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
LAB = catalog.Lab(3)


def solved() -> dict:
    """Lab 3's reference as a student hands it in: the solutions without the authoring markers."""
    nb = json.loads(LAB.reference.read_text())
    for cell in nb["cells"]:
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        cell["source"] = "\n".join(
            ln for ln in text.splitlines() if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln
        )
    return nb


def renamed(nb: dict) -> dict:
    """The same code with the student's own names changed, a comment and blank lines added."""
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            text = re.sub(r"\bmesh\b(?!=)", "m", cell["source"])
            text = re.sub(r"\bdouble\b", "twice", text)
            cell["source"] = text.replace("\n    return", "\n\n    # the result\n    return")
    return nb


@pytest.fixture(scope="module")
def klass(tmp_path_factory) -> tuple[dict, Path]:
    """ann and ben hand in the same file, cy ann's code renamed, dee the handout, eve her own code; scoreboard written."""
    tmp = tmp_path_factory.mktemp("class")
    subs, out = tmp / "submissions", tmp / "out"
    answer = json.dumps(solved(), indent=1)
    own = solved()
    for cell in own["cells"]:
        if cell["cell_type"] == "code" and cell["source"].startswith("def shard_map_double"):
            cell["source"] = (
                "def shard_map_double(x):\n    n = len(jax.devices())\n    pieces = jnp.split(x, n)\n"
                "    out = [jax.device_put(2 * p, d) for p, d in zip(pieces, jax.devices())]\n"
                "    return jnp.concatenate([jax.device_get(o) for o in out])\n"
            )
    for student, text in (
        ("ann", answer),
        ("ben", answer),
        ("cy", json.dumps(renamed(solved()))),
        ("dee", LAB.student.read_text()),
        ("eve", json.dumps(own)),
    ):
        (subs / student).mkdir(parents=True)
        (subs / student / "lab-3.ipynb").write_text(text)
    found, times = handin.submissions_of(subs, out, None, io.StringIO())
    students = sorted(found.students)
    handed = handin.keep(out, found, students, [LAB], times)
    similarity.add_fingerprints(handed, found.students, [LAB])
    rows = []
    for s in students:
        rows += [
            passing(s, "cpu-1"),
            one_device_bug(s, "cpu-8") if s in ("cy", "eve") else passing(s, "cpu-8"),
        ]
    rows[-2:] = [
        row("eve", c, [], status="error", message="the run ended with error") for c in ("cpu-1", "cpu-8")
    ]
    results = {
        "format": 1,
        "labs": [{"number": 3, "name": "lab-3", "title": "Lab 3 · shard_map basics"}],
        "configs": [
            {"name": "cpu-1", "summary": "one CPU device", "devices": 1},
            {"name": "cpu-8", "summary": "eight simulated CPU devices", "devices": 8},
        ],
        "students": {s: {"notes": []} for s in students},
        "notes": [],
        "rows": rows,
    }
    for (student, lab), info in handed.items():
        results["students"][student].setdefault("submissions", {})[str(lab)] = info
    scoreboard.write(results, out)
    return results, out


def test_grading_keeps_each_submissions_fingerprint_in_the_results(klass):
    results, _ = klass
    code = {s: info["submissions"]["3"]["code"] for s, info in results["students"].items()}
    assert code["dee"] == {"normalised": "", "shingles": []}  # the handout, unchanged: nothing of her own
    assert len(code["ann"]["shingles"]) >= similarity.MIN_SHINGLES
    assert code["ann"] == code["ben"] == code["cy"] != code["eve"]


def test_the_json_lists_the_pairs_to_look_at_together(klass):
    _, out = klass
    shown = json.loads((out / "scoreboard.json").read_text())
    assert [(p["students"], p["how"]) for p in shown["similar"]] == [
        (["ann", "ben"], "byte-identical"),
        (["ann", "cy"], "identical after normalising"),
        (["ben", "cy"], "identical after normalising"),
    ]
    assert [t["test"] for t in shown["failure_rates"][0]["tests"]] == [
        "test_doubles",
        "test_is_split",
        "test_hidden_block",
    ]


def test_a_merged_class_lists_the_pairs_found_across_its_shards(klass):
    results, _ = klass
    halves = [
        {
            **results,
            "students": {s: v for s, v in results["students"].items() if (s in ("ann", "cy")) == first},
            "rows": [r for r in results["rows"] if (r["student"] in ("ann", "cy")) == first],
        }
        for first in (True, False)
    ]
    assert all(similarity.pairs(h) != similarity.pairs(results) for h in halves)
    merged = merging.merge([json.loads(scoreboard.to_json(h)) for h in halves])
    assert json.loads(scoreboard.to_json(merged))["similar"] == similarity.pairs(results)


SHOT = ARTIFACTS / "scoreboard-class-at-a-glance.png"


def screenshot(page: Path, profile: Path) -> None:
    """The top of the page as Chromium draws it (distribution, failure rates, pairs), kept in SHOT."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed: `make system-deps` installs it (.ci/apt-packages.txt)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    SHOT.unlink(missing_ok=True)
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--window-size=1200,1500",
            f"--screenshot={SHOT}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert SHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and SHOT.stat().st_size > 20_000


@pytest.fixture(scope="module")
def page(klass, tmp_path_factory):
    """The class page rendered by headless Chromium (its DOM), with a screenshot kept for a person to look at."""
    _, out = klass
    screenshot(out / "scoreboard.html", tmp_path_factory.mktemp("shot") / "profile")
    return render(out / "scoreboard.html", tmp_path_factory.mktemp("chromium"))


def test_the_page_draws_each_tests_failure_rate_per_configuration(page):
    tables = [e for e in page.elements if e[0] == "table" and "failrates" in e[1].get("class", "")]
    assert len(tables) == 1
    start = page.elements.index(tables[0])
    rates, marked, test = {}, set(), None
    for tag, attrs, _ in page.elements[start + 1 :]:
        if tag == "table":
            break
        if tag == "tr" and "data-test" in attrs:
            test = attrs["data-test"]
            if "several-only" in attrs.get("class", ""):
                marked.add(test)
        if tag == "td" and "data-config" in attrs:
            rates[test, attrs["data-config"]] = attrs.get("data-rate")
    # eve's runs died: no verdict on any test; cy fails two tests on eight devices that pass on one
    assert rates["test_is_split", "cpu-1"] == "0.0" and rates["test_is_split", "cpu-8"] == "0.25"
    assert rates["test_doubles", "cpu-8"] == "0.0"
    assert marked == {"test_is_split", "test_hidden_block"}
    bars = [e for e in page.elements[start:] if e[0] == "rect" and e[1].get("class") == "failed"]
    assert bars and all(int(b[1]["width"]) > 0 for b in bars)


def test_the_page_lists_the_submissions_to_look_at_together_in_neutral_words(page):
    table = next(e for e in page.elements if e[0] == "table" and e[1].get("id") == "similar")
    listed = [
        (e[1]["data-how"], re.findall(r"ann|ben|cy|dee|eve", e[2]))
        for e in page.elements
        if e[0] == "tr" and "data-how" in e[1]
    ]
    assert listed == [
        ("byte-identical", ["ann", "ben"]),
        ("identical after normalising", ["ann", "cy"]),
        ("identical after normalising", ["ben", "cy"]),
    ]
    section = "".join(page.text)
    assert "look at together" in section and "dee" not in table[2] and "eve" not in table[2]
    assert not re.search(r"plagiari|cheat|copied|suspicious|misconduct", section, re.IGNORECASE)
