/* The MoE block's host side (moe.cuh): the checks of the experts' parts,
 * the workspace's layout, whether the one launch applies (seg_plan), and
 * the launches of tern_cuda_moe and tern_cuda_moe_route.
 * The integer-dot gate/up is launched with programmatic dependent launch
 * (common.cuh) behind the router: its blocks are resident before the
 * router ends, and the shared expert's request their weights before the
 * wait. The down kernel is launched the ordinary way (every PDL form of it
 * measured slower: docs/experiments/cuda-moe.md and cuda-step-timeline.md),
 * but lets its successor launch once its rows are in: the next layer's
 * input projections request their weights while the experts compute, not
 * while their rows are in flight. */
#include "cuda/moe.cuh"

static int part_ok(const tern_cuda_expert_part *p, int64_t rows, int64_t cols) {
    int g = p->group;
    return (p->bits == 4 || p->bits == 8) && p->rows == rows && p->cols == cols && (g == 32 || g == 64 || g == 128) &&
           cols % g == 0 && (cols * p->bits / 8) % 16 == 0 && p->q_off % 16 == 0 && p->s_off % 2 == 0 &&
           p->b_off % 2 == 0;
}

static part_ptr mat_part(const tern_mat *m) {
    part_ptr p = {(const uint8_t *)m->data, m->scales, m->biases, m->bits ? log2i(m->group) : 0};
    return p;
}

static int check_experts(const tern_cuda_experts *ex, tern_error *err) {
    int64_t I = ex->gate.rows, H = ex->gate.cols;
    if (!part_ok(&ex->gate, I, H) || !part_ok(&ex->up, I, H) || !part_ok(&ex->down, H, I))
        return tern_fail(err, "moe: expert parts must be q4/q8 [I, H], [I, H], [H, I] with 16-byte rows");
    if (ex->up.bits != ex->gate.bits || ex->down.bits != ex->gate.bits)
        return tern_fail(err, "moe: gate, up and down of an expert must share their bits");
    if (!ex->blobs && !ex->base) return tern_fail(err, "moe: no expert weights (blobs or base)");
    return 0;
}

static int check_shared(const tern_expert_w *sh, const tern_mat *sg, int64_t H, tern_error *err) {
    int64_t Is = sh->gate.rows;
    if (!tern_cuda_gemv_supported(&sh->gate) || !tern_cuda_gemv_supported(&sh->up) ||
        !tern_cuda_gemv_supported(&sh->down) || !sg || !tern_cuda_gemv_supported(sg))
        return tern_fail(err, "moe: shared expert or its gate in an unsupported encoding");
    if (sh->gate.cols != H || sh->up.rows != Is || sh->up.cols != H || sh->down.rows != H || sh->down.cols != Is ||
        sg->rows != 1 || sg->cols != H || mat_kind(&sh->gate) != mat_kind(&sh->up) ||
        mat_kind(&sh->gate) != mat_kind(&sh->down))
        return tern_fail(err, "moe: shared expert shapes or encodings do not match the routed experts");
    return 0;
}

