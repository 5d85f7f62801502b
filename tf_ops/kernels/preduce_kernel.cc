// HetsyncPReduce: thin AsyncOpKernel over engine::PReduceOp. Fuses its N inputs into one buffer (Ripples §6.1:
// "all weights are flattened and concatenated into one tensor"), lets the engine sum it over the group on the
// progress thread, and splits the result back into N outputs of the input shapes, dividing by the effective group
// size in the same pass. With one input and no compression there is no fused buffer at all: the engine reduces in
// the output tensor, which is the input's own buffer whenever TF can forward it (no copy).
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

REGISTER_OP("HetsyncPReduce")
    .Attr("T: {float, double, int32, int64}")
    .Attr("N: int >= 1")
    .Attr("timeout_seconds: float = -1")
    .Attr("wire_half: bool = false")
    .Input("tensors: N * T")
    .Input("group: int32")
    .Input("instance: int64")
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
wire_half: float32 only: travel and sum as IEEE float16 (Horovod's Compression.fp16), halving the bytes.
instance: [stream, seq] naming the instance all members agree on; stream 0: implicit (n-th call for this group).
)doc");

template <typename T>
void DivideInPlace(T* p, int64_t n, int by) {
  // Integers: C++ division truncates toward zero (so -3 / 2 == -1, unlike numpy's floor division).
  if (by == 1) return;
  const T d = static_cast<T>(by);
  for (int64_t i = 0; i < n; ++i) p[i] /= d;
}

// Copies `n` summed elements from `src` (wire type W) to `dst` (type T), dividing by `by`.
template <typename T, typename W>
void CopyOutDivided(const W* src, T* dst, int64_t n, int by) {
  const T d = static_cast<T>(by);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]) / d;
}

void CopyOutHalf(const uint16_t* src, float* dst, int64_t n, int by) {
  HalvesToFloats(src, dst, n, static_cast<float>(by));
}

class PReduceKernel : public AsyncOpKernel {
 public:
  explicit PReduceKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
    OP_REQUIRES_OK(c, c->GetAttr("wire_half", &wire_half_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &tf_dtype_));
    OP_REQUIRES(c, FromTf(tf_dtype_, &dtype_),
                tensorflow::errors::InvalidArgument("HetsyncPReduce: unsupported dtype"));
    OP_REQUIRES(c, !wire_half_ || dtype_ == DataType::kFloat32,
                tensorflow::errors::InvalidArgument("HetsyncPReduce: wire_half needs float32 tensors"));
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
    const Tensor& inst = ctx->input(n_ + 1);
    OP_REQUIRES_ASYNC(ctx, inst.NumElements() == 2,
                      tensorflow::errors::InvalidArgument("P-Reduce instance must be [stream, seq]"), done);
    const uint64_t stream = static_cast<uint64_t>(inst.flat<int64_t>()(0));
    const int64_t seq = inst.flat<int64_t>()(1);

    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    const size_t esize = DataTypeSize(dtype_);
    const DataType wire = wire_half_ ? DataType::kFloat16 : dtype_;

