"""Running: every unit (student, lab, configuration) run and judged, and the row it gets.

Reads the units intake gives, the labs' tests and references, and the units kept from earlier runs
(OUT/units/, by a key of everything a grade depends on); writes OUT/units/ (one row per unit and its
run's record), OUT/work/ (each run's folder), OUT/progress.json, and, where runs go to pods, their
plan and outputs. A student's own `make lab-N` runs become the same rows (`ownresults`).

Above intake and the course's state; below the class-wide judging and publishing.
"""
