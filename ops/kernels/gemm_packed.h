/*
 * gemm_packed.h — the packed, cache-blocked GEMM (f32 or f64) around one micro-kernel; included once by each ISA file,
 * so the packing loops are compiled for that file's instruction set too.
 *
 *   C[m,p] (+)= op(A)[m,k] op(B)[k,p],  A stored [m,k] or [k,m] (trans_a), B stored [k,p] or [p,k] (trans_b)
 *
 * Before including, the file defines:
 *   GEMM_T, GEMM_KC, GEMM_MC, GEMM_NC (optional, all four or none)
 *                      the element type and its cache blocking; without them float and QKV_GEMM_KC/MC/NC
 *                      (the f64 files define double and QKV_GEMM_F64_KC/MC/NC, gemm_kernels.h)
 *   GEMM_MR, GEMM_NR   the micro-tile: GEMM_MR rows by GEMM_NR columns of C
 *   GEMM_NAME          the function to define (declared in gemm_kernels.h)
 *   ukernel(kc, a, b, c, ldc, add)
 *                      c[r*ldc + j] = (add ? c[r*ldc + j] : 0) + sum_l a[l*MR + r] * b[l*NR + j]
 *                      for a packed MR x kc panel a and kc x NR panel b (64-byte aligned), full tile.
 *   GEMM_HAS_EDGE_KERNEL and ukernel_edge(kc, a, b, c, ldc, add, mr, nr) (optional)
 *                      the same for an edge tile, writing only rows < mr and columns < nr of C, with the
 *                      same arithmetic per element as ukernel. Without it, edge tiles go through a local
 *                      tile buffer (ukernel into the buffer, then the valid part added to C).
 *   GEMM_HAS_DIRECT_A and ukernel_direct(kc, a, rs_a, cs_a, b, c, ldc, add, mr, nr) (optional)
 *                      a tile like ukernel / ukernel_edge, but reading A where it lies: row r of the tile,
 *                      depth l at a[r*rs_a + l*cs_a], never a row >= mr. Used instead of packing A when
 *                      qkv_gemm_direct_a_ (gemm_kernels.h) says so for the shape (narrow outputs, where
 *                      each panel of A feeds only a few tiles and packing it costs about as much).
 *   GEMM_ROWS_NAME (optional)
 *                      a second entry point taking a range of rows of C [i_begin, i_end), with the same bits
 *                      as GEMM_NAME over all rows (ops/gemm.c splits the rows of a large GEMM over threads).
 *   GEMM_SMALL_NAME and GEMM_SMALL_ROWS(nr) (optional, with an any_tile that reads B in place)
 *                      the small path's entry point (nothing packed, see its definition at the end) and
 *                      the rows of its tiles for nr columns.
 *   GEMM_HAS_PACK_T and pack_t(src, ld, kc, dst, rows) (optional)
 *                      dst[l*rows + r] = src[r*ld + l] for r < rows (rows is GEMM_MR or GEMM_NR), l < kc:
 *                      the transposing pack of a full panel, with the ISA's shuffles. Without it, scalar loops.
 *
 * Loops, outermost first (the BLIS layering, with C row-major so the vector runs along C's columns):
 *   jc over columns of C by NC     (packed B block, KC x NC, stays in L2)
 *     pc over depth by KC          pack op(B)[pc:pc+kc, jc:jc+nc] into NR-column panels
 *       ic over rows of C by MC    pack op(A)[ic:ic+mc, pc:pc+kc] into MR-row panels
 *         ir over MR-row panels    (one MR x kc panel of A stays in L1)
 *           jr over NR panels      micro-kernel on one MR x NR tile of C
 * Edge tiles: panels are zero-padded to MR rows / NR columns; the ISA's edge kernel writes the valid part
 * of the tile, or the full kernel writes into a local buffer whose valid part is then added to C. Either
 * way each element gets the same arithmetic as in a full tile, in the same order.
 * The first depth block writes C (or adds to it with accumulate); later depth blocks add.
 */
#ifndef GEMM_MR
#error "define GEMM_MR, GEMM_NR, GEMM_NAME and ukernel before including gemm_packed.h"
#endif

#include <string.h>

#include "gemm_kernels.h"

#ifndef GEMM_T /* the element type and its blocking: f32 unless the file says otherwise */
#define GEMM_T float
#define GEMM_KC QKV_GEMM_KC
#define GEMM_MC QKV_GEMM_MC
#define GEMM_NC QKV_GEMM_NC
#endif
#define GEMM_BPACK (GEMM_KC * GEMM_NC)

