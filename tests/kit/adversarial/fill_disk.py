# Fills its scratch folder with files as large as the limits let it write (each file is capped; there may be many), and leaves them there.
# ruff: noqa
import os

written = 0
for i in range(6):
    try:
        with open(f"filler-{i}", "wb") as f:
            for _ in range(16):
                f.write(b"\0" * (1 << 20))
                written += 1 << 20
    except OSError:
        break
print("written", written)
