// The TensorFlow headers the kernels include, precompiled once per build (tf_ops/Makefile: parsing them is ~9 s of
// each kernel's ~10 s compile here).  Every kernel still includes what it uses itself; this only lists them.
#ifndef HETSYNC_KERNELS_TF_HEADERS_H_
#define HETSYNC_KERNELS_TF_HEADERS_H_

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

#endif  // HETSYNC_KERNELS_TF_HEADERS_H_
