"""Submissions from a learning management system: a Canvas or Gradescope download read into the kit's layout.

The other way, graded results out to an LMS gradebook, is labkit/grading/publish/gradebook.py.

Import (`collect(source, roster, into)`): a Canvas bulk download or a Gradescope export, as a zip
or a folder, is read into the kit's layout `into/<student>/lab-<N>.ipynb`:

- Canvas names each file `<name>[_LATE]_<user id>_<submission id>_<file name>`, and adds `-1`,
  `-2`... to a resubmitted file's name; the user id is matched to the roster's `lms_id`, the lab
  number is read from the file name, and the latest resubmission is taken.
- Gradescope's export has `submission_metadata.yml` (or the same as `submission_metadata.json`)
  and a `submission_<id>/` folder per submission; submitters are matched to the roster by `sid`
  (student id or lms_id) or email, and `:created_at:` is kept as the submission time.

- A folder `python -m labkit canvas collect` wrote (labkit/grading/publish/canvas.py): `<student>/lab-<N>.ipynb`
  and `canvas_submissions.json`, each notebook's Canvas user id and real submission time.

Each file's `times` say what the LMS tells of when it was handed in, by source (labkit/grading/state/deadlines.py):
`gradescope` (a time), `canvas` (the time Canvas's API gives; None for a bulk download, whose
`_LATE` flag, in `late`, carries no time). A Gradescope group submission is credited to every
member on the roster, each with a note naming the others (`group`, `notes`).

A file that cannot be matched is listed with the reason, never graded on a guess. A zip with a
path that leaves its folder (`../`, an absolute path, a link) or one that would unpack to far more
than it holds (a zip bomb) is refused whole.
"""

from __future__ import annotations

import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from labkit.grading.state import table
from labkit.grading.state.files import write_atomic
from labkit.grading.state.roster import Roster

MAX_FILE = 200_000_000  # one notebook: the most grading reads (collect.MAX_BYTES)
MAX_TOTAL = 2_000_000_000  # a whole download
MAX_RATIO = 200  # uncompressed / compressed, for members over RATIO_FLOOR
RATIO_FLOOR = 1_000_000
MAX_MEMBERS = 50_000

CANVAS_NAME = re.compile(
    r"^(?P<name>[^_/]+?)(?P<late>_LATE)?_(?P<user>[0-9]+)_(?P<submission>[0-9]+)_(?P<file>.+)$"
)
LAB_IN_NAME = re.compile(
    r"lab[\s_.-]*0*(?P<lab>[1-9][0-9]*)(?:-(?P<resub>[0-9]+))?(?: ?\((?P<copy>[0-9]+)\))?"
    r"\.ipynb$",
    re.IGNORECASE,
)
GRADESCOPE_METADATA = ("submission_metadata.yml", "submission_metadata.json")


class LmsError(ValueError):
    """An LMS file that cannot be used at all: the message names it."""


# ----------------------------------------------------------------------------------------
# Import: reading a zip or a folder safely.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    name: str  # posix path inside the download
    size: int


class Source:
    """The files of a download, a zip (checked before anything is read) or a folder."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.zip: zipfile.ZipFile | None = None
        if self.path.is_dir():
            self.members = [
                Member(p.relative_to(self.path).as_posix(), p.stat().st_size)
                for p in sorted(self.path.rglob("*"))
                if p.is_file() and not p.is_symlink()
            ]
            return
        try:
            self.zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as e:
            raise LmsError(f"{self.path}: not a zip file nor a folder ({e})") from None
        self.members = check_zip(self.zip, self.path)

    def read(self, name: str) -> bytes:
        if self.zip is None:
            return (self.path / name).read_bytes()
        with self.zip.open(name) as f:
            data = f.read(MAX_FILE + 1)
        if len(data) > MAX_FILE:
            raise LmsError(f"{self.path}: {name} unpacks to more than {MAX_FILE} bytes")
        return data

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()


def check_zip(zf: zipfile.ZipFile, where: Path) -> list[Member]:
    """The zip's files, once every member is known to stay inside its folder and not to unpack to a bomb."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise LmsError(f"{where}: {len(infos)} files, more than the {MAX_MEMBERS} a download may have")
    total, members = 0, []
    for info in infos:
        name = info.filename
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
            raise LmsError(
                f"{where}: refused, the member {name!r} would be written outside its folder (path traversal)"
            )
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise LmsError(f"{where}: refused, the member {name!r} is a symbolic link")
        if info.is_dir():
            continue
        if info.file_size > MAX_FILE:
            raise LmsError(
                f"{where}: refused, {name!r} unpacks to {info.file_size} bytes (a notebook may have "
                f"{MAX_FILE}): a zip bomb, or not a notebook"
            )
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise LmsError(
                f"{where}: refused, {name!r} unpacks to {info.file_size} bytes from "
                f"{info.compress_size} (more than {MAX_RATIO} to 1): a zip bomb"
            )
        total += info.file_size
        if total > MAX_TOTAL:
            raise LmsError(f"{where}: refused, it unpacks to more than {MAX_TOTAL} bytes: a zip bomb")
        members.append(Member(name, info.file_size))
    return members


