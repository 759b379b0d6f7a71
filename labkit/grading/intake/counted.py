"""Which of a student's submissions of a lab counts: the policy's rule, or a version a TA pins.

    OUT/counted/<student>/lab-<N>.ipynb   the version that counts, where it is not the last one handed in

Every version collected is kept in OUT/history/<student>/lab-<N>/ with what was known of when it was handed
in (labkit/grading/state/history.py). The policy says which counts (`[grading] counts`, or `[labs.N] counts`
for one lab; labkit/grading/state/policy.py):

- `latest` (the default): the last one handed in, what OUT/collected (or the submissions folder) holds;
- `last-on-time`: the last version handed in by the due date, by the time the policy's `[late] accept`
  takes and with the student's extension (labkit/grading/state/deadlines.py); where none was, the latest,
  charged as late as it was.

A TA pins one kept version for one student with `--pins pins.csv` (`student,lab,version,comment`: the
version as the first 8 or more hex digits of its sha256, as OUT/history names it); a pin outranks the rule.
Every choice other than the latest is said in the run's output and in the student's notes, with both
versions' times; a pin that names no kept version (or two) stops the run before anything is graded.
"""

from __future__ import annotations

from pathlib import Path

from labkit.grading.intake.handin import Class
from labkit.grading.state import deadlines, history, table
from labkit.grading.state import policy as policy_mod
from labkit.grading.state.errors import GradeError
from labkit.grading.state.files import write_atomic

FOLDER = "counted"  # OUT/counted/<student>/lab-<N>.ipynb


def check_pins(out: Path, klass: Class, pins: dict[tuple[str, int], dict]) -> None:
    """Every pin names a lab the student handed in and one version of it, kept or handed in now; GradeError
    naming the file and line, before anything is kept or graded."""
    for (student, lab), pin in sorted(pins.items()):
        path = klass.subs.students.get(student, {}).get(lab)
        if path is None or not Path(path).is_file():
            raise _no_lab(pin, student, lab)
        versions = [v for v in history.read(out, student, lab) if _file(out, student, lab, v).is_file()]
        now = history.digest(Path(path))
        if all(v.get("digest") != now for v in versions):
            versions.append({"digest": now, "collected_at": "now"})
        _pinned(pin, versions, student, lab)


def _no_lab(pin: dict, student: str, lab: int) -> GradeError:
    return GradeError(
        table.message(
            pin["source"], pin["line"], f"{student} handed in no lab {lab} to pin a version of", "lab"
        )
    )


def choose(
    out: Path,
    klass: Class,
    grading: policy_mod.Policy,
    pins: dict[tuple[str, int], dict],
    extensions: dict[str, dict[str, float]],
    labs: list[int],
    stream,
) -> None:
    """Point each (student, lab) of `klass` at the version that counts; GradeError for a pin that names none."""
    for student, handed in sorted(klass.subs.students.items()):
        for lab in labs:
            path, pin, rule = handed.get(lab), pins.get((student, lab)), grading.counts_for(lab)
            if (
                path is None
                or not Path(path).is_file()
                or (pin is None and rule == policy_mod.COUNTS_DEFAULT)
            ):
                if pin is not None:
                    raise _no_lab(pin, student, lab)
                continue  # the latest counts; a folder or a refused file is graded as it is (an error row)
            latest = _keep_latest(out, klass, student, lab, Path(path))
            versions = [v for v in history.read(out, student, lab) if _file(out, student, lab, v).is_file()]
            chosen: dict | None
            if pin is not None:
                chosen = _pinned(pin, versions, student, lab)
                why = f"pinned by a TA: {pin['comment'] or 'no comment'}"
            else:
                days = extensions.get(student, {}).get(str(lab), 0)
                chosen = _last_on_time(versions, latest, grading, lab, days)
                why = f"the last one handed in on time (the policy's counts = {rule!r})"
            if chosen is None or chosen["digest"] == latest["digest"]:
                continue
            _count(out, klass, student, lab, chosen)
            said = (
                f"lab-{lab}: the version handed in {_when(chosen)} ({chosen['digest'][:12]}) counts, {why}; "
                f"the latest, handed in {_when(latest)} ({latest['digest'][:12]}), does not"
            )
            klass.subs.notes.setdefault(student, []).append(said)
            print(f"{student} {said}", file=stream, flush=True)


