"""Tests of pytest_arbiter/runtime/: the CUDA and ROCm lanes without a GPU (fakes in
cuda_fakes.py), on the CUDA emulator (test_cuda_emulated.py) and on a live GPU
(test_cuda_live.py, gates in gpu_gates.py)."""
