# Allocates memory until something stops it.
# ruff: noqa
hog = []
while True:
    hog.append(b"x" * (64 << 20))
