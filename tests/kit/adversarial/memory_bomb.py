# Allocates memory until something stops it.
hog = []
while True:
    hog.append(b"x" * (64 << 20))
