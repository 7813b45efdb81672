// The PTX instructions the bundled kernels use, one inline function each, in one place.
//
// Included by mma_gemm.cu and softmax.cu. No CUDA header is needed, so NVRTC needs no
// include path (sources.py inlines this file into the text it hands to NVRTC). Built for
// the host emulator (-DARBITER_HOST_EMULATION), each function is replaced by its CPU
// emulation from ptx_emulated.cuh, found on the include path: tools/cuda_emulation/
// holds it, with the emulator; nothing of it ships in the package.

#ifndef ARBITER_PTX_SHIM_CUH
#define ARBITER_PTX_SHIM_CUH

struct Half {};
struct BFloat16 {};

#ifdef ARBITER_HOST_EMULATION

#include "ptx_emulated.cuh"

#else

// the block's dynamic shared memory, 16-byte aligned
#define ARBITER_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]

// -- cp.async, ldmatrix, mma.sync, cvt (the tensor-core GEMM) ------------------------

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned addr;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n"
        : "=r"(addr) : "l"(p));
    return addr;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    // src-size 0 writes sixteen zero bytes and reads nothing
    int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4],
                                         unsigned b0, unsigned b1, Half) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4],
                                         unsigned b0, unsigned b1, BFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Pack two floats, rounded to nearest even; lo lands at the lower address.
__device__ __forceinline__ unsigned pack2(float lo, float hi, Half) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned pack2(float lo, float hi, BFloat16) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// -- mov, cvt (the fused softmax) -------------------------------------------------------

__device__ __forceinline__ float bits_to_float(unsigned bits) {
    float f;
    asm("mov.b32 %0, %1;\n" : "=f"(f) : "r"(bits));
    return f;
}
__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short float_to_half(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ unsigned short float_to_bfloat16(float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return h;
}

#endif  // ARBITER_HOST_EMULATION

#endif  // ARBITER_PTX_SHIM_CUH
