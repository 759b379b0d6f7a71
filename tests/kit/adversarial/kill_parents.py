# Kills every ancestor of the kernel it can find (whatever started it, up to the machine's init).
# ruff: noqa
import os, signal

pid = os.getpid()
ancestors = []
while pid > 1:
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    if pid > 1:
        ancestors.append(pid)
for p in ancestors:
    try:
        os.kill(p, signal.SIGKILL)
    except OSError:
        pass
