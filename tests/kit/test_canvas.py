"""Canvas through its API (labkit/grading/publish/canvas.py), against a stand-in for Canvas on 127.0.0.1.

The stand-in answers the requests of Canvas's documented REST API that the kit makes, records each
one (method, path, query and form fields, the Authorization header), and answers 404 to anything
else, so each test checks the exact requests: paths, methods, `grade_data[<user id>][posted_grade]`,
`comment[text_comment]`, pagination through Link headers, `Authorization: Bearer`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from labkit.grading.intake import lms
from labkit.grading.publish import canvas
from labkit.grading.state import policy, roster

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-7"
ME = 900  # the token's user: the TA
COURSE = 1234
NB = json.dumps({"cells": [], "metadata": {"tag": "alice"}, "nbformat": 4, "nbformat_minor": 5})
USERS = [  # two pages of search_users
    [
        {
            "id": 4411,
            "name": "Alice Liddell",
            "sortable_name": "Liddell, Alice",
            "sis_user_id": "alice",
            "login_id": "alice@u.edu",
            "email": "alice@u.edu",
            "enrollments": [{"type": "StudentEnrollment", "course_section_id": 7}],
        }
    ],
    [
        {
            "id": 4412,
            "name": "Bob Marley",
            "sortable_name": "Marley, Bob",
            "sis_user_id": None,
            "login_id": "bob",
            "email": "bob@u.edu",
            "enrollments": [{"type": "StudentEnrollment", "course_section_id": 8}],
        },
        {"id": 4413, "name": "No Id", "sortable_name": "Id, No", "sis_user_id": None, "login_id": None},
    ],
]


class Canvas:
    def __init__(self):
        self.requests: list[dict] = []
        self.submissions = {  # assignment 555 = lab 3
            4411: {
                "id": 1,
                "user_id": 4411,
                "assignment_id": 555,
                "workflow_state": "submitted",
                "submitted_at": "2026-03-04T10:00:00Z",
                "late": True,
                "seconds_late": 200000,
                "score": None,
                "attachments": [
                    {
                        "id": 91,
                        "filename": "lab-3.ipynb",
                        "display_name": "lab-3.ipynb",
                        "url": "@/files/91/download?verifier=abc",
                    }
                ],
                "submission_comments": [],
            },
            4412: {
                "id": 2,
                "user_id": 4412,
                "assignment_id": 555,
                "workflow_state": "graded",
                "submitted_at": None,
                "late": False,
                "score": 2.0,
                "attachments": [],
                "submission_comments": [{"comment": "FEEDBACK bob"}],
            },
        }

    def answer(self, handler, method: str):
        parts = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode() if length else ""
        self.requests.append(
            {
                "method": method,
                "path": parts.path,
                "query": parse_qs(parts.query),
                "form": parse_qs(body),
                "auth": handler.headers.get("Authorization"),
            }
        )
        base = f"/api/v1/courses/{COURSE}"
        me = f"http://127.0.0.1:{handler.server.server_port}"
        page = int(parse_qs(parts.query).get("page", ["1"])[0])
        routes = {
            ("GET", base): ({"id": COURSE, "name": "SPMD"}, None),
            ("GET", f"{base}/sections"): ([{"id": 7, "name": "A"}, {"id": 8, "name": "B"}], None),
            ("GET", f"{base}/search_users"): (
                USERS[page - 1],
                f'<{me}{base}/search_users?page={page + 1}>; rel="next"' if page < len(USERS) else None,
            ),
            ("GET", f"{base}/assignments/555"): ({"id": 555, "course_id": COURSE, "name": "Lab 3"}, None),
            ("GET", f"{base}/assignments/555/submissions"): (
                [json.loads(json.dumps(s).replace('"@/', f'"{me}/')) for s in self.submissions.values()],
                None,
            ),
            ("POST", f"{base}/assignments/555/submissions/update_grades"): (
                {"id": 77, "workflow_state": "queued", "url": f"{me}/api/v1/progress/77"},
                None,
            ),
            ("GET", "/files/91/download"): (NB, None),
        }
        routes["GET", "/api/v1/users/self"] = ({"id": ME, "name": "The TA"}, None)
        for user in self.submissions:
            routes["PUT", f"{base}/assignments/555/submissions/{user}"] = (self.submissions[user], None)
            for c in self.submissions[user]["submission_comments"]:
                if "id" in c:
                    routes["PUT", f"{base}/assignments/555/submissions/{user}/comments/{c['id']}"] = (c, None)
        self._keep_comments(method, parts.path, parse_qs(body), base)
        found = routes.get((method, parts.path))
        if found is None or handler.headers.get("Authorization") != f"Bearer {TOKEN}":
            handler.send_response(404 if found is None else 401)
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
            handler.wfile.write(json.dumps({"errors": [{"message": "not found"}]}).encode())
            return
        data, link = found
        raw = data.encode() if isinstance(data, str) else json.dumps(data).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if link:
            handler.send_header("Link", link)
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def _keep_comments(self, method: str, path: str, form: dict, base: str) -> None:
        """Canvas's side of a comment: a new one kept as the token's user's, an edited one changed."""
        if method != "PUT" or not path.startswith(f"{base}/assignments/555/submissions/"):
            return
        parts = path.split("/")
        user = int(parts[8])
        comments = self.submissions.get(user, {}).get("submission_comments", [])
        if len(parts) == 9 and "comment[text_comment]" in form:
            comments.append(
                {"id": 100 + len(self.requests), "author_id": ME, "comment": form["comment[text_comment]"][0]}
            )
        elif len(parts) == 11 and "comment" in form:
            for c in comments:
                if str(c.get("id")) == parts[10]:
                    c["comment"] = form["comment"][0]

    def calls(self, method: str | None = None) -> list[dict]:
        return [r for r in self.requests if method is None or r["method"] == method]


