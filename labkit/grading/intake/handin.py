"""The class as handed in: the submissions read (a folder, or an LMS download into OUT/collected), matched
to the roster, checked against the course's inputs, and each notebook about to be graded kept.

`grade` calls `the_class` before any run (so a bad download or input grades nothing), then `keep` for the
students it grades; `prepare` (Slurm's shards) calls `submissions` and `class_checked` alone.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit.course import catalog
from labkit.grading.intake import lms, writeups
from labkit.grading.intake.collect import Submissions, discover, shard_of
from labkit.grading.state import course as course_mod
from labkit.grading.state import deadlines, history, table
from labkit.grading.state import roster as roster_mod
from labkit.grading.state import term as term_mod
from labkit.grading.state.errors import GradeError
from labkit.grading.state.files import write_atomic


@dataclass
class Class:
    """The class one run grades: its notebooks, what the LMS said of each, and the ids `--students` names."""

    subs: Submissions
    times: dict  # (student, lab) -> what the LMS says of the submission (time, late mark, source)
    named: set[str]


def the_class(
    term: term_mod.Term,
    out: Path,
    state: course_mod.State,
    context: course_mod.Context,
    students: str | None,
    stream,
    check: Callable[[Class], None] | None = None,
) -> Class:
    """The class read from the term's sources, checked against the course's inputs, and each group's one
    submission credited to all; `check` (GradeError) runs on it before the course's state is kept."""
    people = state.values.get("roster")
    subs, times = of_term(term, out, people, stream)  # an LMS download is checked before any run
    _say_labs_not_in_the_term(term, subs, stream)
    named = class_checked(state, context, subs, students, stream, save=False)
    if people is not None:
        roster_mod.credit_groups(people, subs.students, subs.notes, times)  # the roster's `group` column
    klass = Class(subs, times, named)
    if check is not None:
        check(klass)
    save_state(state, stream)
    return klass


def _say_labs_not_in_the_term(term: term_mod.Term, subs: Submissions, stream) -> None:
    """A lab handed in that the term does not grade (a download of a lab not given with LABS) is said, with how
    to add it, instead of lying unseen in OUT/collected."""
    handed = Counter(lab for labs in subs.students.values() for lab in labs)
    for lab, count in sorted(handed.items()):
        if lab not in term.labs:
            note = (
                f"lab {lab}: {count} notebook{'s' if count != 1 else ''} handed in, and the term does not grade "
                f"lab {lab} (its labs: {', '.join(map(str, term.labs))}): add it with LABS={lab} (grade --labs {lab})"
            )
            subs.class_notes.append(note)
            print(note, file=stream, flush=True)


COLLECTED = "collected"  # OUT/collected/<student>/lab-<N>.ipynb: every download's notebooks, added up
KEPT = "collected.json"  # OUT/collected.json: what each download said of each notebook kept there


def of_term(
    term: term_mod.Term, out: Path, people: roster_mod.Roster | None, stream
) -> tuple[Submissions, dict]:
    """The class's notebooks from the term's sources: its folder of the kit's layout, or every LMS download
    kept in the term added up in OUT/collected. A kept download is read again only where its files changed
    since (a folder `labkit canvas collect` filled again); one no longer there keeps what it collected, with a
    note. Also (student, lab) -> what the LMS says of the submission, as `submissions_of`."""
    known = [lab.number for lab in catalog.labs()]
    folders = [s for s in term.sources if s["kind"] == term_mod.FOLDER]
    if folders:
        path = Path(folders[0]["path"])
        if not path.is_dir():
            raise GradeError(
                f"the submissions folder {path} (kept in the term: {term.folder / term_mod.FILE}) does not exist: "
                "give SUBMISSIONS=... with FORGET=submissions to grade from another"
            )
        return discover(path, known), {}
    class_notes: list[str] = []
    read = term_mod.Read(out)
    for source in term.sources:
        path = Path(source["path"])
        if not path.exists():
            class_notes.append(f"{path.name}: the download is no longer there; what it collected is kept")
            class_notes.extend(read.notes(source["path"]))
            continue
        digest = term_mod.digest(path)
        if read.fresh(source["path"], digest):
            found = _add_download(path, out, people, known, stream)
            read.mark(source["path"], digest, found.notes())
        class_notes.extend(read.notes(source["path"]))
    (out / COLLECTED).mkdir(parents=True, exist_ok=True)
    return _collected(out, _read_kept(out / KEPT), class_notes)


