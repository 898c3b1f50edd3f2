/* The fast decode step's fused kernels (rllm/backends/tinker/local/native_kernels.py builds this
   file with the system's C compiler on first use and loads it with ctypes).

   A decode step at 32 rows spends as long in small torch operations (norms, rotary, softmax,
   SiLU, residual adds, each a dispatch over a tiny tensor) and in attention's batched products of
   3 x 64 matrices as in its matrix products. These kernels do a layer's glue in three calls:
   add_norm (residual add + RMSNorm), silu_mul (SiLU(gate) * up) and attend (q/k norm, rotary,
   the new key and value into the cache buffers, attention over the visible columns).

   Each rounds where transformers' forward rounds in the model's dtype (bfloat16: every product,
   sum and cast torch would store; float32: nothing), so the step's tokens follow transformers'
   to float rounding. The bodies are in decode_kernels.inc, included once per dtype. */

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef uint16_t bf16_t;
typedef union {
    float f;
    uint32_t u;
} bits32;

/* Unions, not memcpy: GCC vectorises loops over these conversions only so. */
static inline float bf16_ld(bf16_t x) {
    bits32 b;
    b.u = (uint32_t)x << 16;
    return b.f;
}

static inline bf16_t bf16_st(float f) {
    bits32 b;
    b.f = f;
    uint32_t rounded = (b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16; /* to nearest, ties to even (torch's) */
    uint32_t nan = (b.u >> 16) | 0x40u;                            /* a NaN stays a NaN */
    return (bf16_t)((b.u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline float f32_id(float x) { return x; }

/* exp(x) for float, without a libm call (which would keep the loops around it scalar):
   x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes' degree-6 polynomial (about 1 ulp), 2^n
   written into the exponent bits. Selects and a magic-number rounding, not fminf/fmaxf/floorf:
   GCC does not vectorise those here. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to an integer (1.5 * 2^23) */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * r * r + r + 1.0f;
    bits32 scale;
    scale.u = (uint32_t)((int32_t)n + 127) << 23;
    return e * scale.f;
}

int rllm_decode_kernels_version(void) { return 2; }

#define T bf16_t
#define LD bf16_ld
#define ST bf16_st
#define NAME(x) x##_bf16
#define KERNELS_BF16
#include "decode_kernels.inc"
#undef KERNELS_BF16
#undef T
#undef LD
#undef ST
#undef NAME

#define T float
#define LD f32_id
#define ST f32_id
#define NAME(x) x##_f32
#include "decode_kernels.inc"