@pytest.fixture
def standin():
    state = Canvas()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state.answer(self, "GET")

        def do_POST(self):
            state.answer(self, "POST")

        def do_PUT(self):
            state.answer(self, "PUT")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}"
    yield state
    server.shutdown()
    server.server_close()


def course_of(standin):
    return canvas.connect(standin.url, COURSE, environ={canvas.TOKEN_VARIABLE: TOKEN})


def test_the_token_comes_from_the_environment_goes_as_a_bearer_header_and_only_over_https(standin):
    with pytest.raises(canvas.CanvasError, match="set CANVAS_TOKEN"):
        canvas.connect(standin.url, COURSE, environ={})
    with pytest.raises(canvas.CanvasError, match="only sent over https"):
        canvas.connect("http://canvas.uni.edu", COURSE, environ={canvas.TOKEN_VARIABLE: TOKEN})
    course_of(standin)
    assert standin.calls() and all(r["auth"] == f"Bearer {TOKEN}" for r in standin.calls())
    with pytest.raises(canvas.CanvasError) as refused:
        canvas.connect(standin.url, COURSE, environ={canvas.TOKEN_VARIABLE: "wrong"})
    assert "wrong" not in str(refused.value)


def test_the_roster_reads_every_page_with_sis_ids_emails_and_sections(standin):
    text, notes = canvas.roster_csv(course_of(standin))
    people = roster.parse(text, "from Canvas")
    assert people.students["alice"] == {
        "name": "Liddell, Alice",
        "email": "alice@u.edu",
        "lms_id": "4411",
        "section": "A",
    }
    assert people.students["bob"]["lms_id"] == "4412" and people.students["bob"]["section"] == "B"
    assert len(notes) == 1 and "4413" in notes[0]
    users = [r for r in standin.calls("GET") if r["path"].endswith("/search_users")]
    assert len(users) == 2, "the second page, named by the Link header, is read"
    assert users[0]["query"]["enrollment_type[]"] == ["student"]
    assert set(users[0]["query"]["include[]"]) == {"email", "enrollments"}