/* The workspace: first, at offsets that do not depend on T (a call of
 * several tokens must not write over them), the one-launch MoE's counters
 * (S segments, a chunk per gate/up block, one for the grid: zero between
 * calls) and its partial outputs [S][hidden]; then h [T * S, Imax] and the
 * shared gates [T]. */
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* gate/up blocks per segment: two rows a warp (the grid's x, and the
 * one launch's row chunks) */
static int gud_blocks(int64_t inter) { return ceil_div(inter, 2 * GUD_WARPS); }

static size_t seg_counters(int top_k, int64_t inter) { return (size_t)(top_k + 1) + (size_t)gud_blocks(inter) + 1; }

static size_t moe_seg_bytes(int top_k, int64_t inter, int64_t hidden) {
    return align256(seg_counters(top_k, inter) * sizeof(unsigned)) +
           align256((size_t)(top_k + 1) * (size_t)hidden * sizeof(float));
}

/* a fixed-point slot: 64 segment counters (S <= 64), then the sums */
#define FX_CNT_BYTES 256
size_t tern_cuda_moe_fx_bytes(int64_t hidden) { return FX_CNT_BYTES + align256((size_t)hidden * sizeof(long long)); }
const long long *tern_cuda_moe_fx_sums(const void *fx) { return (const long long *)((const uint8_t *)fx + FX_CNT_BYTES); }

size_t tern_cuda_moe_workspace(int T, int top_k, int64_t inter, int64_t hidden) {
    return moe_seg_bytes(top_k, inter, hidden) +
           ((size_t)T * (size_t)(top_k + 1) * (size_t)inter + (size_t)T) * sizeof(float) + 256;
}

static int round32(int v) { return (v + 31) & ~31; }

/* Past the default 48 KB of dynamic shared memory (large shapes only) a
 * kernel must be allowed more. */
static int smem_attr(const void *kernel, size_t bytes, tern_error *err) {
    if (bytes <= 48 * 1024) return 0;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_fail(err, "moe: %zu bytes of shared memory: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

/* Whether the one-launch MoE applies (1, with its kernel and shared
 * memory; 0 not): one token, q4 routed experts on the integer dots, a q4
 * shared expert of the same width or none, and the grid in one wave. */
static int seg_plan(moe_args *a, dim3 gd, void (**kp)(moe_args), size_t *smem_p) {
    if (!a->one_launch || gd.y != (unsigned)a->S || a->r_kind != KIND_Q4 || a->H % XD_SPAN ||
        !(a->s_kind < 0 || (a->s_kind == KIND_Q4 && a->s_inter == a->I && a->sdown_p.gsh == log2i(a->down.group))) ||
        a->I % 32)
        return 0;
    a->dc = ceil_div(a->H, gd.x);
    /* h as digits: spans of 64, and h's floats and digits within x's region */
    a->dn_digits = a->I % XD_SPAN == 0 && a->I <= a->H;
    int gshd = log2i(a->down.group);
    seg_layout L = seg_layout_of(a->I, gshd, a->dc);
    size_t smem = xd_smem_bytes(a->H, 32) + (size_t)L.bytes;
    /* the digits during the top k: routing itself */
    const int v = (a->s_kind < 0 ? 0 : 1) + (routes_itself(*a) ? 2 : 0);
    void (*k)(moe_args) = moe_seg_of(v);
    carveout_max((const void *)k);
    /* (a failed query or shared-memory limit counts one block a SM: not one wave) */
    static occ_cache caches[4];
    const int occ = blocks_per_sm(caches[v], k, GUD_WARPS * 32, smem);
    if ((int64_t)occ * tern_cuda_sm_count() < (int64_t)gd.x * gd.y)
        return 0;   /* not one wave: the blocks of a segment could wait on blocks not yet placed */
    *kp = k;
    *smem_p = smem;
    return 1;
}

/* The one-launch MoE if it applies: 0 launched, 1 not applicable, -1 error. */
static int moe_seg(moe_args *a, dim3 gd, cudaStream_t s, tern_error *err) {
    void (*k)(moe_args) = NULL;
    size_t smem = 0;
    if (!seg_plan(a, gd, &k, &smem)) return 1;
    cudaError_t e = launch_pdl(k, gd, dim3(GUD_WARPS * 32), smem, s, *a);
    if (e != cudaSuccess) return tern_fail(err, "moe (one launch): %s", cudaGetErrorString(e));
    return launch_check("moe (one launch)", err);
}

/* The launch arguments every path shares (shapes, weights, workspace). */
static int moe_fill(moe_args &a, const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                    const float *x, int T, int top_k, const int32_t *ids, const float *wts, void *work, float *out,
                    tern_error *err) {
    if (check_experts(ex, err)) return -1;
    if (shared && check_shared(shared, shared_gate, ex->gate.cols, err)) return -1;
    if (T < 1 || top_k < 1) return tern_fail(err, "moe: T = %d, top_k = %d", T, top_k);
    memset(&a, 0, sizeof a);
    a.blobs = ex->blobs;
    a.base = ex->base;
    a.stride = ex->stride;
    a.gate = ex->gate;
    a.up = ex->up;
    a.down = ex->down;
    a.r_kind = ex->gate.bits == 4 ? KIND_Q4 : KIND_Q8;
    a.one_launch = ex->one_launch;
    a.H = (int)ex->gate.cols;
    a.I = (int)ex->gate.rows;
    a.K = top_k;
    a.S = top_k + (shared ? 1 : 0);
    a.s_kind = -1;
    a.sg_kind = -1;
    a.s_inter = 0;
    if (shared) {
        a.s_kind = mat_kind(&shared->gate);
        a.sg_kind = mat_kind(shared_gate);
        a.sgate_p = mat_part(&shared->gate);
        a.sup_p = mat_part(&shared->up);
        a.sdown_p = mat_part(&shared->down);
        a.sg_p = mat_part(shared_gate);
        a.s_inter = (int)shared->gate.rows;
    }
    a.Imax = a.I > a.s_inter ? a.I : a.s_inter;
    a.ids = ids;
    a.wts = wts;
    a.x = x;
    if (work) {   /* (none: tern_cuda_moe_routes_itself's plan) */
        a.seg_cnt = (unsigned *)work;
        a.chunk_cnt = a.seg_cnt + a.S;
        a.done_cnt = a.chunk_cnt + gud_blocks(a.Imax);
        a.part = (float *)((uint8_t *)work + align256(seg_counters(top_k, a.Imax) * sizeof(unsigned)));
        a.h = (float *)((uint8_t *)work + moe_seg_bytes(top_k, a.Imax, a.H));
        a.sg = a.h + (size_t)T * a.S * a.Imax;
    }
    a.out = out;
    if (ex->fx) {
        if (a.S > FX_CNT_BYTES / (int)sizeof(unsigned) || ((uintptr_t)ex->fx & 15) || ((uintptr_t)ex->fx_zero & 15) ||
            ex->fx_zero == ex->fx)
            return tern_fail(err, "moe: fixed-point sums need at most %d segments and two distinct 16-byte aligned slots",
                             FX_CNT_BYTES / (int)sizeof(unsigned));
        if (T != 1) return tern_fail(err, "moe: fixed-point sums are the one launch's, one token (T = %d)", T);
        a.seg_cnt = (unsigned *)ex->fx;
        a.fx_sum = (long long *)tern_cuda_moe_fx_sums(ex->fx);
        a.fx_zero = (uint4 *)ex->fx_zero;
        a.fx_zero_n = ex->fx_zero ? (int)(tern_cuda_moe_fx_bytes(a.H) / 16) : 0;
    }
    if ((int64_t)T * a.S > 65535) return tern_fail(err, "moe: %d tokens too many for one launch", T);
    return 0;
}

static dim3 gud_grid(const moe_args &a, int T) { return dim3(gud_blocks(a.Imax), T * a.S); }

/* Routing inside the one launch, within route_row<8>'s limits. */
static int route_in_ok(int top_k, int n_experts) { return n_experts >= top_k && n_experts <= 256 && top_k <= 32; }

int tern_cuda_moe_routes_itself(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                                int top_k, int n_experts) {
    moe_args a;
    tern_error err;
    void (*k)(moe_args) = NULL;
    size_t smem = 0;
    if (!route_in_ok(top_k, n_experts) || moe_fill(a, ex, shared, shared_gate, NULL, 1, top_k, NULL, NULL, NULL, NULL, &err))
        return 0;
    return seg_plan(&a, gud_grid(a, 1), &k, &smem);
}

int tern_cuda_moe_route(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                        const float *x, int top_k, const float *logits, int n_experts, int renorm, int32_t *ids,
                        float *wts, void *work, float *out, tern_stream s, tern_error *err) {
    moe_args a;
    if (moe_fill(a, ex, shared, shared_gate, x, 1, top_k, NULL, NULL, work, out, err)) return -1;
    if (!route_in_ok(top_k, n_experts))
        return tern_fail(err, "moe_route: routing inside the experts' launch does not apply here");
    a.logits = logits;
    a.n_e = n_experts;
    a.renorm = renorm;
    a.ids_out = ids;
    a.wts_out = wts;
    int rc = moe_seg(&a, gud_grid(a, 1), (cudaStream_t)s, err);
    return rc == 1 ? tern_fail(err, "moe_route: the one launch did not apply") : rc;
}

int tern_cuda_moe(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                  const float *x, int T, int top_k, const int32_t *ids, const float *wts, void *work, float *out,
                  tern_stream s, tern_error *err) {
    moe_args a;
    if (moe_fill(a, ex, shared, shared_gate, x, T, top_k, ids, wts, work, out, err)) return -1;
    /* one token of q4 experts: the one launch where it applies (its grid
     * is the integer-dot gate/up's) */
    int rc = moe_seg(&a, gud_grid(a, T), s, err);
    if (rc <= 0) return rc;   /* launched (0) or failed (-1) */
    if (a.fx_sum) return tern_fail(err, "moe: fixed-point sums need the one launch, which does not apply here");
    dim3 g1(ceil_div(a.Imax, 8), T * a.S);

    /* down: R rows per block, 16 KB of routed rows (1 to 16); routed lanes
     * (k, piece), at most 128; shared lanes: its pieces, at most 128 */
    const int rbr = (int)kind_row_bytes(a.r_kind, a.I), units = top_k * (a.I / 32);
    int R = DN_ROW_BYTES / (top_k * rbr);
    R = R < 1 ? 1 : R > 16 ? 16 : R;
    a.R = R;
    a.ntr = units < 128 ? round32(units) : 128;
    a.nts = 0;
    a.dn_wr = R * rbr;
    a.dn_ws = 0;
    a.dn_sbr = (R * (a.I / 32) * 2 + 32 + 15) & ~15;   /* the most groups (of 32), the 16-byte blocks at both ends */
    a.dn_sbs = 0;
    if (shared) {
        int nps = (a.s_inter + 31) / 32;
        a.nts = nps < 128 ? round32(nps) : 128;
        a.dn_ws = R * (int)kind_row_bytes(a.s_kind, a.s_inter);
        a.dn_sbs = (R * nps * 2 + 32 + 15) & ~15;
    }
    a.nt = a.ntr + a.nts;
    size_t smem2 = (size_t)top_k * a.dn_wr + a.dn_ws + (size_t)top_k * 2 * a.dn_sbr + 2 * (size_t)a.dn_sbs +
                   (size_t)R * a.nt * sizeof(float) + (size_t)top_k * (3 * sizeof(void *) + sizeof(float));
    dim3 g2(ceil_div(a.H, R), T);
    void (*k2)(moe_args, float *) = moe_down_of(a.r_kind, a.s_kind);
    if (smem_attr((const void *)k2, smem2, err)) return -1;

    if (a.H % XD_SPAN == 0) {
        /* integer dots; the digits of x in shared memory */
        size_t smem1 = xd_smem_bytes(a.H, a.r_kind == KIND_Q4 ? 32 : 16);
        void (*k1)(moe_args) = moe_gate_up_d_of(a.r_kind, a.s_kind);
        dim3 gd = gud_grid(a, T);
        if (smem_attr((const void *)k1, smem1, err)) return -1;
        cudaError_t e1 = launch_pdl(k1, gd, dim3(GUD_WARPS * 32), smem1, s, a);
        if (e1 != cudaSuccess) return tern_fail(err, "moe gate/up: %s", cudaGetErrorString(e1));
    } else {
        moe_gate_up_launch(g1, s, a);
    }
    if (launch_check("moe gate/up", err)) return -1;
    void *args[] = {&a, &out};
    carveout_max((const void *)k2);
    cudaError_t e = cudaLaunchKernel((const void *)k2, g2, dim3(a.nt), args, smem2, s);
    if (e != cudaSuccess) return tern_fail(err, "moe down: %s", cudaGetErrorString(e));
    return 0;
}
