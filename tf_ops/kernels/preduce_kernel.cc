// HetsyncPReduce: thin AsyncOpKernel over engine::PReduceOp. Fuses its N inputs into one buffer (Ripples §6.1:
// "all weights are flattened and concatenated into one tensor"), lets the engine average it over the group on the
// progress thread, and splits the result back into N outputs of the input shapes.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/preduce.h"
#include "kernels/convert.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hetsync {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

REGISTER_OP("HetsyncPReduce")
    .Attr("T: {float, double, int32, int64}")
    .Attr("N: int >= 1")
    .Attr("timeout_seconds: float = -1")
    .Input("tensors: N * T")
    .Input("group: int32")
    .Output("averaged: N * T")
    .SetIsStateful()  // communicates: never constant-fold, dedupe or prune it; tf.function keeps program order
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < n; ++i) c->set_output(i, c->input(i));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Averages `tensors` element-wise over the ranks in `group` (a partial all-reduce, Ripples P-Reduce).
Every rank in `group` must call it with the same group, dtype and shapes. Integer averages truncate toward zero.
timeout_seconds: per-op deadline; -1 uses the engine default.
)doc");

// "[(2, 5), (3,), ()]": Python tuple notation, so the mismatch message reads like the user's shapes.
std::string ShapeSignature(OpKernelContext* ctx, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    const auto& shape = ctx->input(i).shape();
    s += i ? ", (" : "(";
    for (int d = 0; d < shape.dims(); ++d) s += (d ? ", " : "") + std::to_string(shape.dim_size(d));
    s += shape.dims() == 1 ? ",)" : ")";
  }
  return s + "]";
}

class PReduceKernel : public AsyncOpKernel {
 public:
  explicit PReduceKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &tf_dtype_));
    OP_REQUIRES(c, FromTf(tf_dtype_, &dtype_),
                tensorflow::errors::InvalidArgument("HetsyncPReduce: unsupported dtype"));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Engine& engine = Engine::Get();
    OP_REQUIRES_ASYNC(ctx, engine.running(),
                      tensorflow::errors::FailedPrecondition(
                          "the hetsync engine is not running: call hetsync.init() (after hvd.init()) first"),
                      done);
    const Tensor& group_t = ctx->input(n_);
    OP_REQUIRES_ASYNC(ctx, group_t.dims() == 1,
                      tensorflow::errors::InvalidArgument("P-Reduce group must be a vector of ranks, got shape ",
                                                          group_t.shape().DebugString()),
                      done);
    auto flat_group = group_t.vec<int32_t>();
    std::vector<int> group(flat_group.data(), flat_group.data() + flat_group.size());
    std::string bad = ValidateGroup(group, engine.rank(), engine.size());
    OP_REQUIRES_ASYNC(ctx, bad.empty(), tensorflow::errors::InvalidArgument(bad), done);

    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    const size_t esize = DataTypeSize(dtype_);

    // The buffer the engine reduces in place. One input: the output tensor itself (one copy, or none when TF can
    // forward the input buffer). Several: a fused temp (Ripples §6.1 flatten + concat), split back afterwards.
    // Both come from TF's allocator (cached memory: a fresh 10 MB malloc + page faults cost more than the copy).
    // The engine op keeps a Tensor reference as `keepalive`: should a collective ever be abandoned after a
    // timeout, MPI may still write into that memory after this kernel has finished.
    std::vector<Tensor*> outputs(n_, nullptr);
    Tensor fused;
    if (n_ == 1) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({0}, 0, ctx->input(0).shape(), &outputs[0]),
                           done);
      fused = *outputs[0];
      const Tensor& in = ctx->input(0);
      if (total && outputs[0]->data() != in.data()) std::memcpy(fused.data(), in.data(), total * esize);
    } else {
      for (int i = 0; i < n_; ++i) {
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outputs[i]), done);
      }
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(tf_dtype_, tensorflow::TensorShape({total}), &fused), done);
      char* dst = static_cast<char*>(fused.data());
      for (int i = 0; i < n_; ++i) {
        const Tensor& in = ctx->input(i);
        size_t bytes = static_cast<size_t>(in.NumElements()) * esize;
        if (bytes) std::memcpy(dst, in.data(), bytes);
        dst += bytes;
      }
    }
    char* data = static_cast<char*>(fused.data());
    const bool split = n_ > 1;
    // Runs on the progress thread.
    auto on_done = [ctx, done, outputs, esize, data, split](const Status& s) {
      if (!s.ok) {
        ctx->SetStatus(ToTf(s));
      } else if (split) {
        const char* src = data;
        for (Tensor* out : outputs) {
          size_t bytes = static_cast<size_t>(out->NumElements()) * esize;
          if (bytes) std::memcpy(out->data(), src, bytes);
          src += bytes;
        }
      }
      done();
    };
    auto op = std::make_shared<PReduceOp>(group, dtype_, total, ShapeSignature(ctx, n_), timeout_, data,
                                          std::make_shared<Tensor>(fused), std::move(on_done));
    Status s = engine.Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, s.ok, ToTf(s), done);
  }

 private:
  int n_ = 0;
  float timeout_ = -1;
  tensorflow::DataType tf_dtype_;
  DataType dtype_ = DataType::kFloat32;
};

REGISTER_KERNEL_BUILDER(Name("HetsyncPReduce").Device(tensorflow::DEVICE_CPU), PReduceKernel);

}  // namespace
}  // namespace hetsync
