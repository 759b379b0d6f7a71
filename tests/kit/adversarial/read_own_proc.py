# Reads what its own process shows of how it was started (its command line, its environment, its init's), where a forked kernel could find the warm server's socket, folders and token, and prints it.
# ruff: noqa
for path in ("/proc/self/cmdline", "/proc/self/environ", "/proc/1/cmdline", "/proc/1/environ"):
    try:
        print(path, open(path, "rb").read().replace(b"\0", b" ").decode(errors="replace")[:4000])
    except OSError as e:
        print(path, "unreadable", e)
