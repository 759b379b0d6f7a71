"""A TA's pins: the one kept version of a student's lab that counts, whatever the policy's rule.

    student,lab,version,comment
    alice,3,9f2c41d07a1b,"the on-time version: the late one was sent by mistake"

`version` is the first 8 or more hex digits of the version's sha256, as OUT/history/<student>/lab-<N>/ names
it; labkit/grading/intake/counted.py finds it there before anything is graded.
"""

from __future__ import annotations

import re

from labkit.grading.state import table

PIN_COLUMNS = (
    table.Column("student", required=True),
    table.Column("lab", required=True),
    table.Column("version", required=True),
    table.Column("comment"),
)
VERSION = re.compile(r"[0-9a-f]{8,64}")


class PinError(ValueError):
    """A pins file that cannot be used: the message names the file, the line and the field."""


def parse_pins(
    text: str, source: str, students: set[str], labs: set[int], inactive: list[str] | None = None
) -> dict[tuple[str, int], dict]:
    """(student, lab) -> {version, comment, line, source}: each line's student and lab in the class, once each."""
    out: dict[tuple[str, int], dict] = {}
    for line in table.read(text, source, PIN_COLUMNS, PinError):
        if not line.in_class(students, inactive):
            continue
        student, lab = line["student"], line.lab(labs)
        version = line["version"].lower()
        if not VERSION.fullmatch(version):
            raise line.fail(
                f"version {line['version']!r} is not the start of a sha256",
                "version",
                f"give 8 or more of the hex digits OUT/history/{student}/lab-{lab}/ names the version by",
            )
        if (student, lab) in out:
            first = out[student, lab]["line"]
            raise line.fail(
                f"pins lab {lab} of {student} again (line {first})",
                "student",
                f"keep one of lines {first} and {line.number}",
            )
        out[student, lab] = {
            "version": version,
            "comment": line["comment"],
            "line": line.number,
            "source": source,
        }
    return out
