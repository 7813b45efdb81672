// Tiled shared-memory SGEMM: C = A @ B for row-major float32, any M, N, K.
//
// Block tile SGEMM_BM x SGEMM_BN x SGEMM_BK = 128 x 128 x 8 with 256 threads; each thread
// accumulates an 8 x 8 sub-tile held in registers, split into two 4-wide halves 64 apart
// so a quarter-warp's float4 reads of shared memory are contiguous (no bank conflicts).
// Loads past the matrix edges read zeros; stores past them are skipped.

#ifndef SGEMM_BM
#define SGEMM_BM 128
#endif
#ifndef SGEMM_BN
#define SGEMM_BN 128
#endif
#ifndef SGEMM_BK
#define SGEMM_BK 8
#endif
#define SGEMM_THREADS 256

static_assert(SGEMM_BM == 128 && SGEMM_BN == 128 && SGEMM_BK == 8,
              "the thread mapping assumes a 128 x 128 x 8 tile");

typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(SGEMM_THREADS, 2)
tiled_sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
            int M, int N, int K) {
    __shared__ __align__(16) float As[SGEMM_BK][SGEMM_BM];  // A tile, transposed
    __shared__ __align__(16) float Bs[SGEMM_BK][SGEMM_BN];

    const int tid = threadIdx.x;
    const int tx = tid & 15;
    const int ty = tid >> 4;
    const int block_m = blockIdx.y * SGEMM_BM;
    const int block_n = blockIdx.x * SGEMM_BN;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += SGEMM_BK) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int e = tid + r * SGEMM_THREADS;
            const int row = e & (SGEMM_BM - 1);
            const int col = e >> 7;
            const int gr = block_m + row;
            const int gc = k0 + col;
            As[col][row] = (gr < M && gc < K) ? A[(u64)gr * K + gc] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int e = tid + r * SGEMM_THREADS;
            const int row = e >> 7;
            const int col = e & (SGEMM_BN - 1);
            const int gr = k0 + row;
            const int gc = block_n + col;
            Bs[row][col] = (gr < K && gc < N) ? B[(u64)gr * N + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SGEMM_BK; ++k) {
            float a[8], b[8];
            const float4 a0 = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[k][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[k][64 + tx * 4]);
            a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
            a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
            b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
            b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = block_m + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int col = block_n + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
            if (col < N) C[(u64)row * N + col] = acc[i][j];
        }
    }
}
