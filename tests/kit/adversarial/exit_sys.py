# Asks to exit with status 0 the polite ways: SystemExit and exit().
# ruff: noqa
import sys

try:
    sys.exit(0)
finally:
    exit(0)
