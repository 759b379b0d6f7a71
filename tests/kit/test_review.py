"""`make review`: the TA's page for grading written answers by rubric (labkit/grading/review/).

The app is driven through Starlette's test client for what it refuses (no token, another host, another
origin, a form not its own, a path it does not serve), what it saves and where (the course state's
adjustments, which grading reads back), two TAs on one answer, a student's hostile write-up, a regrade
request's executed notebook (hostile too) and test override, and points saved while a grading run keeps its
inputs. One test drives the real command in Debian's Chromium by keyboard, stops and starts it, and reads the
points back through the course state into grades.csv and the feedback, as the next `make grade` would
(tests/kit/test_course_state.py runs the real `labkit grade` after a regrade's override).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labkit.grading.intake import handin
from labkit.grading.publish import gradebook, markdown, scoreboard
from labkit.grading.review import answers, app, executed, marks
from labkit.grading.review.guard import Gate
from labkit.grading.state import adjustments, inputs
from labkit.grading.state import course as course_mod
from labkit.grading.state.errors import GradeError
from tests.kit.test_feedback import lab_row, make_results

# Starlette's test client asks for httpx2 (a rename); httpx, already locked, works the same.
pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("LABKIT_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts"))
TOKEN = "a-token-for-the-tests"
HOST = "testserver"
ORIGIN = f"http://{HOST}"
LAB = 10
RUBRIC = (
    f'[labs.{LAB}]\nquestion = "why the pipeline has a bubble"\n'
    f'[[labs.{LAB}.items]]\nname = "the bubble"\nmax = 2\nsays = "names the idle stages at start and end"\n'
    f'[[labs.{LAB}.items]]\nname = "its cost"\nmax = 1\nsays = "the fraction of time idle, from the sizes"\n'
)
STUDENTS = ("alice", "bob", "carol")


def write_up(out: Path, student: str, words: str, lab: int = LAB) -> Path:
    """A write-up as the grading run writes it (labkit/grading/intake/writeups.py)."""
    path = out / "writeups" / student / f"lab-{lab}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Design note: {student!r}, lab {lab}\n\n```text\n{words}\n```\n")
    return path


def make_out(folder: Path) -> Path:
    out = folder / "out"
    for n, student in enumerate(STUDENTS):
        write_up(out, student, f"Bubble {n}: the **first** stages wait.")
    (out / "course").mkdir(parents=True)
    (out / "course" / "rubric.toml").write_text(RUBRIC)
    return out


@pytest.fixture
def out(tmp_path) -> Path:
    return make_out(tmp_path)


@pytest.fixture
def client(out):
    from starlette.testclient import TestClient

    gate = Gate(TOKEN, frozenset({HOST}), frozenset({"testclient"}))
    with TestClient(app.make(out, gate, "ta-one"), base_url=ORIGIN) as c:
        c.get(f"/?token={TOKEN}")
        yield c


def form(page: str, **points: str) -> dict[str, str]:
    """The page's form as a browser would send it, with `points` (points_1="2") put in."""
    found = dict(re.findall(r'name="([\w-]+)"[^>]*?value="([^"]*)"', page))
    return found | {k.replace("_", "-"): v for k, v in points.items()}


def post(client, lab: int, number: int, data: dict, origin: str | None = ORIGIN):
    headers = {"origin": origin} if origin else {}
    return client.post(f"/lab/{lab}/{number}", data=data, headers=headers, follow_redirects=False)


def student_of(out: Path, number: int) -> str:
    return answers.find(out)[LAB][number - 1].student


def kept(out: Path) -> list[dict]:
    text = (out / "course" / "adjustments.csv").read_text()
    return adjustments.parse(text, "adjustments.csv", set(STUDENTS), {LAB})


# ----------------------------------------------------------------------------------------
# Who may reach it.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "?token=wrong", "?token="])
def test_a_request_without_the_token_is_refused(out, query):
    from starlette.testclient import TestClient

    gate = Gate(TOKEN, frozenset({HOST}), frozenset({"testclient"}))
    with TestClient(app.make(out, gate, "ta"), base_url=ORIGIN) as c:
        for path in ("/", f"/lab/{LAB}/1", "/static/review.js"):
            answer = c.get(path + query)
            assert answer.status_code == 403 and "token" in answer.text
            assert "alice" not in answer.text
        assert post(c, LAB, 1, {"points-1": "2"}).status_code == 403
    assert not (out / "course" / "adjustments.csv").exists()


def test_the_token_in_the_address_becomes_a_cookie_and_leaves_the_address(out):
    from starlette.testclient import TestClient

    gate = Gate(TOKEN, frozenset({HOST}), frozenset({"testclient"}))
    with TestClient(app.make(out, gate, "ta"), base_url=ORIGIN) as c:
        first = c.get(f"/lab/{LAB}/1?names=1&token={TOKEN}", follow_redirects=False)
        assert first.status_code == 303 and first.headers["location"] == f"/lab/{LAB}/1?names=1"
        assert "HttpOnly" in first.headers["set-cookie"] and "SameSite=Strict" in first.headers["set-cookie"]
        assert c.get(f"/lab/{LAB}/1").status_code == 200


