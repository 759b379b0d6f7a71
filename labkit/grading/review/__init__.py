"""Reviewing: a TA grades the class's written answers by rubric, in a browser (`make review`).

Reads the write-ups a grading run wrote (OUT/writeups/<student>/lab-<N>.md), the course's rubric
(OUT/course/rubric.toml, else the kit's own) and the adjustments kept in the course state; writes
the rubric items' points into OUT/course/adjustments.csv (so the next `make grade` and every export
include them) and who gave them, and when, into OUT/course/review-log.jsonl. Nothing else.

Above the class-wide stage and below publishing: it imports state and intake, and publish imports it not.
"""
