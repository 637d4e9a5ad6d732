/* Causal attention for a prefill of T tokens at positions pos0 .. pos0 +
 * T - 1 over the quantized KV cache (flash-attention style): a block takes
 * 64 query rows — TB tokens x the Gb query heads that share a KV head (GQA:
 * each K/V row is read once for all of them; Qwen3.6: 8 tokens x 8 heads)
 * — and walks the cache in tiles of 64 positions up to its last token's
 * position: K and V rows dequantized to f16 in shared memory, S = Q K^T on
 * the tensor cores (mma m16n8k16, f16 in, fp32 accumulation), the causal
 * mask, an online softmax per row in fp32 (running max and sum, the output
 * rescaled when the max grows), O += P V with P rounded to f16; at the end
 * O / sum times sigmoid(gate).
 *
 * f16 rather than bf16: the cache itself is f16 (bits 16: exact; 8/4 bits:
 * q * scale + bias rounded once, 2^-11 relative), P lies in [0, 1] and q is
 * scaled by softmax_scale * log2(e) before rounding; f16 carries 3 more
 * mantissa bits than bf16 at the same tensor-core rate.
 *
 * 4 warps, 16 query rows each: a warp holds its rows' S tile (16 x 64) and
 * O (16 x head_dim: 128 fp32 registers at head_dim 256) in registers; the
 * S accumulators become the A fragments of P V without leaving them. */
#include <float.h>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

#define QR 64                 /* query rows per block */
#define KT 64                 /* cache positions per tile */
#define AP_WARPS 4
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define AP_MIN_SPLIT 512      /* positions a split walks at least */
#define AP_BLOCKS_PER_SM 2    /* resident at head_dim 256 (shared memory, registers) */
#define AP_MAX_WAVES 3        /* rounds of blocks a split launch may take */



/* Row j's values d .. d + 7 of KV head kvh, dequantized (q * scale + bias
 * in fp32, as tern_kv_dequantize_row). */
template <int BITS>
__device__ __forceinline__ void kv_piece(const uint8_t *cache, const kv_layout &L, int j, int first, int d, bool al,
                                         float (&v)[8]) {
    const uint8_t *row = cache + (size_t)j * L.row_bytes;
    kv_load8<BITS>(row + (size_t)first * BITS / 8, d, al, v);
    if (BITS != 16) {
        const uint16_t *sb = (const uint16_t *)(row + L.q_bytes);
        int g = (first + d) / L.group;
        float s = h2f(sb[g]), b = h2f(sb[L.n_groups + g]);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = fmaf(v[e], s, b);
    }
}

typedef struct {
    tern_cuda_attn_dims d;
    kv_layout L;
    const float *qg;
    const uint8_t *kc, *vc;
    float *o;
    int T, pos0, gb, tb, ngq;   /* heads and tokens per block, head groups per KV head */
    float qscale;               /* softmax scale * log2(e) */
    bool al;
    int ns, sl;                 /* splits of the context (blockIdx.z) and their length */
    float *part;                /* ns > 1: the splits' records (att_combine's layout) */
} ap_args;

/* A split's result for this thread's two rows (r0, r0 + 8): the output
 * not yet divided by its sum, and (max, sum), the max in natural-log
 * units (the scores carry log2 e), as the split-K attention's records. */
template <int HD>
__device__ __forceinline__ void split_record(const ap_args &a, float (&oacc)[HD / 8][4], const float (&m)[2],
                                             const float (&l)[2], const int (&lim)[2], int t0, int h0, int split,
                                             int r0, int t2, int lane) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (lim[h] < 0) continue;
        int r = r0 + 8 * h, t = t0 + r / a.gb, head = h0 + r % a.gb;
        size_t rec = ((size_t)t * a.d.n_heads + head) * a.ns + split;
        float *po = a.part + rec * HD;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) *(float2 *)(po + i * 8 + t2) = make_float2(oacc[i][2 * h], oacc[i][2 * h + 1]);
        if ((lane & 3) == 0) {
            float *ml = a.part + (size_t)a.T * a.d.n_heads * a.ns * HD + 2 * rec;
            ml[0] = m[h] == -INFINITY ? -INFINITY : m[h] * LN2;
            ml[1] = l[h];
        }
    }
}