def test_a_request_from_off_the_loopback_or_to_another_host_name_is_refused(out):
    from starlette.testclient import TestClient

    loopback_only = Gate(TOKEN, frozenset({HOST}))  # the test client's peer is not 127.0.0.1
    with TestClient(app.make(out, loopback_only, "ta"), base_url=ORIGIN) as c:
        assert c.get(f"/?token={TOKEN}").status_code == 403
    gate = Gate(TOKEN, frozenset({HOST}), frozenset({"testclient"}))
    with TestClient(app.make(out, gate, "ta"), base_url="http://evil.example") as c:  # a rebound name
        answer = c.get(f"/?token={TOKEN}")
        assert answer.status_code == 403 and "address its command printed" in answer.text


@pytest.mark.parametrize("origin", ["http://evil.example", "null", None])
def test_a_post_from_another_origin_is_refused_and_writes_nothing(client, out, origin):
    page = client.get(f"/lab/{LAB}/1").text
    answer = post(client, LAB, 1, form(page, points_1="2"), origin=origin)
    assert answer.status_code == 403
    assert not (out / "course" / "adjustments.csv").exists()


def test_a_form_without_the_pages_own_csrf_value_is_refused(client, out):
    page = client.get(f"/lab/{LAB}/1").text
    answer = post(client, LAB, 1, form(page, points_1="2") | {"csrf": "guessed"})
    assert answer.status_code == 403
    assert not (out / "course" / "adjustments.csv").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/static/../app.py",
        "/static/%2e%2e%2fapp.py",
        "/static/templates%2fbase.html",
        "/static/..%2f..%2f..%2fstate%2ffiles.py",
        f"/lab/{LAB}/0",
        f"/lab/{LAB}/4",
        f"/lab/{LAB}/-1",
        f"/lab/{LAB}/..%2f..%2fcourse",
        "/lab/..%2f..%2fetc/1",
        "/etc/passwd",
        "/lab/3/1",
    ],
)
def test_a_path_the_page_does_not_serve_is_refused(client, path):
    answer = client.get(path)
    assert answer.status_code == 404, (path, answer.status_code)
    assert "def " not in answer.text and "root:" not in answer.text


def test_a_linked_write_up_or_student_folder_is_not_followed(out, tmp_path):
    secret = tmp_path / "secret.md"
    secret.write_text("the TA's own notes")
    (out / "writeups" / "dave").mkdir()
    (out / "writeups" / "dave" / f"lab-{LAB}.md").symlink_to(secret)
    (out / "writeups" / "erin").symlink_to(out / "writeups" / "alice")
    assert {a.student for a in answers.find(out)[LAB]} == set(STUDENTS)


def test_a_student_whose_id_is_not_ascii_is_graded_like_any_other(client, out):
    write_up(out, "josé", "Bubble: the last stages wait too.")
    number = next(a.number for a in answers.find(out)[LAB] if a.student == "josé")
    page = client.get(f"/lab/{LAB}/{number}").text
    assert post(client, LAB, number, form(page, points_1="2")).status_code == 303
    assert [
        a["student"]
        for a in adjustments.parse(
            (out / "course" / "adjustments.csv").read_text(), "adjustments.csv", {*STUDENTS, "josé"}, {LAB}
        )
    ] == ["josé"]
    assert "josé" in client.get(f"/lab/{LAB}/{number}?names=1").text


def test_every_answer_says_what_the_page_may_load_and_run(client):
    for path in ("/", f"/lab/{LAB}/1", "/static/review.js", "/nothing"):
        headers = client.get(path).headers
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"


def test_the_page_has_no_inline_script_and_loads_nothing_from_elsewhere(client):
    page = client.get(f"/lab/{LAB}/1").text
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/review.js" defer>']
    assert not re.search(r"\son\w+\s*=|style=|http", page)


# ----------------------------------------------------------------------------------------
# Grading: anonymised, saved at once where grading reads it, by whom and when.
# ----------------------------------------------------------------------------------------


def test_answers_are_shown_by_number_not_name_until_the_ta_asks(client, out):
    page = client.get(f"/lab/{LAB}/1").text
    assert "Answer 1 of 3" in page and not any(f"'{s}'" in page or s in page for s in STUDENTS)
    named = client.get(f"/lab/{LAB}/1?names=1").text
    assert student_of(out, 1) in named