_Static_assert(GEMM_MC % GEMM_MR == 0, "MC must be a multiple of MR");
_Static_assert(GEMM_NC % GEMM_NR == 0, "NC must be a multiple of NR");

static inline int64_t gemm_min(int64_t x, int64_t y) { return x < y ? x : y; }

/* Pack op(A)[i0:i0+mc, l0:l0+kc] into MR-row panels: panel q holds dst[q*MR*kc + l*MR + r] = op(A)[i0+q*MR+r, l0+l],
 * rows past mc zero. A is [m,k] (trans_a false) or [k,m] (trans_a true). */
static void pack_a(const GEMM_T *restrict a, int64_t m, int64_t k, bool trans_a, int64_t i0, int64_t mc,
                   int64_t l0, int64_t kc, GEMM_T *restrict dst) {
    for (int64_t ir = 0; ir < mc; ir += GEMM_MR, dst += GEMM_MR * kc) {
        int64_t mr = gemm_min(GEMM_MR, mc - ir);
        if (trans_a) { /* row l of A holds op(A)[:, l]: copy mr contiguous values per l */
            const GEMM_T *src = a + l0 * m + i0 + ir;
            if (mr == GEMM_MR) { /* a constant-size memcpy: inlined as a few vector moves */
                for (int64_t l = 0; l < kc; l++, src += m) memcpy(dst + l * GEMM_MR, src, GEMM_MR * sizeof *src);
            } else {
                for (int64_t l = 0; l < kc; l++, src += m) {
                    for (int r = 0; r < mr; r++) dst[l * GEMM_MR + r] = src[r];
                    for (int r = (int)mr; r < GEMM_MR; r++) dst[l * GEMM_MR + r] = (GEMM_T)0;
                }
            }
        } else { /* row i of A holds op(A)[i, :]: interleave mr rows */
            const GEMM_T *src = a + (i0 + ir) * k + l0;
            if (mr == GEMM_MR) {
#ifdef GEMM_HAS_PACK_T
                pack_t(src, k, kc, dst, GEMM_MR);
#else
                for (int64_t l = 0; l < kc; l++)
                    for (int r = 0; r < GEMM_MR; r++) dst[l * GEMM_MR + r] = src[r * k + l];
#endif
            } else {
                for (int64_t l = 0; l < kc; l++) {
                    for (int r = 0; r < mr; r++) dst[l * GEMM_MR + r] = src[r * k + l];
                    for (int r = (int)mr; r < GEMM_MR; r++) dst[l * GEMM_MR + r] = (GEMM_T)0;
                }
            }
        }
    }
}

/* Pack op(B)[l0:l0+kc, j0:j0+nc] into NR-column panels: dst[q*NR*kc + l*NR + j] = op(B)[l0+l, j0+q*NR+j],
 * columns past nc zero. B is [k,p] (trans_b false) or [p,k] (trans_b true). */
static void pack_b(const GEMM_T *restrict b, int64_t k, int64_t p, bool trans_b, int64_t l0, int64_t kc,
                   int64_t j0, int64_t nc, GEMM_T *restrict dst) {
    for (int64_t jr = 0; jr < nc; jr += GEMM_NR, dst += GEMM_NR * kc) {
        int64_t nr = gemm_min(GEMM_NR, nc - jr);
        if (!trans_b) { /* row l of B holds op(B)[l, :]: copy nr contiguous values per l */
            const GEMM_T *src = b + l0 * p + j0 + jr;
            if (nr == GEMM_NR) { /* a constant-size memcpy: inlined as a few vector moves */
                for (int64_t l = 0; l < kc; l++, src += p) memcpy(dst + l * GEMM_NR, src, GEMM_NR * sizeof *src);
            } else {
                for (int64_t l = 0; l < kc; l++, src += p) {
                    for (int j = 0; j < nr; j++) dst[l * GEMM_NR + j] = src[j];
                    for (int j = (int)nr; j < GEMM_NR; j++) dst[l * GEMM_NR + j] = (GEMM_T)0;
                }
            }
        } else { /* row j of B holds op(B)[:, j]: interleave nr rows */
            const GEMM_T *src = b + (j0 + jr) * k + l0;
            if (nr == GEMM_NR) {
#ifdef GEMM_HAS_PACK_T
                pack_t(src, k, kc, dst, GEMM_NR);
#else
                for (int64_t l = 0; l < kc; l++)
                    for (int j = 0; j < GEMM_NR; j++) dst[l * GEMM_NR + j] = src[j * k + l];
#endif
            } else {
                for (int64_t l = 0; l < kc; l++) {
                    for (int j = 0; j < nr; j++) dst[l * GEMM_NR + j] = src[j * k + l];
                    for (int j = (int)nr; j < GEMM_NR; j++) dst[l * GEMM_NR + j] = (GEMM_T)0;
                }
            }
        }
    }
}

