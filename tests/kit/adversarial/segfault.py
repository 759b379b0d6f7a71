# Crashes the kernel with a segmentation fault.
import ctypes
ctypes.string_at(0)
