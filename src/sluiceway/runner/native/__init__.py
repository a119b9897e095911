"""CPU kernels written in C, compiled on first use for the machine they run on and
called through ctypes (see `library.py`). Each has a torch fallback in its caller,
so a machine without a C compiler runs exactly as before, only slower."""
