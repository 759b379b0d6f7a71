# Ends the kernel at once with status 0.
# ruff: noqa
import os

os._exit(0)