def _add_download(path: Path, out: Path, people: roster_mod.Roster | None, known: list[int], stream):
    """One download read into a folder of its own, then added to OUT/collected (`add_up`); what it held."""
    fresh = out / "collecting"
    shutil.rmtree(fresh, ignore_errors=True)
    try:
        found = lms.collect(path, people, fresh, known)
        add_up(out, fresh, found, path.name, stream)
    except lms.LmsError as e:
        raise GradeError(str(e)) from None
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    for line in found.notes():
        print(f"{path.name}: {line}", file=stream, flush=True)
    return found


def _collected(out: Path, kept: dict, class_notes: list[str]) -> tuple[Submissions, dict]:
    """OUT/collected as the class's notebooks, with each kept one's late mark and notes, and its LMS times."""
    known = [lab.number for lab in catalog.labs()]
    subs = discover(out / COLLECTED, known)
    subs.class_notes[:0] = class_notes
    for (student, lab), entry in sorted(kept.items()):
        if entry["late"] and student in subs.notes:
            subs.notes[student].append(
                f"lab-{lab}: {entry['source'].capitalize()} marked it late ({entry['member']})"
            )
        subs.notes.setdefault(student, []).extend(f"lab-{lab}: {note}" for note in entry.get("notes", ()))
    return subs, {
        k: {
            "submitted_at": v["submitted_at"],
            "late": v["late"],
            "source": v["source"],
            "file": v["member"],
            "times": v.get("times", {}),
            **({"group": v["group"]} if v.get("group") else {}),  # a Gradescope group submission's members
        }
        for k, v in kept.items()
    }


def submissions_of(
    submissions: Path, out: Path, people: roster_mod.Roster | None, stream
) -> tuple[Submissions, dict]:
    """The class's notebooks: the kit's folder layout, or an LMS download added to OUT/collected first.

    Also (student, lab) -> what the LMS says of the submission (time, late mark), where it says it.
    """
    known = [lab.number for lab in catalog.labs()]
    if not lms.is_download(submissions):
        return discover(submissions, known), {}
    found = _add_download(submissions, out, people, known, stream)
    (out / COLLECTED).mkdir(parents=True, exist_ok=True)
    return _collected(out, _read_kept(out / KEPT), found.notes())


def add_up(
    out: Path, fresh: Path, found: lms.Collected, download: str, stream
) -> dict[tuple[str, int], dict]:
    """This download's notebooks (in `fresh`) added to OUT/collected: what it does not hold stays as kept.

    A notebook kept for a student's lab is replaced only by a newer one (by the LMS's submission times
    where both have one, else by the later download); a replacement, or an older version not taken, is
    said in one line with both times, and OUT/collected.json keeps what was replaced. The whole kept set:
    (student, lab) -> what its download said of it.
    """
    kept = _read_kept(out / KEPT)
    for (student, lab), given in sorted(found.files.items()):
        new, old = fresh / student / f"lab-{lab}.ipynb", out / COLLECTED / student / f"lab-{lab}.ipynb"
        entry = {**given, "download": download}
        before = kept.get((student, lab))
        if before is not None and old.is_file():
            if old.read_bytes() == new.read_bytes():
                kept[student, lab] = (
                    before if before.get("submitted_at") and not entry.get("submitted_at") else entry
                )
                continue
            if _older(entry, before):
                print(
                    f"{student} lab-{lab}: kept {_version(before)}, newer than {_version(entry)}",
                    file=stream,
                    flush=True,
                )
                continue
            print(
                f"{student} lab-{lab}: replaced {_version(before)} by {_version(entry)}",
                file=stream,
                flush=True,
            )
            entry["replaced"] = [
                *before.get("replaced", []),
                {k: before.get(k) for k in ("member", "download", "submitted_at")},
            ]
        write_atomic(old, new.read_bytes())
        kept[student, lab] = entry
    listed = [{"student": s, "lab": lab, **e} for (s, lab), e in sorted(kept.items())]
    write_atomic(out / KEPT, json.dumps(listed, indent=1, sort_keys=True) + "\n")
    return kept


def _read_kept(path: Path) -> dict[tuple[str, int], dict]:
    try:
        listed = json.loads(path.read_text()) if path.exists() else []
        return {(e.pop("student"), int(e.pop("lab"))): e for e in listed}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise GradeError(f"{path}: what earlier downloads collected cannot be read ({e})") from None


def _older(entry: dict, before: dict) -> bool:
    """Whether `entry` was handed in before the kept `before`, by the LMS's times (False where one has none)."""
    try:
        return deadlines.parse_time(entry["submitted_at"]) < deadlines.parse_time(before["submitted_at"])
    except (deadlines.DeadlineError, KeyError, TypeError):
        return False