template <int HD, int BITS>
__global__ void __launch_bounds__(AP_WARPS * 32) attn_prefill_kernel(ap_args a) {
    constexpr int LQ = HD + 8, LV = KT + 8;   /* padded rows: fragment loads on 32 distinct banks */
    extern __shared__ __align__(16) uint16_t smh[];
    uint16_t *Qs = smh, *Ks = Qs + QR * LQ, *Vt = Ks + KT * LQ;   /* Vt: [HD][KT], V transposed */
    int G = a.d.n_heads / a.d.n_kv, kvh = blockIdx.y / a.ngq, gq = blockIdx.y % a.ngq;
    /* the last tokens (the longest walks) first, so the short blocks fill the tail */
    int t0 = (gridDim.x - 1 - blockIdx.x) * a.tb, h0 = kvh * G + gq * a.gb, first = kvh * HD;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x;
    /* the block's queries, scaled, as f16 rows; rows past the block's tokens or heads are zero */
    for (int e = tid; e < QR * (HD / 2); e += nt) {
        int r = e / (HD / 2), d = 2 * (e % (HD / 2)), t = t0 + r / a.gb, hh = gq * a.gb + r % a.gb;
        float x0 = 0.0f, x1 = 0.0f;
        if (r < a.tb * a.gb && t < a.T && hh < G) {
            const float *q = a.qg + ((size_t)t * a.d.n_heads + kvh * G + hh) * 2 * HD;
            x0 = q[d] * a.qscale;
            x1 = q[d + 1] * a.qscale;
        }
        *(uint32_t *)(Qs + r * LQ + d) = pack_f16(x0, x1);
    }
    int t_last = min(t0 + a.tb, a.T) - 1, kv_end = a.pos0 + t_last + 1;
    /* this block's split of the positions: [lo, hi) */
    int split = blockIdx.z, lo = split * a.sl, hi = min(kv_end, lo + a.sl);
    /* this thread's rows (g and g + 8 of the warp's 16) and the last position each may see */
    int gr = lane >> 2, t2 = 2 * (lane & 3), lim[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = warp * 16 + gr + 8 * h, t = t0 + r / a.gb, hh = gq * a.gb + r % a.gb;
        lim[h] = r < a.tb * a.gb && t < a.T && hh < G ? a.pos0 + t : -1;
    }
    float oacc[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < HD / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
    for (int kv0 = lo; kv0 < hi; kv0 += KT) {
        __syncthreads();   /* the last tile's readers are done (and Qs is written) */
        for (int e = tid; e < KT * (HD / 8); e += nt) {
            int jj = e % KT, d = 8 * (e / KT), j = kv0 + jj;   /* a warp: 32 positions, one 8-value piece */
            float kv[8] = {}, vv[8] = {};
            if (j < hi) {
                kv_piece<BITS>(a.kc, a.L, j, first, d, a.al, kv);
                kv_piece<BITS>(a.vc, a.L, j, first, d, a.al, vv);
            }
            uint4 u = {pack_f16(kv[0], kv[1]), pack_f16(kv[2], kv[3]), pack_f16(kv[4], kv[5]), pack_f16(kv[6], kv[7])};
            *(uint4 *)(Ks + jj * LQ + d) = u;
#pragma unroll
            for (int i = 0; i < 8; i++) Vt[(d + i) * LV + jj] = __half_as_ushort(__float2half_rn(vv[i]));
        }
        __syncthreads();
        float s[KT / 8][4];
#pragma unroll
        for (int n = 0; n < KT / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < HD; k += 16) {
            uint32_t af[4];
            frag_a(af, Qs, LQ, warp * 16, k, lane);
#pragma unroll
            for (int n = 0; n < KT / 8; n++) {
                uint32_t bf[2];
                frag_b(bf, Ks, LQ, n * 8, k, lane);
                mma_f16(s[n], af, bf);
            }
        }
        /* mask, running max, rescale, probabilities (exp2: q carries log2 e) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < KT / 8; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int j = kv0 + n * 8 + t2 + c;
                    float v = j <= lim[h] && j < hi ? s[n][2 * h + c] : -INFINITY;
                    s[n][2 * h + c] = v;
                    mx = fmaxf(mx, v);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mn = fmaxf(m[h], mx), mu = mn == -INFINITY ? 0.0f : mn;   /* nothing seen yet: no NaN */
            float corr = exp2f(m[h] - mu);
            m[h] = mn;
            l[h] *= corr;
#pragma unroll
            for (int i = 0; i < HD / 8; i++) { oacc[i][2 * h] *= corr; oacc[i][2 * h + 1] *= corr; }
#pragma unroll
            for (int n = 0; n < KT / 8; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float p = exp2f(s[n][2 * h + c] - mu);
                    s[n][2 * h + c] = p;
                    l[h] += p;
                }
        }
        /* O += P V: the S accumulators of key tiles 2k, 2k + 1 are the A
         * fragment of keys 16k .. 16k + 15 */
#pragma unroll
        for (int k = 0; k < KT / 16; k++) {
            uint32_t af[4] = {pack_f16(s[2 * k][0], s[2 * k][1]), pack_f16(s[2 * k][2], s[2 * k][3]),
                              pack_f16(s[2 * k + 1][0], s[2 * k + 1][1]), pack_f16(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                uint32_t bf[2];
                frag_b(bf, Vt, LV, i * 8, k * 16, lane);
                mma_f16(oacc[i], af, bf);
            }
        }
    }
    /* the row sums are spread over the four threads of a row */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    if (a.ns > 1) {
        split_record<HD>(a, oacc, m, l, lim, t0, h0, split, warp * 16 + gr, t2, lane);
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (lim[h] < 0) continue;
        int r = warp * 16 + gr + 8 * h, t = t0 + r / a.gb, head = h0 + r % a.gb;
        const float *gate = a.qg + ((size_t)t * a.d.n_heads + head) * 2 * HD + HD;
        float *o = a.o + ((size_t)t * a.d.n_heads + head) * HD;
        float inv = 1.0f / l[h];
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            int d = i * 8 + t2;
            o[d] = oacc[i][2 * h] * inv * sigmoid_f(gate[d]);
            o[d + 1] = oacc[i][2 * h + 1] * inv * sigmoid_f(gate[d + 1]);
        }
    }
}