def test_points_given_are_saved_at_once_into_the_course_states_adjustments(client, out):
    page = client.get(f"/lab/{LAB}/2").text
    answer = post(client, LAB, 2, form(page, points_1="1.5", comment_1="the end stages only"))
    assert answer.status_code == 303 and answer.headers["location"] == f"/lab/{LAB}/2?saved=1"
    assert [(a["student"], a["points"], a["comment"], a["item"], a["max"]) for a in kept(out)] == [
        (student_of(out, 2), 1.5, "the end stages only", "the bubble", 2)
    ]
    manifest = json.loads((out / "course" / "manifest.json").read_text())
    assert manifest["inputs"]["adjustments"]["file"] == "adjustments.csv"
    log = [json.loads(line) for line in (out / "course" / "review-log.jsonl").read_text().splitlines()]
    assert log[0]["by"] == "ta-one" and log[0]["student"] == student_of(out, 2) and log[0]["at"]
    again = client.get(f"/lab/{LAB}/2?saved=1").text
    assert 'value="1.5"' in again and "Saved." in again


def test_an_empty_box_takes_an_items_points_away_and_other_lines_are_kept(client, out):
    (out / "course" / "adjustments.csv").write_text('student,lab,points,comment\nbob,10,-1,"late write-up"\n')
    page = client.get(f"/lab/{LAB}/1").text
    post(client, LAB, 1, form(page, points_1="2", points_2="1"))
    assert len(kept(out)) == 3
    page = client.get(f"/lab/{LAB}/1").text
    post(client, LAB, 1, form(page, points_2=""))
    assert [(a["student"], a.get("item")) for a in kept(out)] == [
        ("bob", None),
        (student_of(out, 1), "the bubble"),
    ]


@pytest.mark.parametrize("points", ["3", "-1", "nan", "inf", "two"])
def test_points_outside_an_item_are_refused_and_nothing_is_written(client, out, points):
    page = client.get(f"/lab/{LAB}/1").text
    answer = post(client, LAB, 1, form(page, points_1=points))
    assert answer.status_code == 400 and "the bubble" in answer.text
    assert not (out / "course" / "adjustments.csv").exists()


def test_the_next_ungraded_answer_comes_up(client, out):
    page = client.get(f"/lab/{LAB}/1").text
    post(client, LAB, 1, form(page, points_1="2", points_2="1"))
    assert client.get(f"/lab/{LAB}/next", follow_redirects=False).headers["location"] == f"/lab/{LAB}/2"
    assert "1 of 3 graded" in client.get(f"/lab/{LAB}/2").text
    index = client.get("/").text
    assert re.search(r"<td>3</td><td>1</td>", index)


def test_two_tas_on_one_answer_the_later_save_from_an_older_page_is_refused(client, out):
    mine = client.get(f"/lab/{LAB}/1").text
    theirs = client.get(f"/lab/{LAB}/1").text  # the other TA's browser, drawn at the same time
    assert post(client, LAB, 1, form(theirs, points_1="2")).status_code == 303
    answer = post(client, LAB, 1, form(mine, points_1="0"))
    assert answer.status_code == 409 and "Another TA saved this answer" in answer.text
    assert [a["points"] for a in kept(out)] == [2]
    assert 'value="2"' in answer.text  # the page now shows theirs, with its version: a save from it works
    assert post(client, LAB, 1, form(answer.text, points_1="0")).status_code == 303
    assert [a["points"] for a in kept(out)] == [0]


def test_a_corrupt_adjustments_file_is_named_and_nothing_is_overwritten(client, out):
    bad = "student,lab,points,comment\nalice,10,lots,x\n"
    (out / "course" / "adjustments.csv").write_text(bad)
    page = client.get(f"/lab/{LAB}/1")
    assert page.status_code == 409 and "adjustments.csv, line 2" in page.text
    csrf = Gate(TOKEN, frozenset({HOST})).csrf()  # the form of a page drawn before the file went bad
    answer = post(client, LAB, 2, {"csrf": csrf, "version": marks.version({}), "points-1": "1"})
    assert answer.status_code == 409 and "line 2" in answer.text
    assert (out / "course" / "adjustments.csv").read_text() == bad


# ----------------------------------------------------------------------------------------
# A student's write-up is hostile text.
# ----------------------------------------------------------------------------------------

HOSTILE = [
    "<script>document.title='owned'</script>",
    "[click me](javascript:document.title='owned')",
    "<img src=x onerror=\"document.title='owned'\">",
    "<svg><script>document.title='owned'</script></svg>",
    "![owned: a huge image](http://example.com/huge.png)",
    '<a href="javascript:alert(1)">owned</a> <iframe src="/"></iframe>',
    '<p style="background:url(javascript:alert(1))" onclick="alert(1)">owned</p>',
]


