# Crashes the kernel with a segmentation fault.
# ruff: noqa
import ctypes

ctypes.string_at(0)
