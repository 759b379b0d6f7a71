"""The class's results gathered from a run: the rows, the labs with their tests and points, the configurations,
the students with the roster's columns and what was handed in, the policy and the course's inputs. This
plain data is what every drawing reads (`scoreboard.write`), and nothing in it depends on when or where
the run was made.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.course import catalog
from labkit.course.configs import DeviceConfig
from labkit.grading.intake.collect import Submissions
from labkit.grading.running.store import FORMAT, kit_digest
from labkit.grading.state import policy as policy_mod
from labkit.grading.state import roster as roster_mod


def results_of(
    rows: list[dict],
    labs: list[catalog.Lab],
    chosen: list[DeviceConfig],
    subs: Submissions,
    students: list[str],
    *,
    ref_rows: Sequence[dict] = (),
    grading: policy_mod.Policy | None = None,
    people: roster_mod.Roster | None = None,
) -> dict:
    """The plain data the scoreboard is drawn from (nothing in it depends on when or where it ran).

    Each lab carries its tests with their points and the configurations they ran on (from the
    reference), and the results carry the policy and the roster's columns, so that points and
    LMS exports are drawn from these results alone.
    """
    tests = policy_mod.lab_tests(list(ref_rows))
    labs_out = []
    for lab in labs:
        entry = {"number": lab.number, "name": lab.name, "title": lab.title}
        if ref_rows:
            mine = tests.get(lab.number, {})
            entry["tests"] = mine
            entry["reference_costs"] = {
                r["config"]: r["costs"] for r in ref_rows if r["lab"] == lab.number and r.get("costs")
            }
            entry["reference_timelines"] = {
                r["config"]: r["timelines"] for r in ref_rows if r["lab"] == lab.number and r.get("timelines")
            }
            entry["max_points"] = policy_mod.lab_points(grading or policy_mod.Policy(), mine, {})[1]
        if (
            lab.leaderboard is not None
        ):  # the class leaderboard the catalog gives it (classwide/leaderboard.py)
            entry["leaderboard"] = lab.leaderboard.to_json()
        labs_out.append(entry)
    info = people.students if people else {}
    results = {
        "format": FORMAT,
        "labs": labs_out,
        "configs": [{"name": c.name, "summary": c.summary, "devices": c.devices} for c in chosen],
        "students": {s: {"notes": subs.notes.get(s, []), **info.get(s, {})} for s in students},
        "notes": list(subs.class_notes),
        "rows": rows,
    }
    if grading is not None:
        results["policy"] = grading.to_json()
    return results


def of_class(
    rows: list[dict],
    labs: list[catalog.Lab],
    chosen: list[DeviceConfig],
    subs: Submissions,
    students: list[str],
    *,
    ref_rows: list[dict],
    grading: policy_mod.Policy,
    people: roster_mod.Roster | None,
    handed: dict[tuple[str, int], dict],
    provisional: str,
    course_values: dict,
) -> dict:
    """A grading run's results: `results_of`, with what each student handed in, why the grades are
    provisional (if they are), the course's inputs and the kit's digest (a merge refuses parts graded
    with another version of the kit)."""
    results = results_of(
        rows, labs, chosen, subs, students, ref_rows=ref_rows, grading=grading, people=people
    )
    for (student, lab), info in sorted(handed.items()):
        results["students"][student].setdefault("submissions", {})[str(lab)] = info
    if provisional:
        results["provisional"] = provisional
    results.update(course_values)
    results["kit"] = kit_digest()
    return results
