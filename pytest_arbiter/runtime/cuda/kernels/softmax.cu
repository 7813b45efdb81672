// Fused softmax along the last axis: one block per row, float32 arithmetic.
//
// Three sweeps over the row inside one launch: the maximum, the sum of exp(x - max),
// then exp(x - max) / sum written in the input's dtype (round to nearest even).
// Reductions go through warp shuffles, then one float per warp in shared memory.
// 16-bit values are converted with PTX cvt from ptx_shim.cuh, so no CUDA header is needed
// (sm_80+); built for the host emulator, the shim takes their CPU emulation from
// tools/cuda_emulation/.

typedef unsigned long long u64;

#include "ptx_shim.cuh"

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(T v) { return v; }
    static __device__ __forceinline__ T store(float v) { return v; }
};

struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(T v) { return half_to_float(v); }
    static __device__ __forceinline__ T store(float v) { return float_to_half(v); }
};

struct BF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(T v) {
        return bits_to_float(static_cast<unsigned>(v) << 16);
    }
    static __device__ __forceinline__ T store(float v) { return float_to_bfloat16(v); }
};

template <bool Max>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = Max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();  // scratch may still be read by the previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : (Max ? bits_to_float(0xff800000u) : 0.0f);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = Max ? fmaxf(v, other) : v + other;
    }
    return v;
}

template <typename Kind>
__device__ __forceinline__ void softmax_rows(const typename Kind::T* __restrict__ x,
                                             typename Kind::T* __restrict__ y, int n) {
    __shared__ float scratch[32];
    const typename Kind::T* xr = x + (u64)blockIdx.x * n;
    typename Kind::T* yr = y + (u64)blockIdx.x * n;

    float m = bits_to_float(0xff800000u);  // -inf
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, Kind::load(xr[i]));
    m = block_reduce<true>(m, scratch);

    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += expf(Kind::load(xr[i]) - m);
    s = block_reduce<false>(s, scratch);

    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = Kind::store(expf(Kind::load(xr[i]) - m) / s);
}

// blockDim.x must be a multiple of 32, at most 1024; gridDim.x is the number of rows.
extern "C" __global__ void fused_softmax_f32(const float* __restrict__ x, float* __restrict__ y,
                                             int n) {
    softmax_rows<F32>(x, y, n);
}

extern "C" __global__ void fused_softmax_f16(const unsigned short* __restrict__ x,
                                             unsigned short* __restrict__ y, int n) {
    softmax_rows<F16>(x, y, n);
}

extern "C" __global__ void fused_softmax_bf16(const unsigned short* __restrict__ x,
                                              unsigned short* __restrict__ y, int n) {
    softmax_rows<BF16>(x, y, n);
}
