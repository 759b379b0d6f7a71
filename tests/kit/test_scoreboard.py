"""The scoreboard as a pure function of results: csv, json, markdown, feedback, html (rendered in Chromium), merge.

Results here are written by hand, in the shape `grade` produces, so that every test runs in
well under a second except the one that renders the page in headless Chromium, and the one
that draws a student's own `make lab-3` run.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from notebook_variants import LAB_3_PUBLIC_TESTS

from labkit.course import catalog
from labkit.grading.classwide import failrates, spread
from labkit.grading.classwide import results as results_mod
from labkit.grading.publish import markdown, pages, scoreboard
from labkit.grading.publish import merge as merging
from labkit.grading.running import ownresults
from labkit.student import report as own

EVIL = "<img src=x onerror=\"document.title='pwned'\">"
SCRIPT = "<script>document.body.setAttribute('data-pwned','yes')</script>"
HIDDEN_SECRET = "expected [1.5, 2.5, 3.5] on the hidden input"


def outcome(name, status, message="", hidden=False):
    return {
        "test": f"test_{name}",
        "exercise": "shard_map_double",
        "file": "t.py",
        "hidden": hidden,
        "status": status,
        "message": message,
    }


def row(student, config, tests, status=None, message="", cell_errors=(), notes=(), lab=3):
    counted = [t for t in tests if t["status"] != "skipped"]
    passed = sum(t["status"] == "passed" for t in counted)
    return {
        "student": student,
        "lab": lab,
        "config": config,
        "status": status or ("ok" if passed == len(counted) else "failed"),
        "passed": passed,
        "total": len(counted),
        "message": message,
        "tests": list(tests),
        "cell_errors": list(cell_errors),
        "notes": list(notes),
    }


def passing(student, config):
    return row(
        student,
        config,
        [
            outcome("doubles", "passed"),
            outcome("is_split", "passed"),
            outcome("hidden_block", "passed", hidden=True),
        ],
    )


def one_device_bug(student, config):
    return row(
        student,
        config,
        [
            outcome("doubles", "passed"),
            outcome("is_split", "failed", "expected the result on all 8 devices, but it lives on 1"),
            outcome("hidden_block", "failed", HIDDEN_SECRET, hidden=True),
        ],
        message="2 of 3 tests did not pass",
    )


def make_results(students: dict[str, dict[str, dict]], notes=()) -> dict:
    rows = [r for s in sorted(students) for r in students[s].values()]
    return {
        "format": 1,
        "labs": [{"number": 3, "name": "lab-3", "title": "Lab 3 · shard_map basics"}],
        "configs": [
            {"name": "cpu-1", "summary": "one CPU device", "devices": 1},
            {"name": "cpu-8", "summary": "eight simulated CPU devices", "devices": 8},
        ],
        "students": {s: {"notes": []} for s in sorted(students)},
        "notes": list(notes),
        "rows": rows,
    }


@pytest.fixture
def results() -> dict:
    return make_results(
        {
            "alice": {"cpu-1": passing("alice", "cpu-1"), "cpu-8": passing("alice", "cpu-8")},
            "bob": {"cpu-1": passing("bob", "cpu-1"), "cpu-8": one_device_bug("bob", "cpu-8")},
            "carl": {"cpu-1": passing("carl", "cpu-1"), "cpu-8": one_device_bug("carl", "cpu-8")},
            "dana": {
                c: row("dana", c, [], status="missing", message="lab-3.ipynb was not handed in")
                for c in ("cpu-1", "cpu-8")
            },
            EVIL: {
                "cpu-1": row(
                    EVIL,
                    "cpu-1",
                    [outcome("doubles", "failed", SCRIPT)],
                    cell_errors=[{"cell": 2, "type": "RuntimeError", "message": SCRIPT, "code": ""}],
                ),
                "cpu-8": row(EVIL, "cpu-8", [], status="timeout", message="did not finish within 5 s"),
            },
            '=HYPERLINK("http://x")': {
                "cpu-1": passing('=HYPERLINK("http://x")', "cpu-1"),
                "cpu-8": passing('=HYPERLINK("http://x")', "cpu-8"),
            },
        },
        notes=["notes.txt: ignored, not a student folder"],
    )


# ----------------------------------------------------------------------------------------
# csv, json, markdown.
# ----------------------------------------------------------------------------------------


def test_the_csv_has_the_fixed_columns_then_one_row_per_unit(results):
    table = list(csv.reader(io.StringIO(scoreboard.to_csv(results))))
    assert table[0][:6] == ["student", "lab", "config", "passed", "total", "status"]
    assert len(table) == 1 + len(results["rows"])
    assert ["bob", "3", "cpu-8", "1", "3", "failed"] in [r[:6] for r in table[1:]]


def test_a_spreadsheet_never_reads_a_formula_from_a_student_id(results):
    ids = [r["student"] for r in csv.DictReader(io.StringIO(scoreboard.to_csv(results)))]
    assert '\'=HYPERLINK("http://x")' in ids and not any(i.startswith("=") for i in ids)


def test_the_json_is_the_results_themselves_with_what_is_drawn_from_them(results):
    shown = json.loads(scoreboard.to_json(results))
    assert {k: v for k, v in shown.items() if k not in scoreboard.DRAWN} == results
    assert shown["failure_rates"] == failrates.rates(results)


def test_the_summary_gives_the_pass_rate_per_lab_and_configuration(results):
    md = markdown.to_markdown(results)
    line = next(ln for ln in md.splitlines() if ln.startswith("| Lab 3"))
    assert "4/6 students (67%)" in line  # cpu-1: alice, bob, carl, =HYPERLINK pass; dana missing, EVIL failed
    assert "2/6 students (33%)" in line  # cpu-8: only alice and =HYPERLINK


def test_the_summary_ranks_tests_failed_on_several_devices_but_passed_on_one(results):
    bugs = results_mod.multi_device_bugs(results)
    assert [(b["test"], b["config"], len(b["students"])) for b in bugs] == [
        ("test_hidden_block", "cpu-8", 2),
        ("test_is_split", "cpu-8", 2),
    ]
    md = markdown.to_markdown(results)
    assert "| 3 | is split | cpu-8 | 2 | expected the result on all 8 devices, but it lives on 1 |" in md


def test_markup_in_the_markdown_is_shown_as_text(results):
    md = markdown.to_markdown(results) + markdown.feedback(results, EVIL)
    assert re.search(r"(?<!\\)<", md) is None  # every < escaped: Markdown shows it, never reads a tag
    assert "\\<script\\>" in md and "&lt;" not in md


# ----------------------------------------------------------------------------------------
# feedback.
# ----------------------------------------------------------------------------------------


def test_feedback_has_public_messages_and_hidden_tests_by_name_and_outcome_only(results):
    text = markdown.feedback(results, "bob")
    assert "✗ is split: expected the result on all 8 devices, but it lives on 1" in text
    assert "✗ hidden block" in text
    assert HIDDEN_SECRET not in text


def test_feedback_of_a_run_that_did_not_finish_says_why(results):
    text = markdown.feedback(results, EVIL)
    assert "cpu-8: timeout" in text and "did not finish within 5 s" in text
    assert "Cell 2 of your notebook raised RuntimeError" in text


def test_feedback_files_are_only_those_of_the_students_in_the_results(results, tmp_path):
    scoreboard.write(results, tmp_path)
    (tmp_path / "feedback" / "someone-from-an-older-run.md").write_text("old")
    scoreboard.write(results, tmp_path)
    (tmp_path / "feedback" / "someone-from-an-older-run.html").write_text("old")
    scoreboard.write(results, tmp_path)
    expected = sorted(s.replace("/", "_") for s in results["students"])  # a "/" cannot be in a file name
    for suffix in ("md", "html", "zip"):
        assert sorted(p.stem for p in (tmp_path / "feedback").glob(f"*.{suffix}")) == expected


def test_each_student_gets_an_html_page_with_hidden_tests_by_name_and_outcome_only(results):
    page = pages.feedback_html(results, "bob")
    assert "expected the result on all 8 devices, but it lives on 1" in page
    assert "hidden block" in page and HIDDEN_SECRET not in page
    assert "alice" not in page  # one student's page names no other student


def test_a_students_html_page_shows_markup_from_a_submission_as_text(results):
    page = pages.feedback_html(results, EVIL)
    assert "<script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;document.body.setAttribute(" in page
    assert "Content-Security-Policy" in page and "http" not in page.replace("http-equiv", "")


def test_each_student_gets_one_archive_with_the_markdown_and_the_page(results, tmp_path):
    import zipfile

    scoreboard.write(results, tmp_path)
    with zipfile.ZipFile(tmp_path / "feedback" / "bob.zip") as z:
        assert z.namelist() == ["bob/feedback.md", "bob/feedback.html"]
        assert z.read("bob/feedback.md").decode() == (tmp_path / "feedback" / "bob.md").read_text()
        assert z.read("bob/feedback.html").decode() == (tmp_path / "feedback" / "bob.html").read_text()
    first = (tmp_path / "feedback" / "bob.zip").read_bytes()
    scoreboard.write(results, tmp_path)
    assert (tmp_path / "feedback" / "bob.zip").read_bytes() == first  # the same results, the same bytes


# ----------------------------------------------------------------------------------------
# merge.
# ----------------------------------------------------------------------------------------


def part_of(results: dict, students: set[str]) -> dict:
    return {
        **results,
        "students": {s: v for s, v in results["students"].items() if s in students},
        "rows": [r for r in results["rows"] if r["student"] in students],
    }


def test_merging_parts_gives_the_files_of_the_whole(results, tmp_path):
    names = sorted(results["students"])
    parts = [part_of(results, set(names[1::2])), part_of(results, set(names[::2]))]
    merged = merging.merge(parts)
    assert scoreboard.to_json(merged) == scoreboard.to_json(results)
    assert pages.to_html(merged) == pages.to_html(results)
    assert scoreboard.to_csv(merged) == scoreboard.to_csv(results)


def test_parts_graded_on_different_configurations_are_not_merged(results):
    other = {**results, "configs": results["configs"][:1]}
    with pytest.raises(scoreboard.MergeError, match="configs"):
        merging.merge([results, other])


# ----------------------------------------------------------------------------------------
# html, rendered by a real browser.
# ----------------------------------------------------------------------------------------


class _Dom(HTMLParser):
    """The elements of a page: (tag, attributes, text inside) for each, and every text run."""

    def __init__(self):
        super().__init__()
        self.elements, self.stack, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        element = [tag, dict(attrs), ""]
        self.elements.append(element)
        if tag not in ("meta", "link", "img", "br", "input"):
            self.stack.append(element)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        self.text.append(data)
        for element in self.stack:
            element[2] += data


def render(page: Path, tmp_path: Path) -> _Dom:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium is not installed: `make system-deps` installs it (.ci/apt-packages.txt)")
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
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
    dom = _Dom()
    dom.feed(done.stdout)
    return dom


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> _Dom:
    folder = tmp_path_factory.mktemp("html")
    scoreboard.write(
        make_results(
            {
                "alice": {"cpu-1": passing("alice", "cpu-1"), "cpu-8": passing("alice", "cpu-8")},
                "bob": {"cpu-1": passing("bob", "cpu-1"), "cpu-8": one_device_bug("bob", "cpu-8")},
                "dana": {
                    c: row("dana", c, [], status="missing", message="lab-3.ipynb was not handed in")
                    for c in ("cpu-1", "cpu-8")
                },
                EVIL: {
                    "cpu-1": row(
                        EVIL,
                        "cpu-1",
                        [outcome("doubles", "failed", SCRIPT)],
                        cell_errors=[{"cell": 2, "type": "RuntimeError", "message": SCRIPT, "code": ""}],
                    ),
                    "cpu-8": row(EVIL, "cpu-8", [], status="timeout", message="did not finish within 5 s"),
                },
            }
        ),
        folder,
    )
    return render(folder / "scoreboard.html", folder)


def heat(dom: _Dom, config: str) -> dict[str, str]:
    """student -> what the heat map cell of lab 3 on `config` shows."""
    tables = [e for e in dom.elements if e[0] == "table" and e[1].get("data-config") == config]
    assert len(tables) == 1
    start = dom.elements.index(tables[0])
    cells, student = {}, None
    for tag, attrs, text in dom.elements[start + 1 :]:
        if tag == "table":
            break
        if tag == "tr" and "data-student" in attrs:
            student = attrs["data-student"]
        if tag == "td" and attrs.get("data-lab") == "3":
            cells[student] = text.strip()
    return cells


def test_the_page_shows_a_student_by_lab_heat_map_for_each_configuration(rendered):
    assert heat(rendered, "cpu-1") == {"alice": "3/3", "bob": "3/3", "dana": "missing", EVIL: "0/1"}
    assert heat(rendered, "cpu-8") == {"alice": "3/3", "bob": "1/3", "dana": "missing", EVIL: "timeout"}


def test_the_heat_map_colours_full_partial_and_failed_cells_differently(rendered):
    styles = {}
    for tag, attrs, text in rendered.elements:
        if tag == "td" and "cell" in attrs.get("class", ""):
            styles.setdefault(text.strip(), attrs.get("style", "") + attrs.get("class", ""))
    assert len({styles["3/3"], styles["1/3"], styles["0/1"], styles["missing"], styles["timeout"]}) == 5


def test_the_page_shows_every_test_with_its_message(rendered):
    bob = next(e for e in rendered.elements if e[0] == "section" and e[1].get("data-student") == "bob")
    assert "is split" in bob[2] and "expected the result on all 8 devices, but it lives on 1" in bob[2]
    assert "hidden" in bob[2]


def test_markup_from_a_submission_is_shown_as_text_and_never_runs(rendered):
    assert not [e for e in rendered.elements if e[0] in ("script", "img")]
    body = next(e for e in rendered.elements if e[0] == "body")
    assert "data-pwned" not in body[1]
    title = next(e for e in rendered.elements if e[0] == "title")
    assert title[2] == "Scoreboard"
    shown = "".join(rendered.text)
    assert EVIL in shown and SCRIPT in shown


def test_the_page_needs_nothing_from_outside_itself(rendered):
    for tag, attrs, _ in rendered.elements:
        for name in ("src", "href"):
            assert not attrs.get(name, "#").startswith(("http:", "https:", "//", "file:")), (tag, attrs)
    assert not [e for e in rendered.elements if e[0] == "link"]


def test_the_page_as_a_browser_shows_it_has_a_histogram_per_lab_and_configuration(rendered):
    drawn = {
        (e[1]["data-lab"], e[1]["data-config"])
        for e in rendered.elements
        if e[0] == "svg" and "spread" in e[1].get("class", "")
    }
    assert drawn == {("3", "cpu-1"), ("3", "cpu-8")}
    assert [
        e[1]["data-count"] for e in rendered.elements if e[0] == "rect" and e[1].get("data-bar") == "100"
    ] == ["2", "1"]


# ----------------------------------------------------------------------------------------
# The student's own view: `make scoreboard` after `make lab-3`.
# ----------------------------------------------------------------------------------------


def test_make_scoreboard_draws_the_students_own_runs_with_the_class_scoreboards_code(kit, build):
    ran = kit("lab", "3", "--notebook", str(catalog.lab(3).reference), "--configs", "cpu-1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    done = kit("scoreboard")
    assert done.returncode == 0, done.stdout + done.stderr
    n = LAB_3_PUBLIC_TESTS
    assert f"{n}/{n}" in done.stdout and "cpu-1" in done.stdout
    mine = ownresults.student_results(build)
    # the class page's code, on the results less a grading's claims (labkit/student/report.py)
    assert (build / "scoreboard" / "you.html").read_text() == pages.feedback_html(
        own.for_the_page(mine), "you"
    )
    assert not (build / "scoreboard" / "scoreboard.html").exists()  # the class page is the TA's
    assert scoreboard.to_csv(mine).splitlines()[1] == f"you,3,cpu-1,{n},{n},ok,{n},{n},,bubblewrap"


def test_make_scoreboard_writes_the_students_own_page_not_the_class_page(results, tmp_path, monkeypatch):
    from labkit import cli

    student = scoreboard.students_of(results)[0]
    mine = results | {"rows": [r for r in results["rows"] if r["student"] == student]}
    monkeypatch.setattr(ownresults, "student_results", lambda build: mine)
    assert cli.main(["scoreboard", "--build", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "scoreboard.html").exists()  # the class page, with its similarity list
    assert (tmp_path / "out" / "you.html").read_text() == pages.feedback_html(own.for_the_page(mine), student)


def test_make_scoreboard_before_any_lab_run_says_what_to_do(kit):
    done = kit("scoreboard")
    assert done.returncode == 1 and "make lab-N" in done.stderr


def test_runs_without_a_sandbox_are_counted_and_warned_about_in_the_summary(results):
    assert "## Isolation" not in markdown.to_markdown(results)
    results["rows"][0]["isolation"] = "limits-only"
    text = markdown.to_markdown(results)
    assert "## Isolation" in text and f"1 of {len(results['rows'])} runs had resource limits only" in text
    table = list(csv.reader(io.StringIO(scoreboard.to_csv(results))))
    assert table[0][-1] == "isolation" and table[1][-1] == "limits-only"


# ----------------------------------------------------------------------------------------
# The score distribution: a histogram per lab and configuration on the class page.
# ----------------------------------------------------------------------------------------


def bars(results: dict, config: str, lab: int = 3) -> dict[str, list[str]]:
    """bar -> the students in it, for the bars with anyone in them."""
    d = next(d for d in spread.distributions(results) if d["lab"] == lab and d["config"] == config)
    return {b["key"]: b["students"] for b in d["bars"] if b["students"]}


def drawn(page: str) -> dict[str, dict[str, int]]:
    """config -> bar -> the count its rectangle carries, read from the page's markup."""
    dom = _Dom()
    dom.feed(page)
    out, config = {}, None
    for tag, attrs, _ in dom.elements:
        if tag == "svg" and "spread" in attrs.get("class", ""):
            config = attrs["data-config"]
            out[config] = {}
        if tag == "rect" and "data-bar" in attrs:
            out[config][attrs["data-bar"]] = int(attrs["data-count"])
    return out


