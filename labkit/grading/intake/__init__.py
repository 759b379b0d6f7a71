"""Intake: what the class handed in, read into the kit's layout and checked before anything runs.

Reads a submissions folder (`<student>/lab-<N>.ipynb`), a Canvas or Gradescope download (a zip or a
folder) and, for a lab that asks for one, the written answer in a notebook; writes OUT/collected/ (a
download unpacked into that layout) and OUT/writeups/. Gives the units to grade (student, lab,
configuration), the labs and configurations chosen, and the class's notes (a file that matches no one,
a late mark).

Above the course's state (`state`: the roster it matches files to, the policy's labs); below running.
"""