def test_collect_writes_the_notebooks_with_their_real_canvas_times(standin, tmp_path):
    people = roster.parse("student,lms_id\nalice,4411\nbob,4412\n")
    notes = canvas.collect(course_of(standin), people, policy.Policy(canvas={3: 555}), tmp_path / "c")
    assert (tmp_path / "c" / "alice" / "lab-3.ipynb").read_text() == NB
    assert notes == [], notes  # bob's submission was never handed in: nothing to say
    found = lms.collect(tmp_path / "c", people, tmp_path / "into", [3])
    assert found.files["alice", 3]["times"] == {"canvas": "2026-03-04T10:00:00Z"}
    paths = [r["path"] for r in standin.calls("GET")]
    assert f"/api/v1/courses/{COURSE}/assignments/555/submissions" in paths and "/files/91/download" in paths


def results_for_push() -> dict:
    ref = [
        {
            "student": "reference",
            "lab": 3,
            "config": "cpu-1",
            "status": "ok",
            "passed": 1,
            "total": 1,
            "message": "",
            "tests": [
                {
                    "test": "test_a",
                    "exercise": "f",
                    "file": "t.py",
                    "hidden": False,
                    "status": "passed",
                    "message": "",
                    "points": 5,
                }
            ],
            "cell_errors": [],
            "notes": [],
        }
    ]
    rows = [
        dict(ref[0], student="alice"),
        dict(
            ref[0],
            student="bob",
            status="failed",
            passed=0,
            tests=[dict(ref[0]["tests"][0], status="failed")],
        ),
    ]
    return {
        "format": 1,
        "labs": [
            {
                "number": 3,
                "name": "lab-3",
                "title": "Lab 3",
                "tests": policy.lab_tests(ref)[3],
                "max_points": 5,
            }
        ],
        "configs": [{"name": "cpu-1", "summary": "", "devices": 1}],
        "students": {"alice": {"notes": [], "lms_id": "4411"}, "bob": {"notes": [], "lms_id": "4412"}},
        "notes": [],
        "rows": rows,
        "policy": policy.Policy(canvas={3: 555}).to_json(),
    }


def test_push_shows_the_differences_and_a_dry_run_sends_nothing(standin):
    changes = canvas.differences(course_of(standin), results_for_push())
    assert [(c["student"], c["canvas"], c["kit"]) for c in changes] == [
        ("alice", None, "5"),
        ("bob", "2", "0"),
    ]
    assert not standin.calls("POST") and not standin.calls("PUT")


def test_push_sends_the_differences_in_one_bulk_update_as_canvas_documents_it(standin):
    course = course_of(standin)
    canvas.apply(canvas.differences(course, results_for_push()))
    (post,) = standin.calls("POST")
    assert post["path"] == f"/api/v1/courses/{COURSE}/assignments/555/submissions/update_grades"
    assert post["form"] == {"grade_data[4411][posted_grade]": ["5"], "grade_data[4412][posted_grade]": ["0"]}


def pushed(standin, text_of, labs=(3,)):
    results = results_for_push()
    results["policy"] = policy.Policy(
        canvas={3: 555, 5: 556}
    ).to_json()  # lab 5 has an assignment, not graded
    return canvas.comment(course_of(standin), results, text_of)


def test_feedback_goes_to_the_graded_labs_alone_each_that_labs_own_and_once(standin):
    counts = pushed(standin, lambda s, lab: f"FEEDBACK {s} lab {lab}")
    assert counts == {"sent": 2, "replaced": 0, "kept": 0}
    puts = standin.calls("PUT")
    assert [p["path"] for p in puts] == [
        f"/api/v1/courses/{COURSE}/assignments/555/submissions/4411",
        f"/api/v1/courses/{COURSE}/assignments/555/submissions/4412",
    ]
    assert puts[0]["form"] == {
        "comment[text_comment]": [f"FEEDBACK alice lab 3\n\n{canvas.MARK.format(lab=3)}"]
    }
    assert not [r for r in standin.requests if "/assignments/556" in r["path"]]  # lab 5: not graded here
    listed = [r for r in standin.calls("GET") if r["path"].endswith("/submissions")]
    assert listed[-1]["query"]["include[]"] == ["submission_comments"]
    assert pushed(standin, lambda s, lab: f"FEEDBACK {s} lab {lab}") == {"sent": 0, "replaced": 0, "kept": 2}
    assert len(standin.calls("PUT")) == 2  # the same text again: nothing sent


