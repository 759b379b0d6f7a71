# Ends the kernel at once with status 0.
import os
os._exit(0)