@pytest.mark.parametrize("words", HOSTILE)
def test_a_hostile_write_up_is_drawn_as_inert_text(client, out, words):
    write_up(out, student_of(out, 1), words)
    page = client.get(f"/lab/{LAB}/1").text
    article = re.search(r'<article class="answer" id="answer">(.*)</article>', page, re.S).group(1)
    drawn = elements(article)
    assert {tag for tag, _ in drawn} <= answers.TAGS
    assert not {"script", "svg", "img", "iframe", "style"} & {tag for tag, _ in drawn}
    for _, attrs in drawn:
        assert set(attrs) <= {"href", "rel"}, attrs
        assert attrs.get("href", "https:").split(":")[0] in ("http", "https", "mailto"), attrs
    assert "owned" in article  # still there to read, as text


def elements(html: str) -> list[tuple[str, dict]]:
    """Every element of `html` as a browser's parser meets it: its tag and attributes."""
    from html.parser import HTMLParser

    found = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, dict(attrs)))

    Parser().feed(html)
    return found


def test_a_ten_megabyte_write_up_is_shown_cut(client, out):
    path = write_up(out, student_of(out, 1), "word " * 2_000_000)
    assert path.stat().st_size > 10_000_000
    page = client.get(f"/lab/{LAB}/1")
    assert page.status_code == 200 and len(page.text) < 2 * answers.MAX_BYTES
    assert "cut here" in page.text


def test_the_sanitiser_keeps_what_markdown_means():
    drawn = answers.html("**bold** and `code`\n\n- one\n- [a link](https://jax.dev)")
    assert "<strong>bold</strong>" in drawn and "<code>code</code>" in drawn and "<li>" in drawn
    assert 'href="https://jax.dev"' in drawn and "noopener" in drawn


# ----------------------------------------------------------------------------------------
# What grading makes of the points: the next `make grade` reads the kept adjustments.
# ----------------------------------------------------------------------------------------


def graded_with_the_kept_state(out: Path) -> dict:
    """The results as the next `make grade` (no ADJUSTMENTS=) would make them from OUT/course/: the course
    state read and checked as grading reads it, its values put into a class's results (test_feedback's,
    with carol added), so that nothing is run."""
    state, context = inputs.read(out, None, dict.fromkeys(course_mod.INPUTS), "", False)
    context.students = set(STUDENTS)
    for lab in make_results()["labs"]:  # the class's tests, as grading collects them from the lab's files
        context.tests[lab["number"]] = set(lab["tests"])
        context.points[lab["number"]] = sum(t["points"] for t in lab["tests"].values())
    state.check(context, needs_class=True)
    results = make_results()
    results["rows"] += [lab_row("carol", 9, "cpu-8", True), lab_row("carol", LAB, "cpu-8", True)]
    results["students"]["carol"] = {"notes": [], "section": "A"}
    return results | inputs.course_values(state, [9, LAB])


def grades(results: dict) -> dict[tuple[str, str], dict]:
    return {(r["student"], r["lab"]): r for r in csv.DictReader(io.StringIO(scoreboard.grades_csv(results)))}


def test_the_points_saved_are_in_the_next_grades_csv_and_feedback(client, out):
    for number, points in ((1, "2"), (2, "1")):
        page = client.get(f"/lab/{LAB}/{number}").text
        post(client, LAB, number, form(page, points_1=points, points_2="1", comment_2="a clear estimate"))
    results = graded_with_the_kept_state(out)
    table = grades(results)
    first, second = student_of(out, 1), student_of(out, 2)
    assert table[first, str(LAB)]["max_points"] == "6"  # the tests' 3 and the rubric's 3
    assert "the bubble: 2/2" in table[first, str(LAB)]["adjustments"]
    assert "its cost: 1/1 (a clear estimate)" in table[second, str(LAB)]["adjustments"]
    assert "its cost: 1/1 (a clear estimate)" in markdown.feedback(results, second)


# ----------------------------------------------------------------------------------------
# In a real browser, by keyboard, across a restart of the server.
# ----------------------------------------------------------------------------------------


class Server:
    """`python -m labkit review OUT` as a TA starts it; `url` is the address it printed."""

    def __init__(self, out: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "labkit", "review", str(out), "--ta", "ta-one"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True).start()
        said, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline and "token=" not in said and self.proc.poll() is None:
            try:
                said += lines.get(timeout=1)
            except queue.Empty:
                pass
        found = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", said)
        assert found, said
        self.url = found.group(0)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def chromium():
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(browser).exists():
        pytest.fail("chromium is not installed: `make system-deps` installs it (.ci/apt-packages.txt)")
    return browser


def press(page, key: str) -> None:
    with page.expect_navigation():
        page.keyboard.press(key)


