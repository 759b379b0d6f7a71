"""The review page's regrade requests (labkit/grading/review/regrades.py): the list and a form to enter one,
and each request beside the unit it is about, with the form that answers it.

    GET  /regrades        every request, open ones first, and the form for a new one
    POST /regrades        keep a new request
    GET  /regrades/N      request N beside the unit's rows (each configuration, each test's message) and
                          the notebook each configuration executed (labkit/grading/review/executed.py)
    POST /regrades/N      answer it: a reply, the points it adds or takes away (or none), and a test of the
                          unit set passed or failed (or none)
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from labkit.course import catalog
from labkit.grading.review import answers, executed, marks, regrades


def _class(review) -> list[str]:
    """The students a request may name: those of the last results and those with a write-up."""
    try:
        results = json.loads(regrades._read(review.out / regrades.RESULTS, regrades.MAX_BYTES) or "{}")
    except ValueError:
        results = {}
    named = set(results.get("students", {})) if isinstance(results, dict) else set()
    return sorted(named | review.students(answers.find(review.out)))


class Pages:
    """The regrade pages of `review` (app.Review), drawn with `draw`; `form` reads a posted form (or None)."""

    def __init__(self, review, draw: Callable[..., Response], csrf: str, form: Callable):
        self.review, self.draw, self.csrf, self.form = review, draw, csrf, form

    def routes(self) -> list[Route]:
        return [
            Route("/regrades", self.all_requests, methods=["GET"]),
            Route("/regrades", self.new_request, methods=["POST"]),
            Route("/regrades/{number:int}", self.show, methods=["GET"]),
            Route("/regrades/{number:int}", self.answer, methods=["POST"]),
        ]

    def listing(self, status: int = 200, problem: str = "") -> Response:
        requests = sorted(regrades.load(self.review.course), key=lambda r: (r.answered, r.id))
        labs = [lab.number for lab in catalog.labs()]
        students = _class(self.review)
        return self.draw(
            "regrades.html", status=status, requests=requests, students=students, labs=labs, problem=problem
        )

    async def all_requests(self, request: Request) -> Response:
        return await run_in_threadpool(self.listing)

    async def _posted(self, request: Request) -> dict[str, str] | None:
        posted = await self.form(request)
        return posted if posted is not None and posted.get("csrf") == self.csrf else None

    async def new_request(self, request: Request) -> Response:
        posted = await self._posted(request)
        if posted is None:
            return PlainTextResponse("this form is not the page's own: reload the page", status_code=403)
        student, lab, words = (
            posted.get("student", ""),
            posted.get("lab", ""),
            posted.get("words", "").strip(),
        )
        if student not in _class(self.review) or not lab.isdigit() or not words:
            return self.listing(400, "name a student of the class, a lab, and the student's words")
        number = await run_in_threadpool(
            regrades.add,
            self.review.course,
            self.review.who,
            student,
            int(lab),
            posted.get("about", ""),
            words,
        )
        return RedirectResponse(f"/regrades/{number}", status_code=303)

    def one(self, number: int, status: int = 200, problem: str = "") -> Response:
        found = _request(self.review, number)
        if found is None:
            return PlainTextResponse("no such request", status_code=404)
        rows = regrades.unit_rows(self.review.out, found.student, found.lab)
        group = answers.find(self.review.out).get(found.lab, [])
        written = next((a.number for a in group if a.student == found.student), None)
        notebooks = [
            executed.of_unit(self.review.out, found.student, found.lab, str(r.get("config", "")))
            for r in rows
        ]
        return self.draw(
            "regrade.html",
            status=status,
            r=found,
            rows=rows,
            notebooks=notebooks,
            tests=regrades.unit_tests(rows),
            written=written,
            problem=problem,
        )

    async def show(self, request: Request) -> Response:
        return await run_in_threadpool(self.one, request.path_params["number"])

    async def answer(self, request: Request) -> Response:
        number = request.path_params["number"]
        posted = await self._posted(request)
        if posted is None:
            return PlainTextResponse("this form is not the page's own: reload the page", status_code=403)
        found = _request(self.review, number)
        if found is None:
            return PlainTextResponse("no such request", status_code=404)
        reply = " ".join(posted.get("reply", "").split())[: marks.MAX_COMMENT]
        given = posted.get("points", "").strip()
        try:
            points = float(given) if given else None
        except ValueError:
            return self.one(number, 400, f"{given!r} is not a number of points")
        if not reply:
            return self.one(number, 400, "write the reply the student reads")
        test, wrong = self._test_of(found, posted)
        if wrong:
            return self.one(number, 400, wrong)
        students = set(_class(self.review))
        try:
            await run_in_threadpool(
                regrades.answer, self.review.course, self.review.who, found, reply, points, students, test
            )
        except marks.StateError as e:
            return self.one(number, 409, str(e))
        return RedirectResponse(f"/regrades/{number}", status_code=303)

    def _test_of(self, found: regrades.Request, posted: dict[str, str]) -> tuple[tuple[str, str] | None, str]:
        """The test the answer overrides and its new outcome (None: none), or what is wrong with them."""
        test, status = posted.get("test", ""), posted.get("status", "")
        if not test:
            return None, ""
        rows = regrades.unit_rows(self.review.out, found.student, found.lab)
        if test not in regrades.unit_tests(rows):
            return None, f"{test!r} is not a test of this unit: pick one of the list"
        if status not in ("passed", "failed"):
            return None, "set the test passed or failed"
        return (test, status), ""


def _request(review, number: int) -> regrades.Request | None:
    return next((r for r in regrades.load(review.course) if r.id == number), None)
