"""The machine under the kit: what it can do, and making the locked environment on it, offline too.

These modules run before the environment exists (with the system's python3): standard library only.
"""
