"""A question across the class at a glance: how many answers are graded, the spread of each rubric item's
points, and answers that share their text (by their numbers: the glance names no student).

Two answers share text where their 5-word shingles overlap by the similarity finder's NEAR (Jaccard) or
more; an answer of fewer than MIN_WORDS words, or one that was not written, is left out.
"""

from __future__ import annotations

import hashlib
import re
from statistics import mean

from labkit.grading.classwide.similarity import NEAR, jaccard
from labkit.grading.review import answers, marks
from labkit.grading.review.rubric import Rubric

SHINGLE = 5
MIN_WORDS = 20
_WORD = re.compile(r"[\w']+")


def shingles(words: str) -> set[str]:
    seq = _WORD.findall(words.lower())
    if len(seq) < MIN_WORDS:
        return set()
    return {
        hashlib.blake2b(" ".join(seq[i : i + SHINGLE]).encode(), digest_size=8).hexdigest()
        for i in range(len(seq) - SHINGLE + 1)
    }


def shared(group: list[answers.Answer]) -> list[dict]:
    """Pairs of answers whose words overlap by NEAR or more: {a, b (numbers), similarity (0..1)}."""
    sets = [(a.number, shingles(answers.body(answers.read(a.path)[0]))) for a in group]
    sets = [(n, s) for n, s in sets if s]
    found = []
    for i, (n, s) in enumerate(sets):
        for m, t in sets[i + 1 :]:
            alike = jaccard(s, t)
            if alike >= NEAR:
                found.append({"a": n, "b": m, "similarity": round(alike, 2)})
    return sorted(found, key=lambda p: (-p["similarity"], p["a"], p["b"]))


def spread(group: list[answers.Answer], text: str, rubric: Rubric) -> list[dict]:
    """Each rubric item: how many answers have its points, their mean, and how many have each value."""
    given = [marks.of_answer(text, a.student, rubric) for a in group]
    out = []
    for item in rubric.items:
        points = [g[item.name].points for g in given if item.name in g]
        counts: dict[float, int] = {}
        for p in points:
            counts[p] = counts.get(p, 0) + 1
        out.append(
            {
                "item": item.name,
                "max": item.max,
                "graded": len(points),
                "mean": round(mean(points), 2) if points else None,
                "counts": sorted(counts.items()),
            }
        )
    return out
