# Prints far more than any report should keep: cell output and the kernel's own stdout.
# ruff: noqa
import os, sys

block = "x" * (1 << 20)
for _ in range(40):
    sys.stdout.write(block)
    os.write(1, block.encode())