def test_a_class_that_passes_on_one_device_and_half_fails_on_eight_shows_that_shape():
    results = make_results(
        {
            "alice": {"cpu-1": passing("alice", "cpu-1"), "cpu-8": passing("alice", "cpu-8")},
            "bob": {"cpu-1": passing("bob", "cpu-1"), "cpu-8": passing("bob", "cpu-8")},
            "carl": {"cpu-1": passing("carl", "cpu-1"), "cpu-8": one_device_bug("carl", "cpu-8")},
            "dana": {"cpu-1": passing("dana", "cpu-1"), "cpu-8": one_device_bug("dana", "cpu-8")},
        }
    )
    assert bars(results, "cpu-1") == {"100": ["alice", "bob", "carl", "dana"]}
    assert bars(results, "cpu-8") == {"25-49": ["carl", "dana"], "100": ["alice", "bob"]}  # 1 of 3 tests
    assert drawn(pages.to_html(results)) == {"cpu-1": {"100": 4}, "cpu-8": {"25-49": 2, "100": 2}}


def test_each_student_falls_in_one_bar_by_the_share_of_tests_passed():
    def shares(passed, total):
        return spread.bar_of(
            {"status": "ok" if passed == total else "failed", "passed": passed, "total": total}
        )

    assert [shares(0, 3), shares(1, 5), shares(1, 3), shares(2, 3), shares(3, 4), shares(3, 3)] == [
        "0",
        "1-24",
        "25-49",
        "50-74",
        "75-99",
        "100",
    ]
    assert spread.bar_of({"status": "missing", "passed": 0, "total": 3}) == "missing"
    assert spread.bar_of({"status": "timeout", "passed": 0, "total": 3}) == "no-result"
    assert spread.bar_of({"status": "error", "passed": 2, "total": 3}) == "no-result"
    assert spread.bar_of({"status": "skipped", "passed": 0, "total": 0}) is None


