#include "engine/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <cstdio>
#include <set>
#include <sstream>

namespace hetsync {

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
  }
  return "unknown-dtype";
}

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kFloat16: return 2;
  }
  return 0;
}

bool DataTypeValid(int32_t t) { return t >= 1 && t <= 5; }

std::string FormatRanks(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string FormatSeconds(double s) {
  char buf[64];
  // One decimal when that is exact (2.0, 120.0), otherwise the shortest faithful form (0.25).
  if (std::fabs(s * 10 - std::round(s * 10)) < 1e-9) {
    std::snprintf(buf, sizeof(buf), "%.1f", s);
  } else {
    std::snprintf(buf, sizeof(buf), "%g", s);
  }
  return buf;
}

std::string ValidateGroup(const std::vector<int>& group, int rank, int size) {
  if (group.empty()) return "P-Reduce group is empty";
  std::set<int> seen, dups;
  std::vector<int> bad;
  for (int r : group) {
    if (!seen.insert(r).second) dups.insert(r);
    if (r < 0 || r >= size) bad.push_back(r);
  }
  if (!dups.empty()) {
    return "P-Reduce group " + FormatRanks(group) + " has duplicate ranks " +
           FormatRanks(std::vector<int>(dups.begin(), dups.end()));
  }
  if (!bad.empty()) {
    std::sort(bad.begin(), bad.end());
    return "P-Reduce group " + FormatRanks(group) + " has out-of-range ranks " + FormatRanks(bad) +
           " for world size " + std::to_string(size);
  }
  if (!seen.count(rank)) {
    return "P-Reduce group " + FormatRanks(group) + " lacks the calling rank " + std::to_string(rank);
  }
  return "";
}

uint64_t Fnv1a64(const void* data, size_t n, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal half: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t mant = (absx & 0x7fffff) | 0x800000;
    int shift = 113 - static_cast<int>(absx >> 23);  // 126 - 14 + 1
    uint32_t half_mant = mant >> (shift + 13);
    uint32_t rest = mant & ((1u << (shift + 13)) - 1);
    uint32_t halfway = 1u << (shift + 12);
    if (rest > halfway || (rest == halfway && (half_mant & 1))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t h = ((absx - 0x38000000u) >> 13);
  uint32_t rest = absx & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

namespace {

bool HasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c"))) void FloatsToHalvesF16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

__attribute__((target("avx,f16c"))) void HalvesToFloatsF16c(const uint16_t* src, float* dst, int64_t n, float by) {
  const __m256 d = _mm256_set1_ps(by);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_div_ps(f, d));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(src[i]) / by;
}

__attribute__((target("avx,f16c"))) void AddHalvesF16c(const uint16_t* in, uint16_t* inout, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    __m128i h = _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i), h);
  }
  for (; i < n; ++i) inout[i] = FloatToHalf(HalfToFloat(in[i]) + HalfToFloat(inout[i]));
}

}  // namespace

void FloatsToHalves(const float* src, uint16_t* dst, int64_t n) {
  if (HasF16c()) return FloatsToHalvesF16c(src, dst, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

void HalvesToFloats(const uint16_t* src, float* dst, int64_t n, float divide_by) {
  if (HasF16c()) return HalvesToFloatsF16c(src, dst, n, divide_by);
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]) / divide_by;
}

void AddHalves(const uint16_t* in, uint16_t* inout, int64_t n) {
  if (HasF16c()) return AddHalvesF16c(in, inout, n);
  for (int64_t i = 0; i < n; ++i) inout[i] = FloatToHalf(HalfToFloat(in[i]) + HalfToFloat(inout[i]));
}

}  // namespace hetsync