def two_tas_on_answer_one(browser, url: str) -> None:
    """Two TAs open answer 1; the first one's save goes in, the second one's, from the older page, is
    refused, and the page says so and shows the first one's points."""
    pages = [browser.new_context().new_page() for _ in range(2)]
    for page in pages:
        page.goto(url)
        page.goto(url.split("?")[0] + f"lab/{LAB}/1")
    press(pages[0], "2")  # its cost: 1 -> 0
    press(pages[1], "1")  # the bubble: 2 -> 0, from a page drawn before that save
    assert "Another TA saved this answer" in pages[1].inner_text("#message")
    assert pages[1].input_value("#points-1") == "2" and pages[1].input_value("#points-2") == "0"


def test_a_ta_grades_three_answers_by_keyboard_and_a_restart_keeps_them(out):
    from playwright.sync_api import sync_playwright

    write_up(out, student_of(out, 2), "\n\n".join(HOSTILE))  # one of them hostile: it must run nothing
    dialogs: list[str] = []
    server = Server(out)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(server.url)
            assert "token" not in page.url  # traded for a cookie
            with page.expect_navigation():
                page.click("a.start")
            for number in (1, 2, 3):
                assert f"Answer {number} of 3" in page.inner_text("header")
                assert not any(s in page.content() for s in STUDENTS)  # anonymised
                assert page.title() == f"Lab {LAB}, answer {number} of 3" and not dialogs
                assert page.locator("#answer script, #answer img, #answer svg, #answer iframe").count() == 0
                press(page, "1")  # the bubble: its 2 points, saved at once
                assert page.inner_text("#message") == "Saved."
                if number == 3:
                    page.keyboard.press("c")
                    page.keyboard.type("say how much of the time is idle")
                    press(page, "Enter")
                else:
                    press(page, "2")  # its cost: 1 point
                assert page.input_value("#points-1") == "2"
                if number == 1:
                    ARTIFACTS.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(ARTIFACTS / "review-page.png"))
                if number < 3:
                    press(page, "n")
            server.stop()
            server = Server(out)  # a new token: the old page's cookie is refused
            page.goto(server.url)
            assert re.search(r"\b3\s+2\b", page.inner_text("table.labs"))  # 3 answers, 2 with every item
            page.goto(server.url.split("?")[0] + f"lab/{LAB}/3")
            assert page.input_value("#points-1") == "2" and page.input_value("#points-2") == ""
            assert page.input_value("#comment-1") == "say how much of the time is idle"
            two_tas_on_answer_one(browser, server.url)
            assert not dialogs and "owned" not in page.title()
        finally:
            browser.close()
            server.stop()
    results = graded_with_the_kept_state(out)
    table = grades(results)
    canvas = list(csv.reader(io.StringIO(gradebook.to_canvas(results))))
    column = next(i for i, name in enumerate(canvas[0]) if name.startswith(f"Lab {LAB} "))
    tests = {"alice": 2.4, "bob": 1, "carol": 3}  # test_feedback's class: alice late, bob failing one test
    given = {
        student_of(out, 1): 2,
        student_of(out, 2): 3,
        student_of(out, 3): 2,
    }  # answer 1's cost taken back
    third = student_of(out, 3)
    for s in STUDENTS:
        expected = pytest.approx(tests[s] + given[s])
        assert float(table[s, str(LAB)]["points"]) == expected
        assert float(next(r for r in canvas if r[2] == s)[column]) == expected  # the Canvas export's too
    assert "the bubble: 2/2 (say how much of the time is idle)" in table[third, str(LAB)]["adjustments"]


# ----------------------------------------------------------------------------------------
# The question across the class, and a rubric that cannot be used.
# ----------------------------------------------------------------------------------------

COPIED = (
    "The bubble is the time at the start and the end of a step when some stages have no micro-batch to "
    "work on: with four stages and eight micro-batches three of eleven ticks are idle on every device."
)


def test_a_question_at_a_glance_shows_each_items_spread_and_answers_that_share_text(client, out):
    write_up(out, student_of(out, 1), COPIED)
    write_up(out, student_of(out, 3), COPIED + " So it is.")
    for number, points in ((1, "2"), (2, "1")):
        page = client.get(f"/lab/{LAB}/{number}").text
        post(client, LAB, number, form(page, points_1=points))
    glance = client.get(f"/lab/{LAB}/glance").text
    spread = re.search(r'<table class="spread".*?</table>', glance, re.S).group(0)
    row = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", spread.split("<tr>")[2])).strip()
    assert row == "the bubble 2 2 1.5 1: 1, 2: 1"  # item, max, graded, mean, answers at each value
    assert re.search(r"answer 1</a> and\s*<a[^>]*>answer 3</a>", glance)
    assert "answer 2" not in re.search(r'<ul class="shared".*?</ul>', glance, re.S).group(0)
    assert not any(s in glance for s in STUDENTS)