#ifdef GEMM_HAS_DIRECT_A
/* One MC x NC block of C from A in place (a at op(A)[ic, pc], element (i, l) at a[i*rs_a + l*cs_a]) and
 * packed panels of B. */
static void macro_kernel_direct(int64_t mc, int64_t nc, int64_t kc, const GEMM_T *restrict a, int64_t rs_a,
                                int64_t cs_a, const GEMM_T *restrict bpack, GEMM_T *restrict c, int64_t ldc,
                                bool add) {
    for (int64_t ir = 0; ir < mc; ir += GEMM_MR) {
        int64_t mr = gemm_min(GEMM_MR, mc - ir);
        for (int64_t jr = 0; jr < nc; jr += GEMM_NR) {
            int64_t nr = gemm_min(GEMM_NR, nc - jr);
            ukernel_direct(kc, a + ir * rs_a, rs_a, cs_a, bpack + jr * kc, c + ir * ldc + jr, ldc, add, mr, nr);
        }
    }
}
#endif

/* One MC x NC block of C from packed panels: every MR x NR tile, edges through a local tile. */
static void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const GEMM_T *restrict apack,
                         const GEMM_T *restrict bpack, GEMM_T *restrict c, int64_t ldc, bool add) {
#ifndef GEMM_HAS_EDGE_KERNEL
    _Alignas(64) GEMM_T tile[GEMM_MR * GEMM_NR];
#endif
    for (int64_t ir = 0; ir < mc; ir += GEMM_MR) {
        int64_t mr = gemm_min(GEMM_MR, mc - ir);
        const GEMM_T *ap = apack + ir * kc;
        for (int64_t jr = 0; jr < nc; jr += GEMM_NR) {
            int64_t nr = gemm_min(GEMM_NR, nc - jr);
            const GEMM_T *bp = bpack + jr * kc;
            GEMM_T *ct = c + ir * ldc + jr;
            if (mr == GEMM_MR && nr == GEMM_NR) {
                ukernel(kc, ap, bp, ct, ldc, add);
                continue;
            }
#ifdef GEMM_HAS_EDGE_KERNEL
            ukernel_edge(kc, ap, bp, ct, ldc, add, mr, nr);
#else
            ukernel(kc, ap, bp, tile, GEMM_NR, false);
            for (int64_t r = 0; r < mr; r++) {
                GEMM_T *cr = ct + r * ldc;
                const GEMM_T *tr = tile + r * GEMM_NR;
                if (add)
                    for (int64_t j = 0; j < nr; j++) cr[j] += tr[j];
                else
                    for (int64_t j = 0; j < nr; j++) cr[j] = tr[j];
            }
#endif
        }
    }
}

/* Rows [i_begin, i_end) of C (the whole GEMM: 0, m). Every element gets the same arithmetic whatever the range
 * (kc and the direct-A choice come from the whole shape, the MC blocks only order the tiles), so threads that
 * each take a range of rows give the bits one call over all rows gives. */
