#include "engine/common.h"

#include <algorithm>
#include <cmath>
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
  }
  return "unknown-dtype";
}

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

bool DataTypeValid(int32_t t) { return t >= 1 && t <= 4; }

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

}  // namespace hetsync
