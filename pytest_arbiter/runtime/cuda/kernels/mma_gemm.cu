// Tensor-core GEMM for float16 / bfloat16: C = A @ B, all row-major, float32 accumulate.
//
// Block tile BM x BN x BK = 128 x 128 x 32, 8 warps (2 along M x 4 along N), warp tile
// 64 x 32 = 4 x 4 mma.sync.m16n8k16 tiles. Global -> shared with cp.async (16 bytes per
// copy, zero-filled past the last row of A), GEMM_STAGES-deep pipeline in dynamic shared
// memory, ldmatrix (.trans for B) into the mma fragments. Rows are padded by 8 elements
// so the eight 16-byte rows one ldmatrix phase reads fall in distinct banks.
//
// __launch_bounds__(256, 2) caps registers at 128, so registers allow two blocks per SM;
// shared memory decides: 56,832 bytes per block (+1 KiB reserved) fit twice in the
// 164 KiB of sm_80 and the 228 KiB of sm_90/sm_100, once in the 100 KiB of
// sm_86/sm_89/sm_120 (sources.mma_blocks_per_sm).
// Needs sm_80+. The host wrapper accepts only M % 16 == 0, N % 8 == 0, K % 32 == 0 and
// 16-byte aligned, contiguous operands; partial tiles along M and N are predicated.
// The PTX instructions come from ptx_shim.cuh (no CUDA header); built for the host
// emulator, the shim takes their CPU emulation from tools/cuda_emulation/.

#ifndef GEMM_BM
#define GEMM_BM 128
#endif
#ifndef GEMM_BN
#define GEMM_BN 128
#endif
#ifndef GEMM_BK
#define GEMM_BK 32
#endif
#ifndef GEMM_STAGES
#define GEMM_STAGES 3
#endif
#ifndef GEMM_GROUP_M
#define GEMM_GROUP_M 8  // block rows launched together, so their B tiles stay in L2
#endif

#define GEMM_THREADS 256
#define WARP_M 64
#define WARP_N 32
#define PAD 8
#define A_STRIDE (GEMM_BK + PAD)  // elements per shared row of the A tile
#define B_STRIDE (GEMM_BN + PAD)  // elements per shared row of the B tile
#define A_TILE (GEMM_BM * A_STRIDE)
#define B_TILE (GEMM_BK * B_STRIDE)

static_assert(GEMM_BM == 2 * WARP_M && GEMM_BN == 4 * WARP_N, "8 warps as 2 x 4");
static_assert(GEMM_BK == 32, "two k16 steps per tile; the load mapping assumes BK == 32");
static_assert(GEMM_BM * GEMM_BK / 8 == 2 * GEMM_THREADS, "two 16-byte A copies per thread");
static_assert(GEMM_BK * GEMM_BN / 8 == 2 * GEMM_THREADS, "two 16-byte B copies per thread");
static_assert(GEMM_STAGES >= 2, "a pipeline needs two stages");

typedef unsigned short elem_t;  // raw 16-bit storage of half or bfloat16

typedef unsigned long long u64;

#include "ptx_shim.cuh"

