"""Grading a class, in rooms by stage; each imports only the stages below it (tests/kit/test_layout.py):

    state/      the course's state: the TA's inputs kept in OUT/course/, the policy, the history
    intake/     what the class handed in: a folder or an LMS download, matched to the roster
    running/    every unit run and judged, and its row kept in OUT/units/
    classwide/  the class's results gathered, and what they say as a whole
    publish/    the scoreboard, feedback, LMS files, Canvas, Gradescope, a merge of shards

Above them, the commands that call the stages in order: `grade` (a class on one machine), `slurm` and
`cluster` (a class beyond one machine, in shards merged by publish/merge).
"""
