"""Grading a class: collecting submissions, running every unit, the policy that turns outcomes into
points, the scoreboard and its exports, and the engines that grade beyond one machine.
"""
