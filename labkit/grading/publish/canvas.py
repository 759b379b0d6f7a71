"""Canvas through its REST API (canvasapi), for a course with an API token; the CSV files stay the offline path.

    python -m labkit canvas roster  --url https://canvas.uni.edu --course 1234 --out roster.csv
    python -m labkit canvas collect --url ... --course 1234 --roster roster.csv --out canvas-submissions
    python -m labkit canvas push scoreboard --url ... --course 1234 [--apply] [--comments]

The token is read from the environment variable CANVAS_TOKEN (Account > Settings > New access
token), sent only as `Authorization: Bearer` to the course's https:// address, and never printed.

- roster: the course's students (GET /api/v1/courses/:id/search_users, enrollment_type[]=student),
  with their Canvas user id (lms_id), SIS User ID (the kit's student id; the login id where a
  student has none), email and section, as the kit's roster CSV (labkit/grading/state/roster.py).
- collect: for each lab with a `canvas_id` in the policy, every submission of that assignment
  (GET .../assignments/:id/submissions) with its notebook, written as a download that `make grade
  SUBMISSIONS=FOLDER` reads (labkit/grading/intake/lms.py): the notebooks, and `canvas_submissions.json`
  with each one's real `submitted_at`, so a late penalty counts the time late, not a flat day.
- push: each lab's points (times its weight, as the CSV export) beside what Canvas has now, and
  only the differences; with --apply they are sent in one bulk update per assignment
  (POST .../submissions/update_grades, grade_data[<user id>][posted_grade]). With --comments each
  graded lab's feedback, that lab's alone, is attached to the student's submission of it as a comment
  (PUT .../submissions/:user_id, comment[text_comment]) ending with the kit's mark; a later push leaves
  the same text as it is and replaces a changed one (PUT .../submissions/:user_id/comments/:id).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

from labkit.exitcodes import ExitCode
from labkit.grading.state import policy
from labkit.grading.state.files import write_atomic

TOKEN_VARIABLE = "CANVAS_TOKEN"
MANIFEST = "canvas_submissions.json"  # what `collect` writes beside the notebooks; lms.py reads it
LOCAL = ("127.0.0.1", "localhost", "[::1]")
MAX_NOTEBOOK = 200_000_000  # as lms.MAX_FILE


class CanvasError(RuntimeError):
    """Canvas cannot be used as asked: the message says why and what to do (never the token)."""


def connect(url: str, course_id: int | str, environ=os.environ):
    """The course, through canvasapi, with the token from CANVAS_TOKEN."""
    from urllib.parse import urlsplit

    import canvasapi
    from canvasapi import exceptions

    token = environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise CanvasError(
            f"no Canvas token: set {TOKEN_VARIABLE} to an access token of a teacher or TA of the "
            "course (Canvas: Account > Settings > New access token); it is never printed"
        )
    parts = urlsplit(url)
    if parts.scheme != "https" and not (
        parts.scheme == "http" and parts.hostname in {h.strip("[]") for h in LOCAL}
    ):
        raise CanvasError(f"{url}: the token is only sent over https:// (give the address as https://...)")
    if parts.path not in ("", "/"):
        raise CanvasError(
            f"{url}: give the Canvas site's address alone (https://canvas.uni.edu), not a page of it"
        )
    try:
        with (
            warnings.catch_warnings()
        ):  # its warning on http://, which is only ever this machine's (a test's)
            warnings.simplefilter("ignore", UserWarning)
            site = canvasapi.Canvas(url.rstrip("/"), token)
        return site.get_course(int(course_id))
    except (exceptions.InvalidAccessToken, exceptions.Unauthorized):
        raise CanvasError(
            f"Canvas refused the token in {TOKEN_VARIABLE} for course {course_id}: it has expired, "
            "or its user does not teach the course"
        ) from None
    except exceptions.ResourceDoesNotExist:
        raise CanvasError(f"{url} has no course {course_id} (the number in the course's address)") from None
    except (exceptions.CanvasException, OSError, ValueError) as e:
        raise CanvasError(
            f"Canvas at {url} could not be reached or answered an error: {_safe(e, token)}"
        ) from None


def _safe(error: Exception, token: str) -> str:
    return str(error).replace(token, "<token>") if token else str(error)


def _call(what: str, fn, *args, **kwargs):
    """A canvasapi call whose errors become a CanvasError naming `what` (lists are read whole here)."""
    from canvasapi import exceptions

    try:
        found = fn(*args, **kwargs)
        return (
            list(found) if hasattr(found, "__iter__") and not isinstance(found, (dict, str, bytes)) else found
        )
    except (exceptions.CanvasException, OSError) as e:
        raise CanvasError(
            f"Canvas could not {what}: {_safe(e, os.environ.get(TOKEN_VARIABLE, ''))}"
        ) from None


def _request(course, what: str, method: str, endpoint: str, **fields):
    """A request canvasapi has no method for (the token's user, editing a comment), through its requester."""
    from canvasapi import exceptions

    try:
        return course._requester.request(method, endpoint, **fields)
    except (exceptions.CanvasException, OSError) as e:
        raise CanvasError(
            f"Canvas could not {what}: {_safe(e, os.environ.get(TOKEN_VARIABLE, ''))}"
        ) from None


# ----------------------------------------------------------------------------------------
# The roster.
# ----------------------------------------------------------------------------------------


def roster_csv(course) -> tuple[str, list[str]]:
    """(the kit's roster CSV of the course's students, notes on students left out)."""
    import csv
    import io

    from labkit.grading.publish.scoreboard import _cell

    sections = {s.id: s.name for s in _call("list the course's sections", course.get_sections)}
    users = _call(
        "list the course's students",
        course.get_users,
        enrollment_type=["student"],
        include=["email", "enrollments"],
    )
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student", "name", "email", "lms_id", "section"])
    notes = []
    for user in sorted(users, key=lambda u: u.id):
        sid = str(getattr(user, "sis_user_id", None) or getattr(user, "login_id", None) or "")
        name = getattr(user, "sortable_name", None) or getattr(user, "name", "")
        if not sid:
            notes.append(
                f"{name} (Canvas user {user.id}): neither a SIS User ID nor a login id, left out; add them "
                "to the roster by hand"
            )
            continue
        section = next(
            (
                sections.get(e.get("course_section_id"), "")
                for e in getattr(user, "enrollments", None) or []
                if e.get("type") == "StudentEnrollment"
            ),
            "",
        )
        w.writerow(
            [_cell(sid), _cell(name), _cell(getattr(user, "email", "") or ""), user.id, _cell(section)]
        )
    return buf.getvalue(), notes


# ----------------------------------------------------------------------------------------
# Submissions, with their real times.
# ----------------------------------------------------------------------------------------


def collect(course, people, grading: policy.Policy, into: Path, labs: list[int] | None = None) -> list[str]:
    """Each lab's notebooks into INTO as a download lms.py reads, with MANIFEST; notes on what was left out."""
    if not grading.canvas:
        raise CanvasError(
            "the policy gives no lab a canvas_id ([labs.N] canvas_id = the assignment's number): "
            "the kit cannot tell which Canvas assignment is which lab"
        )
    by_lms = people.by("lms_id")
    manifest: dict[str, dict] = {}
    notes = []
    into = Path(into)
    for lab, assignment_id in sorted(grading.canvas.items()):
        if labs and lab not in labs:
            continue
        assignment = _call(
            f"read assignment {assignment_id} (lab {lab})", course.get_assignment, assignment_id
        )
        for sub in _call(f"list the submissions of assignment {assignment_id}", assignment.get_submissions):
            if getattr(sub, "workflow_state", "") == "unsubmitted" or not getattr(sub, "submitted_at", None):
                continue
            student = by_lms.get(str(sub.user_id))
            data, why = _notebook(course, sub, student, lab)
            if data is None:
                notes.append(why)
                continue
            name = f"{student}/lab-{lab}.ipynb"
            write_atomic(into / name, data)
            manifest[name] = {
                "user_id": str(sub.user_id),
                "lab": lab,
                "assignment": assignment_id,
                "submitted_at": sub.submitted_at,
                "late": bool(getattr(sub, "late", False)),
                "seconds_late": getattr(sub, "seconds_late", None),
                "attempt": getattr(sub, "attempt", None),
            }
    write_atomic(
        into / MANIFEST,
        json.dumps({"format": 1, "source": "canvas-api", "submissions": manifest}, indent=1, sort_keys=True)
        + "\n",
    )
    return notes


def _notebook(course, sub, student: str | None, lab: int) -> tuple[bytes | None, str]:
    """A submission's one notebook, downloaded; or None and the note that says why it is not graded."""
    if student is None:
        return None, f"lab-{lab}: Canvas user {sub.user_id} is on no roster line (column lms_id): not graded"
    files = [
        a for a in getattr(sub, "attachments", None) or [] if str(_attr(a, "filename")).endswith(".ipynb")
    ]
    if len(files) != 1:
        return None, (
            f"lab-{lab}: {student} handed in {len(files)} notebooks (.ipynb) on Canvas: "
            f"{'none' if not files else 'which one is the lab cannot be told'}; not graded"
        )
    if not _same_site(_attr(files[0], "url"), course):
        return None, (
            f"lab-{lab}: {student}'s notebook is at another site than the course's: not fetched "
            "(the token is only sent to the Canvas site); download it by hand"
        )
    data = _call(f"download {student}'s notebook for lab {lab}", files[0].get_contents, binary=True)
    if len(data) > MAX_NOTEBOOK:
        return None, f"lab-{lab}: {student}'s notebook is over {MAX_NOTEBOOK} bytes: not graded"
    return data, ""


def _same_site(url, course) -> bool:
    from urllib.parse import urlsplit

    there, home = urlsplit(str(url or "")), urlsplit(course._requester.base_url)
    return (there.scheme, there.netloc) == (home.scheme, home.netloc)


def _attr(thing, name: str):
    return thing.get(name) if isinstance(thing, dict) else getattr(thing, name, None)


# ----------------------------------------------------------------------------------------
# Grades and feedback back to Canvas.
# ----------------------------------------------------------------------------------------


def differences(course, results: dict, excused: bool = False) -> list[dict]:
    """Per lab with a canvas_id and per student with an lms_id: what Canvas has and what the kit gives, where they differ."""
    from labkit.grading.publish.gradebook import _weighted

    grading = policy.Policy.from_json(results.get("policy"))
    grades = policy.grades(results)
    out = []
    for lab, assignment_id in sorted(grading.canvas.items()):
        assignment = _call(
            f"read assignment {assignment_id} (lab {lab})", course.get_assignment, assignment_id
        )
        now = {
            str(s.user_id): s
            for s in _call(f"list the submissions of assignment {assignment_id}", assignment.get_submissions)
        }
        for student, mine in sorted(grades["students"].items()):
            user = results.get("students", {}).get(student, {}).get("lms_id")
            p = mine["labs"].get(str(lab))
            if not user or p is None:
                continue
            if p["status"] == "missing" and "overridden" not in p:
                if not excused:
                    continue  # left as Canvas has it, as the CSV export's blank
                kit = "EX"
            else:
                kit = str(_weighted(p, "points"))
            there = now.get(str(user))
            canvas_has = (
                ("EX" if getattr(there, "excused", False) else _number(getattr(there, "score", None)))
                if there is not None
                else None
            )
            if canvas_has != kit:
                out.append(
                    {
                        "lab": lab,
                        "assignment": assignment_id,
                        "student": student,
                        "user_id": str(user),
                        "canvas": canvas_has,
                        "kit": kit,
                        "assignment_object": assignment,
                    }
                )
    return out


def _number(score) -> str | None:
    if score is None:
        return None
    value = float(score)
    return str(int(value)) if value.is_integer() else str(round(value, 4))


def apply(changes: list[dict]) -> list:
    """One bulk update per assignment (grade_data[<user id>][posted_grade], or [excuse] for EX); Canvas's Progress objects."""
    by_assignment: dict[int, list[dict]] = {}
    for change in changes:
        by_assignment.setdefault(change["assignment"], []).append(change)
    done = []
    for assignment_id, items in sorted(by_assignment.items()):
        data = {
            c["user_id"]: ({"excuse": "true"} if c["kit"] == "EX" else {"posted_grade": c["kit"]})
            for c in items
        }
        done.append(
            _call(
                f"update the grades of assignment {assignment_id}",
                items[0]["assignment_object"].submissions_bulk_update,
                grade_data=data,
            )
        )
    return done


MARK = "(the kit's feedback on lab {lab}: a regrade replaces this comment)"  # how the kit finds its own


def one_lab(results: dict, lab: int) -> dict:
    """The results as one lab's feedback reads them: that lab's rows, TA's inputs and notes alone (a note of
    the whole class or of no lab in particular stays)."""
    import re

    def mine(note) -> bool:
        found = re.match(r"lab-(\d+)\b", str(note))
        return found is None or int(found.group(1)) == lab

    out = dict(results)
    out["labs"] = [x for x in results.get("labs", []) if x.get("number") == lab]
    out["rows"] = [r for r in results.get("rows", []) if r.get("lab") == lab]
    for key in ("overrides", "adjustments"):
        if key in results:
            out[key] = [x for x in results[key] if x.get("lab") == lab]
    if "extensions" in results:
        out["extensions"] = {
            s: {k: v for k, v in by.items() if str(k) == str(lab)} for s, by in results["extensions"].items()
        }
    out["students"] = {
        s: info | {"notes": [n for n in info.get("notes", []) if mine(n)]}
        for s, info in results.get("students", {}).items()
    }
    return out


def comment(course, results: dict, text_of) -> dict[str, int]:
    """Each student's feedback on each graded lab (`text_of(student, lab)`) as a comment on their submission.

    Only labs this folder graded and the policy gives a `canvas_id`, only students the lab has a grade for.
    Each comment ends with the kit's mark (MARK), so a later push finds the kit's own comment (one the
    token's user wrote with that mark, never a student's): the same text is left as it is, a changed one
    replaces it (PUT .../comments/:id), and only a lab without one gets a new comment. Counts by outcome.
    """
    grading = policy.Policy.from_json(results.get("policy"))
    grades = policy.grades(results)
    graded = {x.get("number") for x in results.get("labs", [])}
    me = _request(course, "read the token's own user", "GET", "users/self").json().get("id")
    if me is None:
        raise CanvasError(
            "Canvas did not say which user the token is (GET /api/v1/users/self): no comment sent"
        )
    counts = {"sent": 0, "replaced": 0, "kept": 0}
    for lab, assignment_id in sorted(grading.canvas.items()):
        if lab not in graded:
            continue
        assignment = _call(
            f"read assignment {assignment_id} (lab {lab})", course.get_assignment, assignment_id
        )
        now = {
            str(s.user_id): s
            for s in _call(
                f"list the submissions of assignment {assignment_id}",
                assignment.get_submissions,
                include=["submission_comments"],
            )
        }
        for student, info in sorted(results.get("students", {}).items()):
            user = str(info.get("lms_id") or "")
            entry = grades["students"].get(student, {}).get("labs", {}).get(str(lab))
            if (
                user not in now
                or entry is None
                or (entry["status"] == "missing" and "overridden" not in entry)
            ):
                continue
            outcome = _comment_one(course, assignment_id, now[user], me, student, lab, text_of(student, lab))
            counts[outcome] += 1
    return counts


def _comment_one(course, assignment_id, submission, me, student: str, lab: int, feedback: str) -> str:
    """One student's comment on one lab: "kept" (the kit's own comment says this already), "replaced" (the kit's
    latest comment edited in place) or "sent" (a new one). Only a comment the token's user wrote with the kit's
    mark is ever the kit's own."""
    user = submission.user_id
    mark = MARK.format(lab=lab)
    text = f"{feedback.rstrip()}\n\n{mark}"
    ours = [
        c
        for c in getattr(submission, "submission_comments", None) or []
        if c.get("author_id") == me and str(c.get("comment", "")).endswith(mark)
    ]
    if any(c.get("comment") == text for c in ours):
        return "kept"
    if ours:
        latest = max(ours, key=lambda c: (str(c.get("created_at") or ""), c.get("id") or 0))
        _request(
            course,
            f"replace the kit's comment on {student}'s submission of lab {lab}",
            "PUT",
            f"courses/{course.id}/assignments/{assignment_id}/submissions/{user}/comments/{latest['id']}",
            comment=text,
        )
        return "replaced"
    _call(f"comment on {student}'s submission of lab {lab}", submission.edit, comment={"text_comment": text})
    return "sent"


def show(changes: list[dict], stream=sys.stdout) -> None:
    if not changes:
        print("Canvas already has every grade the kit gives: nothing to change.", file=stream)
        return
    print(
        f"{len(changes)} grade{'s' if len(changes) != 1 else ''} differ (lab, student, Canvas now -> the kit's):",
        file=stream,
    )
    for c in changes:
        print(
            f"  lab-{c['lab']}  {c['student']:<20} {c['canvas'] if c['canvas'] is not None else '(none)':>8} -> "
            f"{c['kit']}",
            file=stream,
        )


# ----------------------------------------------------------------------------------------
# The command line: python -m labkit canvas roster|collect|push.
# ----------------------------------------------------------------------------------------


def add_parser(sub) -> None:
    canvas = sub.add_parser(
        "canvas", help=f"Canvas through its API (token in {TOKEN_VARIABLE}): roster, collect, push"
    )
    steps = canvas.add_subparsers(dest="step", required=True)

    def common(p) -> None:
        p.add_argument("--url", required=True, help="the Canvas site, https://canvas.uni.edu")
        p.add_argument("--course", required=True, type=int, help="the course's number (in its address)")

    r = steps.add_parser("roster", help="the course's students as the kit's roster CSV, with SIS ids")
    common(r)
    r.add_argument("--out", required=True, type=Path, help="the roster CSV to write")
    r.set_defaults(func=_roster)
    c = steps.add_parser(
        "collect", help="each lab's notebooks with their real submission times, for `make grade`"
    )
    common(c)
    c.add_argument("--roster", required=True, type=Path)
    c.add_argument(
        "--policy", type=Path, default=None, help="the policy whose [labs.N] canvas_id name the assignments"
    )
    c.add_argument(
        "--labs", default=None, help="comma-separated lab numbers (default: every one with a canvas_id)"
    )
    c.add_argument(
        "--out", required=True, type=Path, help="the folder to write (then: make grade SUBMISSIONS=OUT)"
    )
    c.set_defaults(func=_collect)
    p = steps.add_parser(
        "push", help="grades (and feedback) of a graded folder to Canvas: the differences first"
    )
    common(p)
    p.add_argument("folder", type=Path, help="the --out folder of a grading run")
    p.add_argument("--apply", action="store_true", help="send the differences (without it: only show them)")
    p.add_argument(
        "--comments",
        action="store_true",
        help="with --apply: each graded lab's feedback, that lab's alone, as a comment (a changed one replaces the kit's own)",
    )
    p.add_argument(
        "--missing",
        choices=("blank", "excused"),
        default="blank",
        help="a lab not handed in: left as Canvas has it, or excused (default %(default)s)",
    )
    p.set_defaults(func=_push)


def _roster(args) -> int:
    text, notes = roster_csv(connect(args.url, args.course))
    write_atomic(args.out, text)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{text.count(chr(10)) - 1} students written to {args.out}")
    return ExitCode.OK


def _collect(args) -> int:
    from labkit.grading.state import roster

    people = roster.load(args.roster)
    grading = policy.load(args.policy)
    try:
        labs = [int(x) for x in args.labs.split(",")] if args.labs else None
    except ValueError:
        raise CanvasError(f"--labs {args.labs}: expected lab numbers such as 3,5") from None
    notes = collect(connect(args.url, args.course), people, grading, args.out, labs)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"collected into {args.out}; grade it with: make grade SUBMISSIONS={args.out} ROSTER={args.roster}")
    return ExitCode.OK


def _push(args) -> int:
    from labkit.grading.publish import markdown, scoreboard

    results = scoreboard.read(args.folder)
    if results.get("provisional"):
        raise CanvasError(
            f"these grades are {results['provisional']}: grade again with every required "
            "configuration before sending them to Canvas"
        )
    course = connect(args.url, args.course)
    changes = differences(course, results, excused=args.missing == "excused")
    show(changes)
    if not args.apply:
        if changes:
            print("A dry run: nothing was sent. Send these with --apply.")
        return ExitCode.OK
    apply(changes)
    print(f"sent {len(changes)} grade{'s' if len(changes) != 1 else ''} to Canvas")
    if args.comments:
        counts = comment(course, results, lambda s, lab: markdown.feedback(one_lab(results, lab), s))
        print(
            f"feedback: {counts['sent']} comment{'s' if counts['sent'] != 1 else ''} sent, "
            f"{counts['replaced']} replaced (changed since the last push), {counts['kept']} already on Canvas"
        )
    return ExitCode.OK