@pytest.mark.parametrize(
    "text", ["[labs.10]\nitems = 3\n", "[labs.10\n", '[labs.10]\nitems = [{name = "a"}]\n']
)
def test_a_rubric_file_that_cannot_be_used_is_named_never_a_crash(client, out, text):
    (out / "course" / "rubric.toml").write_text(text)
    for path in ("/", f"/lab/{LAB}/1", f"/lab/{LAB}/next", f"/lab/{LAB}/glance"):
        answer = client.get(path)
        assert answer.status_code in (200, 409) and "rubric.toml" in answer.text, path


def test_a_folder_that_is_not_there_or_a_port_taken_is_refused_in_one_line(out, tmp_path):
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    try:
        for args, said in (
            ([str(tmp_path / "nowhere")], "is not a folder"),
            ([str(out), "--port", str(held.getsockname()[1])], "cannot listen on 127.0.0.1"),
        ):
            done = subprocess.run(
                [sys.executable, "-m", "labkit", "review", *args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
    finally:
        held.close()


# ----------------------------------------------------------------------------------------
# Regrade requests: entered, shown beside the unit, answered into the adjustments.
# ----------------------------------------------------------------------------------------


def graded_class(out: Path) -> None:
    """OUT/scoreboard.json as the class's last grading wrote it (test_feedback's class, carol added)."""
    results = make_results()
    results["rows"] += [lab_row("carol", 9, "cpu-8", True), lab_row("carol", LAB, "cpu-8", True)]
    results["rows"][3]["tests"][0]["message"] = "<script>document.title='owned'</script> expected shape (8,)"
    del results["policy"]  # the kit's policy, as graded_with_the_kept_state reads it
    (out / "scoreboard.json").write_text(json.dumps(results))


def test_a_regrade_request_is_shown_beside_the_unit_and_answered_into_the_feedback(client, out):
    graded_class(out)
    csrf = Gate(TOKEN, frozenset({HOST})).csrf()
    asked = {
        "csrf": csrf,
        "student": "bob",
        "lab": str(LAB),
        "about": "test_sums",
        "words": "my <b>shape</b> is right",
    }
    made = client.post("/regrades", data=asked, headers={"origin": ORIGIN}, follow_redirects=False)
    assert made.status_code == 303 and made.headers["location"] == "/regrades/1"
    page = client.get("/regrades/1").text
    assert "my &lt;b&gt;shape&lt;/b&gt; is right" in page  # the student's words, as text
    assert "&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt; expected shape (8,)" in page
    assert "<script>document" not in page
    reply = {
        "csrf": csrf,
        "reply": "the shape is right on one device only; half the points back",
        "points": "0.5",
    }
    answered = client.post("/regrades/1", data=reply, headers={"origin": ORIGIN}, follow_redirects=False)
    assert answered.status_code == 303
    events = [json.loads(line) for line in (out / "course" / "regrades.jsonl").read_text().splitlines()]
    assert [(e["event"], e["by"]) for e in events] == [("request", "ta-one"), ("answer", "ta-one")]
    results = graded_with_the_kept_state(out)
    assert "+0.5 (the shape is right on one device only" in grades(results)["bob", str(LAB)]["adjustments"]
    assert "half the points back" in markdown.feedback(results, "bob")
    assert "answered" in client.get("/regrades").text


def test_a_regrade_form_not_the_pages_own_or_for_someone_not_in_the_class_is_refused(client, out):
    graded_class(out)
    csrf = Gate(TOKEN, frozenset({HOST})).csrf()
    asked = {"student": "bob", "lab": str(LAB), "about": "x", "words": "please"}
    assert client.post("/regrades", data=asked, headers={"origin": ORIGIN}).status_code == 403
    assert (
        client.post(
            "/regrades", data=asked | {"csrf": csrf}, headers={"origin": "http://evil.example"}
        ).status_code
        == 403
    )
    stranger = client.post(
        "/regrades", data=asked | {"csrf": csrf, "student": "mallory"}, headers={"origin": ORIGIN}
    )
    assert stranger.status_code == 400 and "name a student of the class" in stranger.text
    assert not (out / "course" / "regrades.jsonl").exists()


def test_a_course_folder_that_cannot_be_written_is_named_and_nothing_is_taken_as_saved(client, out):
    page = client.get(f"/lab/{LAB}/1").text
    shutil.rmtree(out / "course")
    (out / "course").write_text("not a folder")  # what a mistyped command could leave
    answer = post(client, LAB, 1, form(page, points_1="2"))
    assert answer.status_code == 409 and "File exists" in answer.text and "Saved." not in answer.text
    assert (out / "course").read_text() == "not a folder"


def ask(client, student: str = "bob") -> str:
    """Enter a regrade request for `student`'s lab; the page's address."""
    asked = {
        "csrf": Gate(TOKEN, frozenset({HOST})).csrf(),
        "student": student,
        "lab": str(LAB),
        "words": "look",
    }
    made = client.post("/regrades", data=asked, headers={"origin": ORIGIN}, follow_redirects=False)
    assert made.status_code == 303
    return made.headers["location"]


def executed_nb(out: Path, cells: list[dict], student: str = "bob", config: str = "cpu-8") -> Path:
    """The notebook a grading run left in OUT/work/ for the unit (labkit/grading/running/store.py's workdir)."""
    path = out / "work" / student / f"lab-{LAB}" / config / "executed.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def code(source: str, *outputs: dict) -> dict:
    return {"cell_type": "code", "source": source, "outputs": list(outputs), "metadata": {}}


def test_a_regrade_requests_page_shows_the_notebook_as_executed(client, out):
    graded_class(out)
    executed_nb(
        out,
        [
            {"cell_type": "markdown", "source": ["## My pipeline\n"], "metadata": {}},
            code(
                "x = jnp.ones((8,))\nprint(x.shape)",
                {"output_type": "stream", "name": "stdout", "text": "(8,)\n"},
            ),
            code(
                "shard(x)",
                {
                    "output_type": "error",
                    "ename": "ValueError",
                    "evalue": "mesh axis 'data' missing",
                    "traceback": ["\x1b[0;31mValueError\x1b[0m: mesh axis 'data' missing"],
                },
            ),
        ],
    )
    page = client.get(ask(client)).text
    assert "The notebook as executed" in page and "cpu-8" in page
    assert "x = jnp.ones((8,))\nprint(x.shape)" in page and "(8,)\n</pre>" in page
    assert "ValueError: mesh axis &#39;data&#39; missing" in page and "\x1b" not in page


HOSTILE_CELLS = [
    code(
        "<script>document.title='owned'</script>",
        {
            "output_type": "display_data",
            "data": {"text/html": ["<img src=x onerror=alert(1)>"]},
            "metadata": {},
        },
        {
            "output_type": "execute_result",
            "data": {"image/svg+xml": "<svg onload=alert(2)><script>alert(3)</script></svg>"},
            "metadata": {},
        },
    ),
]


def test_a_hostile_executed_notebook_shows_as_text(client, out):
    graded_class(out)
    executed_nb(out, HOSTILE_CELLS)
    page = client.get(ask(client)).text
    assert "&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt;" in page
    assert "(text/html, shown as its text)\n&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;svg onload=alert(2)&gt;" in page
    tags = [tag for tag, _ in elements(page)]
    assert "img" not in tags and "svg" not in tags and tags.count("script") == 1  # the page's own script only
    assert not any(k.startswith("on") for _, attrs in elements(page) for k in attrs)


@pytest.mark.parametrize("where", ["notebook", "folder"])
def test_a_link_in_place_of_the_executed_notebook_is_not_followed(client, out, tmp_path, where):
    graded_class(out)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "executed.ipynb").write_text(json.dumps({"cells": [code("the TA's secret")]}))
    path = executed_nb(out, [code("mine")])
    if where == "notebook":
        path.unlink()
        path.symlink_to(secret / "executed.ipynb")
    else:
        shutil.rmtree(path.parent)
        path.parent.symlink_to(secret)
    page = client.get(ask(client)).text
    assert "not shown:" in page and "is a link or not a folder" in page
    assert "secret" not in page


def test_an_executed_notebook_is_read_only_below_the_output_folder(out, tmp_path):
    for config in ("..", "../..", "", "a/b"):
        assert "not shown" in executed.of_unit(out, "bob", LAB, config).problem
    fifo = out / "work" / "bob" / f"lab-{LAB}" / "cpu-8" / "executed.ipynb"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)  # a run that left a FIFO hangs nothing
    assert "is not a file" in executed.of_unit(out, "bob", LAB, "cpu-8").problem
    assert "no executed notebook" in executed.of_unit(out, "carol", LAB, "cpu-8").problem