template <int HD>
static int launch_hd(const ap_args &a, dim3 grid, cudaStream_t s) {
    size_t smem = ((size_t)(QR + KT) * (HD + 8) + (size_t)HD * (KT + 8)) * sizeof(uint16_t);
    switch (a.L.bits) {
    case 16:
        cudaFuncSetAttribute(attn_prefill_kernel<HD, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attn_prefill_kernel<HD, 16><<<grid, AP_WARPS * 32, smem, s>>>(a);
        break;
    case 8:
        cudaFuncSetAttribute(attn_prefill_kernel<HD, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attn_prefill_kernel<HD, 8><<<grid, AP_WARPS * 32, smem, s>>>(a);
        break;
    default:
        cudaFuncSetAttribute(attn_prefill_kernel<HD, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attn_prefill_kernel<HD, 4><<<grid, AP_WARPS * 32, smem, s>>>(a);
        break;
    }
    return 0;
}

/* A launch's blocks for T tokens: tokens per block x query head groups. */
static int ap_blocks(const tern_cuda_attn_dims *d, int T, int *tb, int *gb, int *ngq) {
    int G = d->n_heads / d->n_kv;
    *gb = G < QR ? G : QR;
    *tb = QR / *gb;
    *ngq = (G + *gb - 1) / *gb;
    return ceil_div(T, *tb) * d->n_kv * *ngq;
}

/* Splits of the context for a launch of `blocks` blocks ending at position
 * n: one where the blocks fill the SMs (a prefill's usual launch). Few
 * blocks (a short prefill after a long context) walk long contexts on few
 * SMs: then the count whose rounds of AP_BLOCKS_PER_SM blocks per SM walk
 * the fewest positions, at most AP_MAX_WAVES rounds, splits no shorter
 * than AP_MIN_SPLIT. */
static int ap_splits(int blocks, int n) {
    int slots = AP_BLOCKS_PER_SM * tern_cuda_sm_count();
    if (blocks >= tern_cuda_sm_count()) return 1;
    long best = (long)n;
    int pick = 1;
    for (int ns = 2; ns * AP_MIN_SPLIT <= n && blocks * ns <= AP_MAX_WAVES * slots; ns++) {
        int sl = att_split_len(n, ns), used = ceil_div(n, sl);
        long walk = (long)ceil_div(blocks * used, slots) * sl;
        if (walk < best) best = walk, pick = ns;
    }
    return pick;
}

static size_t ap_record_bytes(const tern_cuda_attn_dims *d) {
    return (size_t)d->n_heads * (d->head_dim + 2) * sizeof(float);
}

/* The most splits ap_splits may pick for T tokens, at any context up to
 * n_ctx_max. */
size_t tern_cuda_attention_prefill_workspace(const tern_cuda_attn_dims *d, int n_ctx_max) {
    size_t most = 0;
    int tb, gb, ngq, blocks, slots = AP_BLOCKS_PER_SM * tern_cuda_sm_count();
    for (int T = 1; (blocks = ap_blocks(d, T, &tb, &gb, &ngq)) < tern_cuda_sm_count(); T++) {
        int ns = AP_MAX_WAVES * slots / blocks, cap = n_ctx_max / AP_MIN_SPLIT;
        if (ns > cap) ns = cap;
        if (ns > 1 && (size_t)T * ns > most) most = (size_t)T * ns;
    }
    return most * ap_record_bytes(d);
}

int tern_cuda_attention_prefill(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg,
                                const uint8_t *kcache, const uint8_t *vcache, int T, int pos0, float scale,
                                void *work, size_t work_bytes, float *o, tern_stream s, tern_error *err) {
    int hd = d->head_dim;
    if (T < 1 || pos0 < 0 || (hd != 32 && hd != 64 && hd != 128 && hd != 256) || L->head_dim != hd ||
        L->n_heads != d->n_kv || d->n_kv < 1 || d->n_heads % d->n_kv || (L->bits != 16 && L->group % 8))
        return tern_fail(err, "attention_prefill: head_dim %d (32/64/128/256) or heads %d/%d do not match the KV layout",
                         hd, d->n_heads, d->n_kv);
    ap_args a;
    a.d = *d;
    a.L = kv_of(L);
    a.qg = qg;
    a.kc = kcache;
    a.vc = vcache;
    a.o = o;
    a.T = T;
    a.pos0 = pos0;
    int blocks = ap_blocks(d, T, &a.tb, &a.gb, &a.ngq), n_last = pos0 + T;
    a.qscale = scale * LOG2E;
    /* as many splits as the workspace holds records for */
    a.ns = ap_splits(blocks, n_last);
    size_t fit = work ? work_bytes / ((size_t)T * ap_record_bytes(d)) : 0;
    if ((size_t)a.ns > fit) a.ns = fit > 1 ? (int)fit : 1;
    a.sl = a.ns > 1 ? att_split_len(n_last, a.ns) : n_last;
    a.part = (float *)work;
    size_t need_al = L->bits == 16 ? 16 : L->bits == 8 ? 8 : 4, first = (size_t)hd * L->bits / 8;
    a.al = L->row_bytes % need_al == 0 && first % need_al == 0 && (uintptr_t)kcache % need_al == 0 &&
           (uintptr_t)vcache % need_al == 0;
    /* (att_split_len may need fewer splits than planned to cover n_last) */
    int used = a.ns > 1 ? ceil_div(n_last, a.sl) : 1;
    dim3 grid(ceil_div(T, a.tb), d->n_kv * a.ngq, used);
    switch (hd) {
    case 32: launch_hd<32>(a, grid, s); break;
    case 64: launch_hd<64>(a, grid, s); break;
    case 128: launch_hd<128>(a, grid, s); break;
    default: launch_hd<256>(a, grid, s); break;
    }
    if (launch_check("attention_prefill", err)) return -1;
    if (a.ns == 1) return 0;
    cudaError_t e = att_combine(*d, qg, a.part, pos0, NULL, T, a.ns, o, (cudaStream_t)s);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_fail(err, "attention_prefill combine: %s", cudaGetErrorString(e));
    }
    return 0;
}