    // The buffer the engine reduces in place: the output itself for one uncompressed input (forwarded from the
    // input when TF allows: no copy at all), else a fused temp (Ripples §6.1 flatten + concat, converted to half
    // for fp16 compression) that is split back, divided and converted in one pass. Both come from TF's allocator.
    // The engine op keeps a Tensor reference as `keepalive`: should a collective ever be abandoned after a
    // timeout, MPI may still write into that memory after this kernel has finished.
    std::vector<Tensor*> outputs(n_, nullptr);
    Tensor fused;
    const bool in_place = n_ == 1 && !wire_half_;
    if (in_place) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({0}, 0, ctx->input(0).shape(), &outputs[0]),
                           done);
      fused = *outputs[0];
      const Tensor& in = ctx->input(0);
      if (total && outputs[0]->data() != in.data()) std::memcpy(fused.data(), in.data(), total * esize);
    } else {
      for (int i = 0; i < n_; ++i) {
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outputs[i]), done);
      }
      auto fused_type = wire_half_ ? tensorflow::DT_HALF : tf_dtype_;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(fused_type, tensorflow::TensorShape({total}), &fused), done);
      char* dst = static_cast<char*>(fused.data());
      for (int i = 0; i < n_; ++i) {
        const Tensor& in = ctx->input(i);
        const int64_t n = in.NumElements();
        if (wire_half_) {
          const float* src = in.flat<float>().data();
          auto* h = reinterpret_cast<uint16_t*>(dst);
          FloatsToHalves(src, h, n);
          dst += n * 2;
        } else {
          if (n) std::memcpy(dst, in.data(), n * esize);
          dst += n * esize;
        }
      }
    }
    char* data = static_cast<char*>(fused.data());
    auto effective = std::make_shared<int>(1);
    const DataType dtype = dtype_;
    // Runs on the progress thread.
    std::vector<Tensor> inputs;  // fp16 path: alone in the group, hand back the exact input, not its half rounding
    if (wire_half_) {
      for (int i = 0; i < n_; ++i) inputs.push_back(ctx->input(i));
    }
    auto on_done = [ctx, done, outputs, data, in_place, wire, dtype, effective, inputs](const Status& s) {
      if (!s.ok) {
        ctx->SetStatus(ToTf(s));
        done();
        return;
      }
      const int by = *effective;
      if (by == 1 && !inputs.empty()) {
        for (size_t i = 0; i < outputs.size(); ++i) {
          const size_t bytes = inputs[i].TotalBytes();
          if (bytes) std::memcpy(outputs[i]->data(), inputs[i].data(), bytes);
        }
        done();
        return;
      }
      if (in_place) {
        Tensor* out = outputs[0];
        const int64_t n = out->NumElements();
        switch (dtype) {
          case DataType::kFloat32: DivideInPlace(out->flat<float>().data(), n, by); break;
          case DataType::kFloat64: DivideInPlace(out->flat<double>().data(), n, by); break;
          case DataType::kInt32: DivideInPlace(out->flat<int32_t>().data(), n, by); break;
          case DataType::kInt64: DivideInPlace(out->flat<int64_t>().data(), n, by); break;
          default: break;
        }
      } else {
        const char* src = data;
        for (Tensor* out : outputs) {
          const int64_t n = out->NumElements();
          if (wire == DataType::kFloat16) {
            CopyOutHalf(reinterpret_cast<const uint16_t*>(src), out->flat<float>().data(), n, by);
            src += n * 2;
            continue;
          }
          switch (dtype) {
            case DataType::kFloat32:
              CopyOutDivided(reinterpret_cast<const float*>(src), out->flat<float>().data(), n, by);
              break;
            case DataType::kFloat64:
              CopyOutDivided(reinterpret_cast<const double*>(src), out->flat<double>().data(), n, by);
              break;
            case DataType::kInt32:
              CopyOutDivided(reinterpret_cast<const int32_t*>(src), out->flat<int32_t>().data(), n, by);
              break;
            case DataType::kInt64:
              CopyOutDivided(reinterpret_cast<const int64_t*>(src), out->flat<int64_t>().data(), n, by);
              break;
            default: break;
          }
          src += n * DataTypeSize(dtype);
        }
      }
      done();
    };
    auto op = std::make_shared<PReduceOp>(group, wire, total, ShapeSignature(ctx, n_), timeout_, data,
                                          std::make_shared<Tensor>(fused), std::move(on_done), stream, seq,
                                          effective);
    Status s = engine.Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, s.ok, ToTf(s), done);
  }

 private:
  int n_ = 0;
  float timeout_ = -1;
  bool wire_half_ = false;
  tensorflow::DataType tf_dtype_;
  DataType dtype_ = DataType::kFloat32;
};

REGISTER_KERNEL_BUILDER(Name("HetsyncPReduce").Device(tensorflow::DEVICE_CPU), PReduceKernel);

}  // namespace
}  // namespace hetsync
