// The CPU emulation of the PTX shim (pytest_arbiter/runtime/cuda/kernels/ptx_shim.cuh):
// the same functions, each calling emulator.h's model of the instruction with the
// operands in the asm's order. Found on the include path when a kernel is built for the
// emulator (-DARBITER_HOST_EMULATION -I tools/cuda_emulation), after emulator.h.

#ifndef ARBITER_PTX_EMULATED_CUH
#define ARBITER_PTX_EMULATED_CUH

#define ARBITER_DYNAMIC_SHARED(name) unsigned char* name = emu::g.smem

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return emu::ptx::cvta_to_shared(p);
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    emu::ptx::cp_async_cg_16(dst, src, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { emu::ptx::cp_async_commit_group(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { emu::ptx::cp_async_wait_group(N); }
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    emu::ptx::ldmatrix_x4<false>(r, addr);
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    emu::ptx::ldmatrix_x4<true>(r, addr);
}
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4],
                                         unsigned b0, unsigned b1, Half) {
    emu::ptx::mma_m16n8k16<emu::Elem::f16>(d, a, b0, b1, d);
}
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4],
                                         unsigned b0, unsigned b1, BFloat16) {
    emu::ptx::mma_m16n8k16<emu::Elem::bf16>(d, a, b0, b1, d);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, Half) {
    return emu::ptx::cvt_rn_f16x2_f32(hi, lo);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, BFloat16) {
    return emu::ptx::cvt_rn_bf16x2_f32(hi, lo);
}

__device__ __forceinline__ float bits_to_float(unsigned bits) {
    return emu::ptx::mov_b32_f32(bits);
}
__device__ __forceinline__ float half_to_float(unsigned short h) {
    return emu::ptx::cvt_f32_f16(h);
}
__device__ __forceinline__ unsigned short float_to_half(float v) {
    return emu::ptx::cvt_rn_f16_f32(v);
}
__device__ __forceinline__ unsigned short float_to_bfloat16(float v) {
    return emu::ptx::cvt_rn_bf16_f32(v);
}

#endif  // ARBITER_PTX_EMULATED_CUH