def _version(entry: dict) -> str:
    when = f"submitted {entry['submitted_at']}" if entry.get("submitted_at") else "no submission time"
    return f"{entry['member']} ({entry.get('download') or 'an earlier download'}, {when})"


def with_roster(subs: Submissions, people: roster_mod.Roster) -> None:
    """Every roster student is in the class (a missing one with a note); a folder not on it is reported, not graded."""
    for student in list(subs.students):
        if student not in people.students:
            subs.class_notes.append(
                f"{student}: a submission folder not on the roster ({people.source}), not graded"
            )
            del subs.students[student]
            subs.notes.pop(student, None)
    for student in people.students:
        if student not in subs.students:
            subs.students[student] = {}
            subs.notes[student] = ["no submission: nothing was handed in for this student"]


def class_checked(
    state: course_mod.State,
    context: course_mod.Context,
    subs: Submissions,
    students: str | None,
    stream,
    save: bool = True,
) -> set[str]:
    """The class made (the roster's students, or the folders), the inputs checked against it, the state kept
    (with `save`). The ids `--students` names, each checked to be in the class.
    """
    people = state.values.get("roster")
    if people is not None:
        with_roster(subs, people)
    context.students = set(subs.students)
    try:
        state.check(
            context, needs_class=True
        )  # overrides, extensions, ...: against the class, before any run
    except course_mod.InputError as e:
        raise GradeError(str(e)) from None
    named = named_students(students, set(subs.students))
    if save:
        save_state(state, stream)
    return named


def save_state(state: course_mod.State, stream) -> None:
    """Keep the course's state this run grades with, and say what it is; GradeError where a file it replaces
    changed since it was read (points saved on the review page)."""
    try:
        state.save()
    except course_mod.InputError as e:
        raise GradeError(str(e)) from None
    for line in state.lines():
        print(line, file=stream, flush=True)


def named_students(text: str | None, known: set[str]) -> set[str]:
    """`--students ID,ID`: each one in the class, or GradeError naming those that are not."""
    named = {table.nfc(s.strip()) for s in (text or "").split(",") if s.strip()}  # as the class's ids
    unknown = sorted(named - known)
    if unknown:
        raise GradeError(
            f"--students names {', '.join(unknown)}: not in this class (no submission folder, or "
            "not on the roster); give the ids as the scoreboard names them, comma-separated"
        )
    return named


def students_of_shard(subs: Submissions, part: tuple[int, int] | None) -> list[str]:
    """The class's students, sorted; with `--shard K/N`, those of shard K alone."""
    students = sorted(subs.students)
    if part:
        students = [s for s in students if shard_of(s, part[1]) == part[0]]
    return students


def keep(
    out: Path, subs: Submissions, students: list[str], labs: list[catalog.Lab], times: dict
) -> dict[tuple[str, int], dict]:
    """Keep every notebook about to be graded in OUT/history by digest; (student, lab) -> what the results say.

    The results name the digest graded, the LMS's submission time and late flag, and every time known for
    the submission by source (`times`: the LMS's, or a plain folder's git commit, file modification time or
    Gradescope metadata; when the kit collected it stays in OUT/history, so that grading the same class
    again writes the same results); the policy decides which of them a late penalty may count from
    (labkit/grading/state/deadlines.py). A lab whose handout asks for a written answer has it written to
    OUT/writeups/ for the TA's rubric.
    """
    handed = {}
    notes = {lab.number: writeups.extract(lab.student) for lab in labs}  # a lab whose handout asks for a note
    for student in students:
        for lab in labs:
            path = subs.students[student].get(lab.number)
            if path is None:
                continue
            lms_info = times.get((student, lab.number), {})
            known = dict(lms_info["times"]) if "times" in lms_info else history.folder_times(path)
            entry = history.keep(
                out,
                student,
                lab.number,
                path,
                submitted_at=lms_info.get("submitted_at"),
                source=lms_info.get("source", ""),
                file=lms_info.get("file", ""),
                times=known,  # so that the policy can tell later whether this version was on time
                late=bool(lms_info.get("late")),
            )
            if entry is None:
                continue
            handed[student, lab.number] = {
                "digest": entry["digest"],
                "submitted_at": lms_info.get("submitted_at"),
                "late": bool(lms_info.get("late")),
                "times": known,
                **({"group": sorted(lms_info["group"])} if lms_info.get("group") else {}),
            }
            writeups.write(out, student, lab.number, path, notes[lab.number])  # for the TA's rubric
    return handed
