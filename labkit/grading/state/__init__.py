"""The course's state: what the TA gives and the kit keeps from one run to the next.

Reads the TA's inputs (roster, policy, overrides, extensions, adjustments: `--NAME FILE`, or the copies
kept in OUT/course/) and the submission history (OUT/history/); writes OUT/course/ (each input and a
manifest) and OUT/history/ (every version of a notebook collected, by digest). Also the policy's rules
(points, late penalties, deadlines) that later stages apply, and the atomic file writes every stage uses.

The lowest stage: it imports no other stage of grading.
"""