def test_a_changed_comment_replaces_the_kits_own_and_never_a_students(standin):
    pushed(standin, lambda s, lab: f"FEEDBACK {s}")
    forged = {"id": 7, "author_id": 4411, "comment": f"mine\n\n{canvas.MARK.format(lab=3)}"}
    standin.submissions[4411]["submission_comments"].append(forged)  # a student's comment with the mark
    before = len(standin.calls("PUT"))
    counts = pushed(standin, lambda s, lab: f"REGRADED {s}")
    assert counts == {"sent": 0, "replaced": 2, "kept": 0}
    edits = standin.calls("PUT")[before:]
    assert all("/comments/" in e["path"] and not e["path"].endswith("/comments/7") for e in edits)
    assert edits[0]["form"] == {"comment": [f"REGRADED alice\n\n{canvas.MARK.format(lab=3)}"]}
    texts = [c["comment"] for c in standin.submissions[4411]["submission_comments"]]
    assert texts.count(f"REGRADED alice\n\n{canvas.MARK.format(lab=3)}") == 1 and forged["comment"] in texts


def test_one_labs_feedback_names_no_other_lab_and_no_path_of_the_tas_machine():
    from labkit.grading.publish import markdown

    results = results_for_push()
    five = dict(results["labs"][0], number=5, name="lab-5", title="Lab 5")
    results["labs"].append(five)
    results["rows"] += [dict(r, lab=5) for r in results["rows"]]
    results["students"]["alice"]["notes"] = ["lab-5: credited with the submission of bob", "a class note"]
    results["policy"]["source"] = "/home/ta/cs101/private/policy.toml"
    whole = markdown.feedback(results, "alice")
    assert "Lab 5" in whole and "/home/ta" not in whole  # the whole course's feedback, no TA path either
    text = markdown.feedback(canvas.one_lab(results, 3), "alice")
    assert "Lab 5" not in text and "lab-5" not in text and "a class note" in text
    assert "/home/ta" not in text and "policy.toml" in text


def test_the_command_line_dry_run_never_prints_the_token(standin, tmp_path):
    from labkit.grading.publish import scoreboard

    scoreboard.write(results_for_push(), tmp_path / "board")
    env = {"PATH": "/usr/bin:/bin", canvas.TOKEN_VARIABLE: TOKEN}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkit",
            "canvas",
            "push",
            str(tmp_path / "board"),
            "--url",
            standin.url,
            "--course",
            str(COURSE),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "lab-3  alice" in done.stdout and "dry run" in done.stdout.lower()
    assert TOKEN not in done.stdout + done.stderr and not standin.calls("POST")


def test_the_command_line_sends_each_graded_labs_own_feedback_once(standin, tmp_path):
    from labkit.grading.publish import scoreboard

    results = results_for_push()
    results["policy"]["source"] = "/home/ta/cs101/policy.toml"
    scoreboard.write(results, tmp_path / "board")
    command = [
        sys.executable,
        "-m",
        "labkit",
        "canvas",
        "push",
        str(tmp_path / "board"),
        "--url",
        standin.url,
        "--course",
        str(COURSE),
        "--apply",
        "--comments",
    ]
    env = {"PATH": "/usr/bin:/bin", canvas.TOKEN_VARIABLE: TOKEN}
    for said in (
        "2 comments sent, 0 replaced",
        "0 comments sent, 0 replaced (changed since the last push), 2",
    ):
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        assert said in done.stdout, done.stdout
    (alice, _) = [c for c in standin.calls("PUT") if "comment[text_comment]" in c["form"]]
    text = alice["form"]["comment[text_comment]"][0]
    assert "Lab 3" in text and "/home/ta" not in text and text.endswith(canvas.MARK.format(lab=3))