def test_missing_work_and_runs_without_a_result_have_bars_of_their_own(results):
    assert bars(results, "cpu-8") == {
        "missing": ["dana"],
        "no-result": [EVIL],
        "25-49": ["bob", "carl"],
        "100": ['=HYPERLINK("http://x")', "alice"],
    }


def test_a_configuration_that_could_not_run_here_draws_no_bars_and_says_skipped():
    results = make_results(
        {
            s: {
                "cpu-1": passing(s, "cpu-1"),
                "cpu-8": row(s, "cpu-8", [], status="skipped", message="needs 8 devices"),
            }
            for s in ("alice", "bob")
        }
    )
    found = {d["config"]: d["skipped"] for d in spread.distributions(results)}
    assert found == {"cpu-1": False, "cpu-8": True}
    page = pages.to_html(results)
    assert drawn(page) == {"cpu-1": {"100": 2}}
    assert '<td data-config="cpu-8"><span class="msg">skipped</span></td>' in page


def test_every_histogram_of_a_page_is_drawn_on_one_scale():
    results = make_results(
        {
            "alice": {"cpu-1": passing("alice", "cpu-1"), "cpu-8": passing("alice", "cpu-8")},
            "bob": {"cpu-1": passing("bob", "cpu-1"), "cpu-8": one_device_bug("bob", "cpu-8")},
        }
    )
    one, eight = spread.distributions(results)
    heights = {
        (d["config"], b["key"]): b["height"] for d in (one, eight) for b in spread.layout(d, 2)["bars"]
    }
    assert heights[("cpu-1", "100")] == spread.HEIGHT  # both students: a full bar
    assert heights[("cpu-8", "100")] == heights[("cpu-8", "25-49")] == spread.HEIGHT // 2
    assert heights[("cpu-8", "0")] == 0


