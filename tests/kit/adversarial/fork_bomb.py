# Forks until it cannot; every child keeps forking, then waits forever.
# ruff: noqa
import os, time
kernel = os.getpid()
while True:
    try:
        os.fork()
    except OSError:
        break
if os.getpid() != kernel:
    time.sleep(3600)
    os._exit(0)
