"""Publishing: graded results drawn for the people who read them, and sent where they go.

Reads the results (OUT/scoreboard.json, or what a run just graded) and what the class-wide stage
makes of them; writes the scoreboard (OUT/scoreboard.{csv,json,md,html}, grades.csv), each student's
feedback (OUT/feedback/), the class's anonymised page, LMS gradebook files, a class merged from its
shards, and sends grades and comments to Canvas. The Gradescope autograder (`gradescope`) runs one
submission through running's rows and writes Gradescope's results.json. Templates: templates/.

The highest stage: it may import every other one, and none imports it.
"""
