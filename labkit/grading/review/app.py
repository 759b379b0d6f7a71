"""The review page: a Starlette app over one grading output folder.

    GET  /                       each lab with written answers: how many, how many graded
    GET  /lab/N/next             the first answer of lab N not fully graded (after ?after=K)
    GET  /lab/N/glance           the question across the class: graded, each item's spread, shared text
    GET  /lab/N/K                answer K of lab N beside its rubric (?names=1 shows whose it is)
    POST /lab/N/K                its points: saved at once, unless another TA saved it first
    GET  /static/review.js|.css  the page's one script and one style sheet
    GET, POST /regrades[/N]      regrade requests: labkit/grading/review/regradepages.py

Nothing a request names is a path: a lab and an answer are numbers, looked up in what answers.find found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qsl

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from labkit.grading.review import answers, glance, marks, regradepages, rubric
from labkit.grading.review.guard import Gate, Guard
from labkit.grading.state import course as course_mod

MAX_FORM = 64_000
STATIC = {"review.js": "text/javascript", "review.css": "text/css"}


@dataclass(frozen=True)
class Review:
    out: Path
    who: str  # the TA's name, kept with every save

    @property
    def course(self) -> Path:
        return self.out / course_mod.FOLDER

    def rubric(self, lab: int) -> rubric.Rubric:
        return rubric.load(self.course).get(lab) or rubric.default(lab)

    def students(self, found: dict[int, list[answers.Answer]]) -> set[str]:
        return {a.student for group in found.values() for a in group}


def _templates() -> jinja2.Environment:
    folder = resources.files("labkit.grading.review") / "templates"
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


def make(out: Path, gate: Gate, who: str) -> Guard:
    """The app for output folder `out`, behind `gate`; `who` is the TA named in the log of every save."""
    review = Review(Path(out).absolute(), who)
    env = _templates()

    def draw(name: str, status: int = 200, **values) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(csrf=gate.csrf(), **values), status_code=status)

    async def index(request: Request) -> Response:
        found = answers.find(review.out)
        try:
            text = await run_in_threadpool(marks.read_text, review.course)
            labs = [_lab_summary(review, lab, group, text) for lab, group in found.items()]
            problem = ""
        except (marks.StateError, rubric.RubricError) as e:
            labs, problem = [], str(e)
        return draw("index.html", out=str(review.out), labs=labs, problem=problem, names=_names(request))

    async def next_answer(request: Request) -> Response:
        return await _next(review, request)

    async def at_a_glance(request: Request) -> Response:
        return await _glance(review, draw, request)

    async def answer(request: Request) -> Response:
        found = _answer_of(review, request)
        if found is None:
            return PlainTextResponse("no such answer", status_code=404)
        saved = request.query_params.get("saved") == "1"
        return await _page(review, draw, request, found, message="saved" if saved else "")

    async def save(request: Request) -> Response:
        found = _answer_of(review, request)
        if found is None:
            return PlainTextResponse("no such answer", status_code=404)
        form = await _form(request)
        if form is None:
            return PlainTextResponse("the form is too large", status_code=413)
        if form.get("csrf") != gate.csrf():
            return PlainTextResponse("this form is not the page's own: reload the page", status_code=403)
        return await _save(review, draw, request, found, form)

    async def problem(request: Request, exc: Exception) -> Response:
        """A course state or rubric file that cannot be used, or a folder that cannot be written: named, never a
        crash."""
        return draw("index.html", status=409, out=str(review.out), labs=[], problem=str(exc), names=False)

    app = Starlette(
        exception_handlers={marks.StateError: problem, rubric.RubricError: problem, OSError: problem},
        routes=[
            Route("/", index),
            Route("/lab/{lab:int}/next", next_answer),
            Route("/lab/{lab:int}/glance", at_a_glance),
            Route("/lab/{lab:int}/{number:int}", answer, methods=["GET"]),
            Route("/lab/{lab:int}/{number:int}", save, methods=["POST"]),
            Route("/static/{name}", static),
            *regradepages.Pages(review, draw, gate.csrf(), _form).routes(),
        ],
    )
    return Guard(app, gate)


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return PlainTextResponse("not found", status_code=404)
    text = (resources.files("labkit.grading.review") / "static" / name).read_text(encoding="utf-8")
    return Response(text, media_type=STATIC[name])


async def _next(review: Review, request: Request) -> Response:
    """To the first answer of the lab after ?after= not fully graded; to the list of labs where none is left."""
    lab = request.path_params["lab"]
    group = answers.find(review.out).get(lab)
    if not group:
        return PlainTextResponse("no written answers for this lab", status_code=404)
    after = _int(request.query_params.get("after"), 0)
    text = await run_in_threadpool(marks.read_text, review.course)
    the = review.rubric(lab)
    for a in [a for a in group if a.number > after] + [a for a in group if a.number <= after]:
        if len(marks.of_answer(text, a.student, the)) < len(the.items):
            return RedirectResponse(_url(lab, a.number, _names(request)), status_code=303)
    return RedirectResponse("/" + ("?names=1" if _names(request) else ""), status_code=303)


async def _glance(review: Review, draw, request: Request) -> Response:
    """The question across the class: graded answers, each item's spread, answers that share text."""
    lab = request.path_params["lab"]
    group = answers.find(review.out).get(lab)
    if not group:
        return PlainTextResponse("no written answers for this lab", status_code=404)
    text = await run_in_threadpool(marks.read_text, review.course)
    the = review.rubric(lab)
    return draw(
        "glance.html",
        lab=lab,
        question=the.question,
        summary=_lab_summary(review, lab, group, text),
        items=glance.spread(group, text, the),
        shared=await run_in_threadpool(glance.shared, group),
        names=_names(request),
    )