# ----------------------------------------------------------------------------------------
# Import: which file is whose.
# ----------------------------------------------------------------------------------------


@dataclass
class Collected:
    """Where a download's notebooks went, and what could not be matched (file, reason)."""

    files: dict[tuple[str, int], dict] = field(
        default_factory=dict
    )  # (student, lab) -> {member, submitted_at, ..}
    unmatched: list[tuple[str, str]] = field(default_factory=list)
    layout: str = ""

    def notes(self) -> list[str]:
        return [f"{name}: not graded, {reason}" for name, reason in self.unmatched]


def _skip(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


def _lab_of(filename: str, known_labs: list[int]) -> tuple[int | None, int, str]:
    """(lab number, resubmission number, reason when there is no lab) read from a file's name."""
    if not filename.lower().endswith(".ipynb"):
        return None, 0, "not a notebook (.ipynb)"
    m = LAB_IN_NAME.search(filename)
    if not m:
        return None, 0, "its name says no lab number (expected lab-<N>.ipynb in it)"
    lab = int(m.group("lab"))
    if lab not in known_labs:
        return None, 0, f"there is no lab {lab}"
    return lab, int(m.group("resub") or m.group("copy") or 0), ""


def canvas(source: Source, roster: Roster, known_labs: list[int]) -> Collected:
    out = Collected(layout="canvas")
    by_lms = roster.by("lms_id")
    best: dict[tuple[str, int], tuple] = {}
    for m in source.members:
        if _skip(m.name):
            continue
        base = PurePosixPath(m.name).name
        match = CANVAS_NAME.match(base)
        if not match:
            out.unmatched.append(
                (
                    m.name,
                    (
                        "its name matches no pattern (Canvas names files "
                        "<name>_<user id>_<submission id>_<file>)"
                    ),
                )
            )
            continue
        user = match.group("user")
        student = by_lms.get(user)
        if student is None:
            out.unmatched.append((m.name, f"Canvas user id {user} is on no roster line (column lms_id)"))
            continue
        lab, resub, why = _lab_of(match.group("file"), known_labs)
        if lab is None:
            out.unmatched.append((m.name, why))
            continue
        rank = (resub, int(match.group("submission")))
        entry = {
            "member": m.name,
            "late": bool(match.group("late")),
            "submitted_at": None,
            "source": "canvas",
            "times": {"canvas": None},
        }  # Canvas's flag: late or not, never when
        previous = best.get((student, lab))
        if previous is None or rank > previous[0]:
            if previous is not None:
                out.unmatched.append(
                    (
                        previous[1]["member"],
                        (f"an earlier version: {m.name} is a later resubmission of the same lab"),
                    )
                )
            best[student, lab] = (rank, entry)
        else:
            out.unmatched.append(
                (m.name, f"an earlier version: {previous[1]['member']} is a later resubmission")
            )
    out.files = {k: v[1] for k, v in best.items()}
    return out


def gradescope(source: Source, roster: Roster, known_labs: list[int], metadata_name: str) -> Collected:
    """A Gradescope export: each submission_<id>/ folder credited to the students its metadata names (every
    member of a group), the latest version of each student's lab kept, and every file left out said why."""
    out = Collected(layout="gradescope")
    owners = _gradescope_owners(_gradescope_metadata(source, metadata_name), roster)
    prefix = str(PurePosixPath(metadata_name).parent)
    prefix = "" if prefix == "." else prefix + "/"
    best: dict[tuple[str, int], tuple] = {}
    for m in source.members:
        if _skip(m.name) or m.name == metadata_name:
            continue
        parts = PurePosixPath(m.name.removeprefix(prefix)).parts
        if len(parts) < 2 or parts[0] not in owners:
            out.unmatched.append((m.name, "in no submission_<id> folder named in submission_metadata.yml"))
            continue
        owner = owners[parts[0]]
        if not owner.students:
            out.unmatched.append((m.name, owner.why))
            continue
        # a group with a member the roster does not know: the others are credited, that one is not
        if owner.strangers:
            plural = "s" if len(owner.strangers) > 1 else ""
            out.unmatched.append(
                (
                    m.name,
                    f"not credited to the group member{plural} ({'; '.join(owner.strangers)}) on "
                    f"no roster line; credited to {', '.join(owner.students)}",
                )
            )
        lab, resub, why = _lab_of(parts[-1], known_labs)
        if lab is None:
            out.unmatched.append((m.name, why))
            continue
        rank = (owner.created or "", resub)
        for student in owner.students:
            _keep_latest(best, out, (student, lab), rank, _gradescope_entry(m.name, owner, student))
    out.files = {k: v[1] for k, v in best.items()}
    return out


class _Owner(NamedTuple):
    """Whose a submission folder is: its students on the roster, why none where there are none, when it was
    handed in, and the submitters on no roster line."""

    students: list[str]
    why: str
    created: str | None
    strangers: list[str]


def _gradescope_metadata(source: Source, metadata_name: str) -> dict:
    import yaml

    try:
        meta = yaml.safe_load(source.read(metadata_name))  # YAML, or JSON (which YAML reads too)
    except yaml.YAMLError as e:
        raise LmsError(f"{metadata_name}: not valid YAML or JSON ({e})") from None
    if not isinstance(meta, dict):
        raise LmsError(f"{metadata_name}: expected one entry per submission_<id> (Gradescope's export)")
    return meta


def _gradescope_owners(meta: dict, roster: Roster) -> dict[str, _Owner]:
    """Each submission folder's owners, its submitters found on the roster by LMS id, student id or email."""
    by_sid = {**roster.by("lms_id"), **{s: s for s in roster.students}}
    by_email = {e.lower(): s for e, s in roster.by("email").items()}
    owners: dict[str, _Owner] = {}
    for folder, entry in meta.items():
        info = entry if isinstance(entry, dict) else {}
        submitters = info.get(":submitters") or info.get("submitters") or []
        created = info.get(":created_at") or info.get("created_at")
        students: list[str] = []
        strangers: list[str] = []
        for who in submitters if isinstance(submitters, list) else []:
            person = who if isinstance(who, dict) else {}
            sid = table.nfc(str(person.get(":sid") or person.get("sid") or ""))
            email = str(person.get(":email") or person.get("email") or "").lower()
            student = by_sid.get(sid) or by_email.get(email)
            if student and student not in students:
                students.append(student)
            elif not student:
                strangers.append(f"sid {sid or '–'}, email {email or '–'}")
        why = (
            f"its submitter ({strangers[0]}) is on no roster line"
            if strangers
            else "no submitter in submission_metadata.yml"
        )
        owners[str(folder)] = _Owner(
            sorted(students), why, str(created) if created is not None else None, strangers
        )
    return owners


def _gradescope_entry(member: str, owner: _Owner, student: str) -> dict:
    """What is collected of one file for one of its owners (a group's note for each member of a group)."""
    entry: dict = {
        "member": member,
        "late": False,
        "submitted_at": owner.created,
        "source": "gradescope",
        "times": {"gradescope": owner.created} if owner.created else {},
    }
    if len(owner.students) > 1:
        others = [s for s in owner.students if s != student]
        entry["group"] = owner.students
        entry["notes"] = [
            f"handed in on Gradescope as a group with {', '.join(others)}: every member is "
            "credited with the group's submission"
        ]
    return entry


def _keep_latest(best: dict, out: Collected, key: tuple[str, int], rank: tuple, entry: dict) -> None:
    """Keep `entry` for (student, lab) if it is later than the one kept; the other one is named as earlier."""
    student, member = key[0], entry["member"]
    previous = best.get(key)
    if previous is None or rank > previous[0]:
        if previous is not None and previous[1]["member"] != member:
            out.unmatched.append(
                (previous[1]["member"], f"an earlier version for {student}: {member} is later")
            )
        best[key] = (rank, entry)
    elif previous[1]["member"] != member:
        out.unmatched.append((member, f"an earlier version for {student}: {previous[1]['member']} is later"))


CANVAS_MANIFEST = "canvas_submissions.json"  # written by labkit/grading/publish/canvas.py's collect


def canvas_api(source: Source, roster: Roster, known_labs: list[int]) -> Collected:
    """A folder `python -m labkit canvas collect` wrote: <student>/lab-<N>.ipynb and each one's Canvas record."""
    import json

    out = Collected(layout="canvas-api")
    try:
        manifest = json.loads(source.read(CANVAS_MANIFEST))["submissions"]
        assert isinstance(manifest, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise LmsError(f"{CANVAS_MANIFEST}: not what `labkit canvas collect` writes; collect again") from None
    by_lms = roster.by("lms_id")
    present = {m.name for m in source.members}
    for name in sorted(present - {CANVAS_MANIFEST}):
        if not _skip(name) and name not in manifest:
            out.unmatched.append((name, f"not in {CANVAS_MANIFEST}: not collected from Canvas"))
    for name, entry in sorted(manifest.items()):
        record = entry if isinstance(entry, dict) else {}
        parts = PurePosixPath(name).parts
        lab, _, why = _lab_of(parts[-1], known_labs)
        student = by_lms.get(str(record.get("user_id")))
        if name not in present:
            out.unmatched.append((name, "named in the manifest but not in the folder"))
        elif lab is None:
            out.unmatched.append((name, why))
        elif len(parts) != 2 or student != parts[0]:
            out.unmatched.append(
                (
                    name,
                    (f"Canvas user {record.get('user_id')} is not {parts[0]} on the roster (column lms_id)"),
                )
            )
        else:
            when = record.get("submitted_at")
            out.files[student, lab] = {
                "member": name,
                "late": bool(record.get("late")),
                "submitted_at": when,
                "source": "canvas",
                "times": {"canvas": str(when) if when else None},
            }
    return out


def _export_metadata(name: str, data: bytes) -> bool:
    """Whether a submission_metadata file is an export's (one entry per submission_<id>), not one submission's.

    Gradescope's autograder also writes a `submission_metadata.json` for a single submission
    ({"id", "created_at", "users", ...}); one of those in a student's folder is read by
    labkit/grading/state/history.py as that submission's time, not as a download.
    """
    import yaml

    if not name.endswith(".json"):
        return True
    try:
        meta = yaml.safe_load(data)
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and any(str(k).startswith("submission_") for k in meta)


def is_download(path: Path) -> bool:
    """A zip, or a folder laid out as an LMS download (flat Canvas files, or Gradescope's metadata)."""
    path = Path(path)
    if path.is_file():
        return True
    if not path.is_dir():
        return False
    if any(path.rglob(GRADESCOPE_METADATA[0])) or (path / CANVAS_MANIFEST).is_file():
        return True
    for found in path.rglob(GRADESCOPE_METADATA[1]):
        if (
            found.is_file()
            and not found.is_symlink()
            and found.stat().st_size <= MAX_FILE
            and _export_metadata(found.name, found.read_bytes())
        ):
            return True
    return any(p.is_file() and CANVAS_NAME.match(p.name) for p in path.iterdir())


def collect(path: Path, roster: Roster | None, into: Path, known_labs: list[int]) -> Collected:
    """Read an LMS download into `into/<student>/lab-<N>.ipynb`; what was matched and what was not."""
    if roster is None:
        raise LmsError(
            f"{path}: an LMS download is matched to students through the roster: add --roster FILE"
        )
    source = Source(path)
    try:
        meta = sorted(
            (
                m.name
                for m in source.members
                if PurePosixPath(m.name).name in GRADESCOPE_METADATA
                and not _skip(m.name)
                and _export_metadata(m.name, source.read(m.name))
            ),
            key=lambda n: n.count("/"),
        )
        if meta:
            found = gradescope(source, roster, known_labs, meta[0])
        elif any(m.name == CANVAS_MANIFEST for m in source.members):
            found = canvas_api(source, roster, known_labs)
        else:
            found = canvas(source, roster, known_labs)
        for (student, lab), entry in sorted(found.files.items()):
            data = source.read(entry["member"])
            write_atomic(Path(into) / student / f"lab-{lab}.ipynb", data)
    finally:
        source.close()
    found.unmatched.sort()
    return found