def _keep_latest(out: Path, klass: Class, student: str, lab: int, path: Path) -> dict:
    """The version handed in last, kept in the history with its times (the entry, the first for these bytes)."""
    info = klass.times.get((student, lab), {})
    times = dict(info["times"]) if "times" in info else history.folder_times(path)
    entry = history.keep(
        out,
        student,
        lab,
        path,
        submitted_at=info.get("submitted_at"),
        source=info.get("source", ""),
        file=info.get("file", ""),
        times=times,
        late=bool(info.get("late")),
    )
    if entry is None:
        raise GradeError(f"{path}: not a file, so no version of it can be kept")
    return entry | ({"times": times, "late": bool(info.get("late"))} if "times" not in entry else {})


def _file(out: Path, student: str, lab: int, entry: dict) -> Path:
    return history.folder(out, student, lab) / f"{entry.get('digest')}.ipynb"


def _pinned(pin: dict, versions: list[dict], student: str, lab: int) -> dict:
    found = [v for v in versions if str(v.get("digest", "")).startswith(pin["version"])]
    if len(found) != 1:
        kept = ", ".join(f"{v['digest'][:12]} ({_when(v)})" for v in versions) or "none"
        raise GradeError(
            table.message(
                pin["source"],
                pin["line"],
                f"{'no kept version' if not found else 'more than one kept version'} of {student}'s lab {lab} "
                f"starts {pin['version']}",
                "version",
                f"name one of those kept in OUT/history/{student}/lab-{lab}/: {kept}",
            )
        )
    return found[0]


def _handed(entry: dict) -> dict:
    """What the results say of a version, for deadlines.charge: its times (an older entry: its LMS's time)."""
    times = entry.get("times")
    if not isinstance(times, dict):
        source = entry.get("source")
        times = {source: entry.get("submitted_at")} if source in deadlines.SOURCES else {}
    return {"times": times, "late": bool(entry.get("late")), "submitted_at": entry.get("submitted_at")}


def _last_on_time(
    versions: list[dict], latest: dict, grading: policy_mod.Policy, lab: int, days: float
) -> dict | None:
    """The last version (in the order they were collected) that was handed in by the due date, by a time the
    policy accepts; None where none was (the latest then counts) or the lab has no due date."""
    due = grading.due.get(lab)
    if not due:
        return None
    on_time = None
    for entry in [*[v for v in versions if v["digest"] != latest["digest"]], latest]:
        charged = deadlines.charge(_handed(entry), due, grading.late, days)
        accepted = charged.get("time_source") in grading.late.get("accept", deadlines.ACCEPT_DEFAULT)
        if accepted and "late_days" not in charged and "late_note" not in charged:
            on_time = entry
    return on_time


def _count(out: Path, klass: Class, student: str, lab: int, entry: dict) -> None:
    """Grade `entry`'s bytes as the student's lab, with its own times (a copy named as the lab's notebook)."""
    counted = Path(out) / FOLDER / student / f"lab-{lab}.ipynb"
    write_atomic(counted, _file(out, student, lab, entry).read_bytes())
    klass.subs.students[student][lab] = counted
    handed = _handed(entry)
    klass.times[student, lab] = {
        "submitted_at": entry.get("submitted_at"),
        "late": handed["late"],
        "source": entry.get("source", ""),
        "file": entry.get("file", ""),
        "times": handed["times"],
    }


def _when(entry: dict) -> str:
    times = _handed(entry)["times"]
    known = [f"{t} ({s})" for s, t in times.items() if t and s != "collected"]
    return known[0] if known else f"collected {entry.get('collected_at', '?')}"
