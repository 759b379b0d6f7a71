"""The course's state one grading run reads: the TA's inputs given or kept, checked, and what they add to the
results. `grade` and `prepare` (Slurm's shards) call these before anything is collected or run."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.course import catalog
from labkit.grading.state import course as course_mod
from labkit.grading.state import policy as policy_mod
from labkit.grading.state.errors import GradeError


def read(
    out: Path, course: Path | None, given: dict, forget: str, change_policy: bool
) -> tuple[course_mod.State, course_mod.Context]:
    """The TA's inputs this run grades with (given, else kept), the roster and the policy checked already."""
    folder = Path(course).absolute() if course is not None else out / course_mod.FOLDER
    context = course_mod.Context(labs=[lab.number for lab in catalog.labs()])
    try:
        graded = json.loads((out / "scoreboard.json").read_text()).get("policy")
    except (OSError, ValueError, AttributeError):
        graded = None
    try:
        state = course_mod.read(
            folder, given, forget=forget, change_policy=change_policy, graded_policy=graded, labs=context.labs
        )
        state.check(context, needs_class=False)
    except course_mod.InputError as e:
        raise GradeError(str(e)) from None
    return state, context


def provisional(grading: policy_mod.Policy, chosen: list[str]) -> str:
    """Why these grades are provisional ('' when they are not): a configuration the policy requires left out."""
    try:
        return policy_mod.check_required(grading, chosen)
    except policy_mod.PolicyError as e:
        raise GradeError(str(e)) from None


def course_values(state: course_mod.State, labs: list[int]) -> dict:
    """What the course's inputs put in the results: for the whole class (every shard the same), the labs graded."""
    out = {}
    for name, entry in course_mod.INPUTS.items():
        value = state.values.get(name)
        if entry.results_key is None or not value:
            continue
        if isinstance(value, list):  # lines, each of one student's lab
            value = [v for v in value if v.get("lab") in labs]
        elif isinstance(value, dict):  # student -> lab -> ...
            value = {s: {k: v for k, v in by.items() if int(k) in labs} for s, by in sorted(value.items())}
            value = {s: by for s, by in value.items() if by}
        if value:
            out[entry.results_key] = value
    return out