def test_a_regrade_answered_with_a_test_override_reaches_grades_csv_and_feedback(client, out):
    graded_class(out)
    where = ask(client)
    page = client.get(where).text
    assert '<option value="test_sums">test_sums</option>' in page
    csrf = Gate(TOKEN, frozenset({HOST})).csrf()
    reply = {"csrf": csrf, "reply": "the shape check was too strict; it passes", "test": "test_sums"}
    wrong = client.post(where, data=reply | {"test": "test_other"}, headers={"origin": ORIGIN})
    assert wrong.status_code == 400 and "not a test of this unit" in wrong.text
    assert not (out / "course" / "overrides.csv").exists()
    before = grades(graded_with_the_kept_state(out))["bob", str(LAB)]
    answered = client.post(
        where, data=reply | {"status": "passed"}, headers={"origin": ORIGIN}, follow_redirects=False
    )
    assert answered.status_code == 303
    kept = (out / "course" / "overrides.csv").read_text().splitlines()
    assert kept == [
        "student,lab,points,test,status,comment",
        f"bob,{LAB},,test_sums,passed,the shape check was too strict; it passes",
    ]
    assert json.loads((out / "course" / "manifest.json").read_text())["inputs"]["overrides"]["from"] == (
        "make review"
    )
    events = [json.loads(line) for line in (out / "course" / "regrades.jsonl").read_text().splitlines()]
    assert (events[-1]["test"], events[-1]["status"]) == ("test_sums", "passed")
    results = graded_with_the_kept_state(out)
    after = grades(results)["bob", str(LAB)]
    assert float(before["points"]) < float(after["points"]) == float(after["max_points"])
    assert "the shape check was too strict" in after["overridden"]
    assert "the shape check was too strict; it passes" in markdown.feedback(results, "bob")
    again = client.post(
        where, data=reply | {"status": "failed", "reply": "on second look, no"}, headers={"origin": ORIGIN}
    )
    assert again.status_code == 200 and "test_sums set failed" in again.text
    kept = (out / "course" / "overrides.csv").read_text().splitlines()
    assert kept[1:] == [f'bob,{LAB},,test_sums,failed,"on second look, no"']  # the line replaced, not doubled


