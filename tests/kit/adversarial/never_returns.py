# A cell that never returns, and swallows the interrupt meant to stop it.
# ruff: noqa
import time

while True:
    try:
        time.sleep(1)
    except BaseException:
        pass
