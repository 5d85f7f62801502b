// Small TF ops that control the engine. All are stateful: they have side effects (or process-dependent results)
// and must never be constant-folded, deduplicated or reordered by grappler.
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/mpi_settings.h"
#include "engine/preduce.h"
#include "kernels/convert.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hetsync {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace shape_inference = tensorflow::shape_inference;

REGISTER_OP("HetsyncEngineStart")
    .Attr("timeout_seconds: float = 120")
    .Attr("cache_size: int = -1")
    .Output("ok: bool")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Starts the engine (collective over MPI_COMM_WORLD). cache_size -1: env HETSYNC_COMM_CACHE_SIZE or 64.");

REGISTER_OP("HetsyncEngineShutdown")
    .Attr("drain: bool = true")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Stops the engine. drain=true is collective (drains stray control messages); false only stops locally.");

REGISTER_OP("HetsyncWithdraw").SetIsStateful().SetShapeFn(shape_inference::NoOutputs);
REGISTER_OP("HetsyncRejoin").SetIsStateful().SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("HetsyncExclude")
    .Input("stream: int64")
    .Input("seqs: int64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("This rank is OUT of instances (stream, seq) for every seq in `seqs` (see control.h).");

REGISTER_OP("HetsyncEngineStats")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(static_cast<int64_t>(sizeof(EngineStats::values) / sizeof(int64_t))));
      return tensorflow::OkStatus();
    });

REGISTER_OP("HetsyncEngineInfo")
    .Output("rank: int32")
    .Output("size: int32")
    .Output("thread_level: int32")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Scalar());
      return tensorflow::OkStatus();
    });

REGISTER_OP("HetsyncMpiSettings")
    .Output("lines: string")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      return tensorflow::OkStatus();
    })
    .Doc("The MPI settings the last engine start applied, one line each (engine/mpi_settings.h).");

class EngineStartKernel : public OpKernel {
 public:
  explicit EngineStartKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
    OP_REQUIRES_OK(c, c->GetAttr("cache_size", &cache_size_));
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(Engine::Get().Start(timeout_, cache_size_)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = true;
  }

 private:
  float timeout_;
  int cache_size_;
};

class EngineShutdownKernel : public OpKernel {
 public:
  explicit EngineShutdownKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("drain", &drain_));
  }
  void Compute(OpKernelContext* ctx) override { OP_REQUIRES_OK(ctx, ToTf(Engine::Get().Shutdown(drain_))); }

 private:
  bool drain_;
};

// Withdraw and Rejoin go through the engine queue so they are ordered after this rank's earlier P-Reduces.
template <typename Op>
class SerialControlKernel : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto op = std::make_shared<Op>([ctx, done](const Status& s) {
      if (!s.ok) ctx->SetStatus(ToTf(s));
      done();
    });
    Status s = Engine::Get().Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, s.ok, ToTf(s), done);
  }
};

class ExcludeKernel : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const uint64_t stream = static_cast<uint64_t>(ctx->input(0).scalar<int64_t>()());
    auto flat = ctx->input(1).flat<int64_t>();
    std::vector<int64_t> seqs(flat.data(), flat.data() + flat.size());
    auto op = std::make_shared<ExcludeOp>(stream, std::move(seqs), [ctx, done](const Status& s) {
      if (!s.ok) ctx->SetStatus(ToTf(s));
      done();
    });
    Status s = Engine::Get().Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, s.ok, ToTf(s), done);
  }
};

class EngineStatsKernel : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    EngineStats s = Engine::Get().Stats();
    const int64_t n = sizeof(s.values) / sizeof(int64_t);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
    for (int64_t i = 0; i < n; ++i) out->vec<int64_t>()(i) = s.values[i];
  }
};

class EngineInfoKernel : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int v[3] = {-1, -1, -1};
    OP_REQUIRES_OK(ctx, ToTf(Engine::Info(&v[0], &v[1], &v[2])));
    for (int i = 0; i < 3; ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<int32_t>()() = v[i];
    }
  }
};

class MpiSettingsKernel : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const std::vector<std::string> lines = AppliedMpiSettings();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(lines.size())}), &out));
    for (size_t i = 0; i < lines.size(); ++i) out->vec<tensorflow::tstring>()(i) = lines[i];
  }
};

using tensorflow::DEVICE_CPU;
REGISTER_KERNEL_BUILDER(Name("HetsyncEngineStart").Device(DEVICE_CPU), EngineStartKernel);
REGISTER_KERNEL_BUILDER(Name("HetsyncEngineShutdown").Device(DEVICE_CPU), EngineShutdownKernel);
REGISTER_KERNEL_BUILDER(Name("HetsyncWithdraw").Device(DEVICE_CPU), SerialControlKernel<WithdrawOp>);
REGISTER_KERNEL_BUILDER(Name("HetsyncRejoin").Device(DEVICE_CPU), SerialControlKernel<RejoinOp>);
REGISTER_KERNEL_BUILDER(Name("HetsyncExclude").Device(DEVICE_CPU), ExcludeKernel);
REGISTER_KERNEL_BUILDER(Name("HetsyncEngineStats").Device(DEVICE_CPU), EngineStatsKernel);
REGISTER_KERNEL_BUILDER(Name("HetsyncEngineInfo").Device(DEVICE_CPU), EngineInfoKernel);
REGISTER_KERNEL_BUILDER(Name("HetsyncMpiSettings").Device(DEVICE_CPU), MpiSettingsKernel);

}  // namespace
}  // namespace hetsync