static bool gemm_packed_rows(const GEMM_T *a, const GEMM_T *b, GEMM_T *c, int64_t m, int64_t k, int64_t p,
                             bool trans_a, bool trans_b, bool accumulate, GEMM_T *apack, GEMM_T *bpack,
                             int64_t i_begin, int64_t i_end) {
    /* Split k into equal depth blocks of at most KC (a multiple of 16 when k allows, for the transposing
     * packs), so the last block is never a sliver: kc depends only on k, so the order of the sums is fixed. */
    int64_t nblocks_k = (k + GEMM_KC - 1) / GEMM_KC;
    int64_t kc_step = (k + nblocks_k - 1) / nblocks_k;
    if (nblocks_k > 1) kc_step = gemm_min(GEMM_KC, (kc_step + 15) & ~(int64_t)15);
    /* The packed B block takes as many NR-column panels as fit the buffer at this depth (NC columns at
     * full depth KC, more when k is shallower): A is repacked once per block of columns. */
    int64_t nc_step = GEMM_BPACK / kc_step / GEMM_NR * GEMM_NR;
#ifdef GEMM_HAS_DIRECT_A
    const bool direct_a = qkv_gemm_direct_a_(m, k, p, trans_a); /* from the shape only: same bits every call */
    const int64_t rs_a = trans_a ? 1 : k, cs_a = trans_a ? m : 1; /* op(A)[i, l] = a[i*rs_a + l*cs_a] */
#endif

    for (int64_t jc = 0; jc < p; jc += nc_step) {
        int64_t nc = gemm_min(nc_step, p - jc);
        for (int64_t pc = 0; pc < k; pc += kc_step) {
            int64_t kc = gemm_min(kc_step, k - pc);
            bool add = accumulate || pc > 0;
            // Bp = op(B)[pc:pc+kc, jc:jc+nc] in NR-column panels
            pack_b(b, k, p, trans_b, pc, kc, jc, nc, bpack);
            for (int64_t ic = i_begin; ic < i_end; ic += GEMM_MC) {
                int64_t mc = gemm_min(GEMM_MC, i_end - ic);
#ifdef GEMM_HAS_DIRECT_A
                if (direct_a) { // C[ic:ic+mc, jc:jc+nc] (+)= op(A)[ic:ic+mc, pc:pc+kc] Bp, A read in place
                    macro_kernel_direct(mc, nc, kc, a + ic * rs_a + pc * cs_a, rs_a, cs_a, bpack, c + ic * p + jc,
                                        p, add);
                    continue;
                }
#endif
                // Ap = op(A)[ic:ic+mc, pc:pc+kc] in MR-row panels
                pack_a(a, m, k, trans_a, ic, mc, pc, kc, apack);
                // C[ic:ic+mc, jc:jc+nc] (+)= Ap Bp
                macro_kernel(mc, nc, kc, apack, bpack, c + ic * p + jc, p, add);
            }
        }
    }
    return true;
}

bool GEMM_NAME(const GEMM_T *a, const GEMM_T *b, GEMM_T *c, int64_t m, int64_t k, int64_t p, bool trans_a,
               bool trans_b, bool accumulate, GEMM_T *apack, GEMM_T *bpack) {
    return gemm_packed_rows(a, b, c, m, k, p, trans_a, trans_b, accumulate, apack, bpack, 0, m);
}

#ifdef GEMM_ROWS_NAME
/* Rows [i_begin, i_end) of C only, with the bits of GEMM_NAME over all rows (ops/gemm.c's threads). */
bool GEMM_ROWS_NAME(const GEMM_T *a, const GEMM_T *b, GEMM_T *c, int64_t m, int64_t k, int64_t p, bool trans_a,
                    bool trans_b, bool accumulate, GEMM_T *apack, GEMM_T *bpack, int64_t i_begin, int64_t i_end) {
    return gemm_packed_rows(a, b, c, m, k, p, trans_a, trans_b, accumulate, apack, bpack, i_begin, i_end);
}
#endif

#ifdef GEMM_SMALL_NAME
/* Small problems (ops/gemm.c sends op(B) of at most QKV_GEMM_SMALL_B floats here): nothing is packed. A is
 * read where it lies, B (row-major [k, p], already transposed by the caller if it was stored [p, k]) too,
 * and each tile of C (GEMM_SMALL_ROWS(nr) rows by up to NR columns) sums over the whole depth in one pass:
 * the tile's B strip stays in L1. Needs the ISA's any_tile(kc, a, b, c, ldc, add, mr, nr, direct, rs_a,
 * cs_a, b_in_place, ldb). */
bool GEMM_SMALL_NAME(const GEMM_T *a, const GEMM_T *b, GEMM_T *c, int64_t m, int64_t k, int64_t p, bool trans_a,
                     bool accumulate) {
    const int64_t rs_a = trans_a ? 1 : k, cs_a = trans_a ? m : 1; /* op(A)[i, l] = a[i*rs_a + l*cs_a] */
    for (int64_t j0 = 0; j0 < p; j0 += GEMM_NR) {
        int64_t nr = gemm_min(GEMM_NR, p - j0), rows = GEMM_SMALL_ROWS(nr);
        for (int64_t i0 = 0; i0 < m; i0 += rows) {
            // C[i0:i0+mr, j0:j0+nr] (+)= op(A)[i0:i0+mr, :] B[:, j0:j0+nr]
            any_tile(k, a + i0 * rs_a, b + j0, c + i0 * p + j0, p, accumulate, gemm_min(rows, m - i0), nr, true,
                     rs_a, cs_a, true, p);
        }
    }
    return true;
}
#endif
