// Tiny glue between engine types and TensorFlow types (kept out of the engine, which must not see TF).
#ifndef HETSYNC_KERNELS_CONVERT_H_
#define HETSYNC_KERNELS_CONVERT_H_

#include "engine/common.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

namespace hetsync {

inline tensorflow::Status ToTf(const Status& s) {
  if (s.ok) return tensorflow::OkStatus();
  return tensorflow::Status(static_cast<absl::StatusCode>(static_cast<int>(s.code)), s.message);
}

inline bool FromTf(tensorflow::DataType t, DataType* out) {
  switch (t) {
    case tensorflow::DT_FLOAT: *out = DataType::kFloat32; return true;
    case tensorflow::DT_DOUBLE: *out = DataType::kFloat64; return true;
    case tensorflow::DT_INT32: *out = DataType::kInt32; return true;
    case tensorflow::DT_INT64: *out = DataType::kInt64; return true;
    default: return false;
  }
}

}  // namespace hetsync

#endif  // HETSYNC_KERNELS_CONVERT_H_
