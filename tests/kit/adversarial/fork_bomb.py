# Forks until it cannot (every child forks too), then every child waits forever.
# ruff: noqa
# Each process it makes adds a byte to the file `forks` in its scratch folder, so a test can
# tell how many it reached. It stops by itself near 400 (well above the limits the tests set), so
# that a process limit that failed to hold shows up as a count, not as a machine out of pids.
import os, time

kernel = os.getpid()
counter = os.open("forks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
while os.fstat(counter).st_size < 400:
    try:
        if os.fork() == 0:
            os.write(counter, b".")
    except OSError:
        break
if os.getpid() != kernel:
    time.sleep(3600)
    os._exit(0)
# The others may still be forking: wait until the count stops growing, so that the count is
# final before this process ends (its end frees a place under the limit for one more).
settled, seen = 0, -1
while settled < 5:
    time.sleep(0.2)
    now = os.fstat(counter).st_size
    settled, seen = (settled + 1 if now == seen else 0), now
print("the fork bomb stopped after", os.fstat(counter).st_size, "processes")
