// vector_exp.hpp: e^x on the lanes of an AVX2 or AVX-512 vector, for the
// softmax rows of src/kernels/ (included only there, with internal
// linkage, inline only to keep an unused overload quiet: each level's copy
// is compiled for that level).
//
// x = n ln 2 + r with n = round(x / ln 2) and |r| <= ln 2 / 2, ln 2 split in
// two (its first 12 bits exact, so n ln2_hi is exact for |n| < 2^12); e^r by
// its Taylor series to r^7, whose first left-out term is below 5.3e-9 e^r,
// a tenth of float32's rounding; 2^n put into the exponent bits. Within 2
// ulp of e^x for x in [-87.3, 88.7]; 0 below (e^-87.3 is float32's
// smallest normal), infinity above, NaN for NaN.
#pragma once

#include <immintrin.h>

namespace xfmr::detail {
namespace {

constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = 0.693359375f;  // 12 significant bits
constexpr float kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpLowest = -87.33654f;  // ln of float32's smallest normal
constexpr float kExpHighest = 88.72283f;  // ln of float32's largest
// 1/k! for k = 7 down to 2: Horner's order.
constexpr float kExpTaylor[6] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f};

#ifdef __AVX512F__
inline __m512 vector_exp(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLowest), _CMP_LT_OQ);
  const __mmask16 over = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpHighest), _CMP_GT_OQ);
  // NaN passes through min and max as their second operand.
  x = _mm512_max_ps(_mm512_set1_ps(kExpLowest), _mm512_min_ps(_mm512_set1_ps(kExpHighest), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // 2^n in two factors, 2^(n/2) twice, so that n = 128 (x near its
  // largest) stays within the exponent's range.
  const __m512i ni = _mm512_cvtps_epi32(n), half = _mm512_srai_epi32(ni, 1);
  const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 b = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
  p = _mm512_mul_ps(_mm512_mul_ps(p, a), b);
  p = _mm512_mask_mov_ps(p, under, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(p, over, _mm512_set1_ps(__builtin_inff()));
}
#endif

#ifdef __AVX2__
inline __m256 vector_exp(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLowest), _CMP_LT_OQ);
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(kExpHighest), _CMP_GT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(kExpLowest), _mm256_min_ps(_mm256_set1_ps(kExpHighest), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
  const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  p = _mm256_mul_ps(_mm256_mul_ps(p, a), b);
  p = _mm256_andnot_ps(under, p);
  return _mm256_blendv_ps(p, _mm256_set1_ps(__builtin_inff()), over);
}
#endif

}  // namespace
}  // namespace xfmr::detail
