"""Host-free execution of the bundled CUDA kernels: a CPU emulator and a CuPy stand-in."""