def _int(text: str | None, default: int) -> int:
    try:
        return int(text or default)
    except ValueError:
        return default


def _names(request: Request) -> bool:
    return request.query_params.get("names") == "1"


def _url(lab: int, number: int, names: bool, saved: bool = False) -> str:
    query = "&".join(q for q, on in (("names=1", names), ("saved=1", saved)) if on)
    return f"/lab/{lab}/{number}" + (f"?{query}" if query else "")


def _answer_of(review: Review, request: Request) -> answers.Answer | None:
    group = answers.find(review.out).get(request.path_params["lab"], [])
    number = request.path_params["number"]
    return group[number - 1] if 1 <= number <= len(group) else None


def _lab_summary(review: Review, lab: int, group: list[answers.Answer], text: str) -> dict:
    the = review.rubric(lab)
    graded = sum(len(marks.of_answer(text, a.student, the)) == len(the.items) for a in group)
    return {"lab": lab, "question": the.question, "answers": len(group), "graded": graded}


async def _form(request: Request) -> dict[str, str] | None:
    """The posted form (urlencoded), or None where it is larger than MAX_FORM."""
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_FORM:
            return None
    return dict(parse_qsl(data.decode("utf-8", errors="replace"), keep_blank_values=True))


def _marks_of(form: dict[str, str], the: rubric.Rubric) -> tuple[dict[str, marks.Mark], str]:
    """The points the form gives each item (an empty box: not graded), or what is wrong with them."""
    out = {}
    for n, item in enumerate(the.items, 1):
        given = form.get(f"points-{n}", "").strip()
        if not given:
            continue
        try:
            points = float(given)
        except ValueError:
            return {}, f"{item.name}: {given!r} is not a number"
        if not math.isfinite(points) or not 0 <= points <= item.max:
            return {}, f"{item.name}: give between 0 and {item.max:g} points"
        comment = " ".join(form.get(f"comment-{n}", "").split())[: marks.MAX_COMMENT]
        out[item.name] = marks.Mark(round(points, 4), comment)
    return out, ""


async def _save(review: Review, draw, request: Request, found: answers.Answer, form: dict) -> Response:
    the = review.rubric(found.lab)
    given, wrong = _marks_of(form, the)
    if wrong:
        return await _page(review, draw, request, found, message=wrong, status=400)
    students = review.students(answers.find(review.out))
    try:
        await run_in_threadpool(
            marks.save,
            review.course,
            found.student,
            the,
            given,
            form.get("version", ""),
            review.who,
            students,
        )
    except marks.Conflict:
        why = (
            "Another TA saved this answer after you opened it. The points below are theirs; yours were "
            "not saved. Give yours again if you still mean them."
        )
        return await _page(review, draw, request, found, message=why, status=409)
    except marks.StateError as e:
        return await _page(review, draw, request, found, message=str(e), status=409)
    return RedirectResponse(_url(found.lab, found.number, _names(request), saved=True), status_code=303)


async def _page(
    review: Review, draw, request: Request, found: answers.Answer, *, message: str, status: int = 200
):
    try:
        the = review.rubric(found.lab)
        text = await run_in_threadpool(marks.read_text, review.course)
        marks.check(text, review.course, {found.student})
    except (marks.StateError, rubric.RubricError) as e:
        return draw("index.html", status=409, out=str(review.out), labs=[], problem=str(e), names=False)
    have = marks.of_answer(text, found.student, the)
    words, cut = await run_in_threadpool(answers.read, found.path)
    group = answers.find(review.out)[found.lab]
    names = _names(request)
    return draw(
        "answer.html",
        status=status,
        lab=found.lab,
        number=found.number,
        count=len(group),
        graded=_lab_summary(review, found.lab, group, text)["graded"],
        student=found.student if names else None,
        names=names,
        rubric=the,
        items=[(n, i, have.get(i.name)) for n, i in enumerate(the.items, 1)],
        total=sum(m.points for m in have.values()),
        most=sum(i.max for i in the.items),
        answer=answers.html(answers.body(words)),
        cut=cut,
        version=marks.version(have),
        message=message,
        saved=message == "saved",
        urls={
            "previous": _url(found.lab, (found.number - 2) % len(group) + 1, names),
            "next": _url(found.lab, found.number % len(group) + 1, names),
            "ungraded": f"/lab/{found.lab}/next?after={found.number}" + ("&names=1" if names else ""),
            "names": _url(found.lab, found.number, not names),
            "self": _url(found.lab, found.number, names),
        },
    )