template <typename Kind>
__device__ __forceinline__ void mma_gemm(const elem_t* __restrict__ A,
                                         const elem_t* __restrict__ B,
                                         elem_t* __restrict__ C, int M, int N, int K) {
    ARBITER_DYNAMIC_SHARED(smem_raw);
    elem_t* As = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* Bs = As + GEMM_STAGES * A_TILE;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warp_m = warp >> 2;  // 0..1
    const int warp_n = warp & 3;   // 0..3
    // Grouped launch order: GEMM_GROUP_M consecutive block rows walk the columns
    // together, so concurrently resident blocks share A rows and B columns in L2.
    const int grid_n = gridDim.x;
    const int linear = blockIdx.y * grid_n + blockIdx.x;
    const int per_group = GEMM_GROUP_M * grid_n;
    const int first_m = (linear / per_group) * GEMM_GROUP_M;
    const int rows_left = static_cast<int>(gridDim.y) - first_m;
    const int group_rows = rows_left < GEMM_GROUP_M ? rows_left : GEMM_GROUP_M;
    const int tile_m = first_m + (linear % per_group) % group_rows;
    const int tile_n = (linear % per_group) / group_rows;
    const int block_m = tile_m * GEMM_BM;
    const int block_n = tile_n * GEMM_BN;

    // Each thread copies two 16-byte chunks of A (rows r, r + 64) and two of B.
    const int a_row = tid >> 2;           // 0..63
    const int a_col = (tid & 3) * 8;      // 0, 8, 16, 24
    const int b_row = tid >> 4;           // 0..15
    const int b_col = (tid & 15) * 8;     // 0..120
    const bool a_ok0 = block_m + a_row < M;
    const bool a_ok1 = block_m + a_row + 64 < M;
    const bool b_ok = block_n + b_col < N;  // N % 8 == 0: a chunk is all in or all out
    const elem_t* a_src0 = A + (u64)(a_ok0 ? block_m + a_row : 0) * K + a_col;
    const elem_t* a_src1 = A + (u64)(a_ok1 ? block_m + a_row + 64 : 0) * K + a_col;
    const elem_t* b_src = B + (u64)b_row * N + (b_ok ? block_n + b_col : 0);

    const int k_tiles = K / GEMM_BK;

    auto load_tile = [&](int stage, int kt) {
        elem_t* as = As + stage * A_TILE;
        elem_t* bs = Bs + stage * B_TILE;
        const int k0 = kt * GEMM_BK;
        cp_async16(smem_addr(as + a_row * A_STRIDE + a_col), a_src0 + k0, a_ok0);
        cp_async16(smem_addr(as + (a_row + 64) * A_STRIDE + a_col), a_src1 + k0, a_ok1);
        cp_async16(smem_addr(bs + b_row * B_STRIDE + b_col), b_src + (u64)k0 * N, b_ok);
        cp_async16(smem_addr(bs + (b_row + 16) * B_STRIDE + b_col),
                   b_src + (u64)(k0 + 16) * N, b_ok);
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < k_tiles) load_tile(s, s);
        cp_async_commit();
    }

    // ldmatrix row addresses: lanes 0-15 give rows 0-15 of column block 0, 16-31 of block 8
    const int ld_row = lane & 15;
    const int ld_col = (lane >> 4) * 8;

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();
        const int next = kt + GEMM_STAGES - 1;
        if (next < k_tiles) load_tile(next % GEMM_STAGES, next);
        cp_async_commit();

        const int stage = kt % GEMM_STAGES;
        const elem_t* as = As + stage * A_TILE + (warp_m * WARP_M) * A_STRIDE;
        const elem_t* bs = Bs + stage * B_TILE + warp_n * WARP_N;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            unsigned a_frag[4][4];
            unsigned b_frag[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                ldmatrix_x4(a_frag[i],
                            smem_addr(as + (i * 16 + ld_row) * A_STRIDE + kk + ld_col));
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                unsigned r[4];
                ldmatrix_x4_trans(r, smem_addr(bs + (kk + ld_row) * B_STRIDE + j * 16 + ld_col));
                b_frag[2 * j][0] = r[0];
                b_frag[2 * j][1] = r[1];
                b_frag[2 * j + 1][0] = r[2];
                b_frag[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma16816(acc[i][j], a_frag[i], b_frag[j][0], b_frag[j][1], Kind());
        }
    }
    cp_async_wait<0>();

    const int group = lane >> 2;
    const int pair = (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = block_m + warp_m * WARP_M + i * 16 + group;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = block_n + warp_n * WARP_N + j * 8 + pair;
            if (col < N) {
                if (row < M)
                    *reinterpret_cast<unsigned*>(C + (u64)row * N + col) =
                        pack2(acc[i][j][0], acc[i][j][1], Kind());
                if (row + 8 < M)
                    *reinterpret_cast<unsigned*>(C + (u64)(row + 8) * N + col) =
                        pack2(acc[i][j][2], acc[i][j][3], Kind());
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 2)
mma_gemm_f16(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
             elem_t* __restrict__ C, int M, int N, int K) {
    mma_gemm<Half>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 2)
mma_gemm_bf16(const elem_t* __restrict__ A, const elem_t* __restrict__ B,
              elem_t* __restrict__ C, int M, int N, int K) {
    mma_gemm<BFloat16>(A, B, C, M, N, K);
}