def test_a_student_id_with_markup_is_shown_in_a_histogram_as_text_only(results):
    page = pages.to_html(results)
    start = page.index('<table id="spread">')
    section = page[start : page.index('<h2 id="failure-rates">', start)]
    assert "<img" not in section and 'onerror="' not in section
    assert "&lt;img src=x onerror=&#34;document.title=&#39;pwned&#39;&#34;&gt;" in section
    dom = _Dom()
    dom.feed(section)
    assert not [
        e
        for e in dom.elements
        if e[0]
        not in (
            "table",
            "thead",
            "tbody",
            "tr",
            "th",
            "td",
            "span",
            "p",
            "svg",
            "title",
            "line",
            "rect",
            "text",
        )
    ]
    tooltips = [
        text for tag, attrs, text in dom.elements if tag == "title" and text.startswith("lab-3 on cpu-1, 0%")
    ]
    assert tooltips == [f"lab-3 on cpu-1, 0%: 1 student: {EVIL}"]


def test_a_bars_tooltip_names_a_few_students_and_counts_the_rest():
    names = [f"s{k:03d}" for k in range(spread.NAMES_SHOWN + 7)]
    results = make_results({s: {"cpu-1": passing(s, "cpu-1"), "cpu-8": passing(s, "cpu-8")} for s in names})
    d = spread.distributions(results)[0]
    title = next(b["title"] for b in spread.layout(d, len(names))["bars"] if b["key"] == "100")
    assert (
        title.endswith(f"{names[spread.NAMES_SHOWN - 1]} and 7 more")
        and names[spread.NAMES_SHOWN] not in title
    )
