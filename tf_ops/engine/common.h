// Framework-agnostic basics shared by the engine and the TF kernels: Status, dtypes, group validation.
// No TensorFlow headers here on purpose: the engine must stay usable from any framework (and from tests).
#ifndef HETSYNC_ENGINE_COMMON_H_
#define HETSYNC_ENGINE_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hetsync {

// Numeric values match TensorFlow's/absl's canonical codes so the kernels can convert without a table.
enum class Code : int {
  kOk = 0,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kFailedPrecondition = 9,
  kAborted = 10,
  kInternal = 13,
  kUnavailable = 14,
};

struct Status {
  bool ok = true;
  Code code = Code::kOk;
  std::string message;

  static Status OK() { return Status(); }
  static Status Error(Code c, std::string m) {
    Status s;
    s.ok = false;
    s.code = c;
    s.message = std::move(m);
    return s;
  }
};

// The wire/element types P-Reduce supports. kFloat16 is IEEE half: float32 tensors travel as it when the user asks
// for fp16 compression (the kernel converts on copy-in/copy-out); bfloat16 tensors are widened in Python.
enum class DataType : int32_t { kFloat32 = 1, kFloat64 = 2, kInt32 = 3, kInt64 = 4, kFloat16 = 5 };

// IEEE half <-> float, round to nearest even (no TF/Eigen here: the engine is framework-free).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
// Array versions (F16C/AVX when the CPU has them, else the scalar ones): the fp16 wire path converts whole buffers.
void FloatsToHalves(const float* src, uint16_t* dst, int64_t n);
void HalvesToFloats(const uint16_t* src, float* dst, int64_t n, float divide_by);
void AddHalves(const uint16_t* in, uint16_t* inout, int64_t n);  // inout += in, rounded to half

const char* DataTypeName(DataType t);  // "float32", ... ; "dtype(<n>)" for unknown values
size_t DataTypeSize(DataType t);       // 0 for unknown values
bool DataTypeValid(int32_t t);

// "[0, 1, 3]" -- the format every user-facing message uses (same as Python's list repr).
std::string FormatRanks(const std::vector<int>& ranks);

// Seconds as the messages print them: "2.0", "0.25", "120.0".
std::string FormatSeconds(double s);

// Returns "" when `group` is a valid P-Reduce group for `rank` in a world of `size`, else a message that names the
// problem. The Python wrapper produces the same messages (hetsync/ops.py) so users see one wording.
std::string ValidateGroup(const std::vector<int>& group, int rank, int size);

// 64-bit FNV-1a; used for the shape-signature and group hashes in the P-Reduce header.
uint64_t Fnv1a64(const void* data, size_t n, uint64_t seed = 1469598103934665603ULL);

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_COMMON_H_
