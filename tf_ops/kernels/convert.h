// Tiny glue between engine types and TensorFlow types (kept out of the engine, which must not see TF).
#ifndef HETSYNC_KERNELS_CONVERT_H_
#define HETSYNC_KERNELS_CONVERT_H_

#include "engine/common.h"
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

namespace hetsync {

// The TF names every kernel uses.
using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;

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

// "[(2, 5), (3,), ()]": Python tuple notation, so the mismatch message reads like the user's shapes.
inline std::string ShapeSignature(tensorflow::OpKernelContext* ctx, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    const auto& shape = ctx->input(i).shape();
    s += i ? ", (" : "(";
    for (int d = 0; d < shape.dims(); ++d) s += (d ? ", " : "") + std::to_string(shape.dim_size(d));
    s += shape.dims() == 1 ? ",)" : ")";
  }
  return s + "]";
}

}  // namespace hetsync

#endif  // HETSYNC_KERNELS_CONVERT_H_
