"""Judging a run: the harness inside the kernel, the plain data it writes, the compiled program's facts
re-read outside it, and the pytest session that turns them into verdicts.
"""