# ----------------------------------------------------------------------------------------
# A grading run started while the page is open: it keeps its inputs under the page's lock.
# ----------------------------------------------------------------------------------------


def a_run_begins(out: Path, **given: Path) -> course_mod.State:
    """The course state as a grading run reads it when it starts (labkit/grading/grade.py)."""
    state, _ = inputs.read(out, None, dict.fromkeys(course_mod.INPUTS) | given, "", False)
    return state


def give(client, number: int, points: str) -> None:
    page = client.get(f"/lab/{LAB}/{number}").text
    assert post(client, LAB, number, form(page, points_1=points)).status_code == 303


def test_points_saved_while_a_grading_run_starts_are_kept(client, out, tmp_path):
    give(client, 1, "2")
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("student,lab,points,test,status,comment\nalice,9,3,,,by hand\n")
    state = a_run_begins(out, overrides=overrides)  # reads the adjustments with answer 1's points
    give(client, 2, "1")  # saved on the page while the run reads its submissions
    handin.save_state(state, io.StringIO())  # the run keeps its inputs: the overrides are new
    graded = {(a["student"], a["points"]) for a in kept(out)}
    assert graded == {(student_of(out, 1), 2), (student_of(out, 2), 1)}
    assert (out / "course" / "overrides.csv").read_text() == overrides.read_text()
    assert set(json.loads((out / "course" / "manifest.json").read_text())["inputs"]) >= {
        "adjustments",
        "overrides",
    }


def test_a_first_point_saved_while_a_grading_run_starts_stays_named(client, out, tmp_path):
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("student,lab,points,test,status,comment\nalice,9,3,,,by hand\n")
    state = a_run_begins(out, overrides=overrides)  # no adjustments kept yet
    give(client, 1, "2")
    handin.save_state(state, io.StringIO())
    assert [(a["student"], a["points"]) for a in kept(out)] == [(student_of(out, 1), 2)]
    assert "adjustments" in json.loads((out / "course" / "manifest.json").read_text())["inputs"]


def test_a_run_that_adds_to_adjustments_saved_meanwhile_is_refused_and_replaces_nothing(
    client, out, tmp_path
):
    give(client, 1, "2")
    extra = tmp_path / "extra.csv"
    extra.write_text(f"student,lab,points,comment,item,max\nbob,{LAB},1,a bonus,,\n")
    state = a_run_begins(out, adjustments=Path(f"+{extra}"))
    give(client, 2, "1")
    with pytest.raises(GradeError, match="changed while this run read its inputs"):
        handin.save_state(state, io.StringIO())
    assert {(a["student"], a["points"]) for a in kept(out)} == {
        (student_of(out, 1), 2),
        (student_of(out, 2), 1),
    }
    state = a_run_begins(out, adjustments=Path(f"+{extra}"))  # the command again: from the file as it is now
    handin.save_state(state, io.StringIO())
    assert {(a["student"], a["points"]) for a in kept(out)} == {
        (student_of(out, 1), 2),
        (student_of(out, 2), 1),
        ("bob", 1),
    }


def test_a_grading_run_writes_its_inputs_under_the_pages_lock(client, out, tmp_path, monkeypatch):
    give(client, 1, "2")
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("student,lab,points,test,status,comment\nalice,9,3,,,by hand\n")
    state = a_run_begins(out, overrides=overrides)
    held = []
    write = course_mod.write_atomic

    def write_and_try_the_lock(path, text):
        fd = os.open(out / "course", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)  # the review page's save would wait here
        finally:
            os.close(fd)
        write(path, text)

    monkeypatch.setattr(course_mod, "write_atomic", write_and_try_the_lock)
    handin.save_state(state, io.StringIO())
    assert held and all(held)
    assert (out / "course" / "adjustments.csv").exists()
