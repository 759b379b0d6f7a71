import faulthandler
import sys

from labkit.cli import main

# A crash in native code (a kernel's sockets, a thread's event loop) prints every thread's Python stack, the
# crashing one first, instead of dying without a word: what a report of it needs.
faulthandler.enable()
sys.exit(main())
