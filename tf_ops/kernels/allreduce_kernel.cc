// HetsyncAllreduceStart / HetsyncAllreduceWait: thin kernels over engine::AsyncAllreduceOp (allreduce_op.h).
// Start fuses its inputs into one buffer owned by the engine's result, enqueues the op and returns a handle at once;
// Wait (async) hands back the sums, split to the shapes of its `like` inputs, plus the engine's timestamps.
#include <cstring>
#include <memory>

#include "engine/allreduce_op.h"
#include "engine/engine.h"
#include "kernels/convert.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hetsync {
namespace {

REGISTER_OP("HetsyncAllreduceStart")
    .Attr("T: {float, double}")
    .Attr("N: int >= 1")
    .Attr("timeout_seconds: float = -1")
    .Input("tensors: N * T")
    .Output("handle: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Starts a sum of `tensors` over every rank on the engine's progress thread and returns a handle at once.
Every rank must start the same sequence of these (same element counts). timeout_seconds: -1 = engine default.
)doc");

REGISTER_OP("HetsyncAllreduceWait")
    .Attr("T: {float, double}")
    .Attr("N: int >= 1")
    .Input("handle: int64")
    .Input("like: N * T")
    .Output("sums: N * T")
    .Output("times: double")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < n; ++i) c->set_output(i, c->input(1 + i));
      c->set_output(n, c->Vector(4));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Waits for the allreduce started as `handle` (each handle once) and returns its sums shaped like `like`, and
times = [started, data phase began, done, wait called] in seconds of the steady (CLOCK_MONOTONIC) clock.
)doc");

class AllreduceStartKernel : public tensorflow::OpKernel {
 public:
  explicit AllreduceStartKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
    tensorflow::DataType t;
    OP_REQUIRES_OK(c, c->GetAttr("T", &t));
    OP_REQUIRES(c, FromTf(t, &dtype_), tensorflow::errors::InvalidArgument("unsupported dtype"));
  }

  void Compute(OpKernelContext* ctx) override {
    Engine& engine = Engine::Get();
    OP_REQUIRES(ctx, engine.running(),
                tensorflow::errors::FailedPrecondition(
                    "the hetsync engine is not running: call hetsync.init() (after hvd.init()) first"));
    auto result = std::make_shared<AsyncResult>();
    result->dtype = dtype_;
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    const size_t esize = DataTypeSize(dtype_);
    result->count = total;
    result->buffer.resize(total * esize);
    char* p = result->buffer.data();
    for (int i = 0; i < n_; ++i) {
      const auto data = ctx->input(i).tensor_data();
      std::memcpy(p, data.data(), data.size());
      p += data.size();
    }
    result->t_enqueued = SteadySeconds();
    const int64_t handle = AsyncResults::Get().Add(result);
    Status s = engine.Enqueue(std::make_shared<AsyncAllreduceOp>(result, timeout_));
    if (!s.ok) {
      AsyncResults::Get().Take(handle);
      OP_REQUIRES_OK(ctx, ToTf(s));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = handle;
  }

 private:
  int n_ = 0;
  float timeout_ = -1;
  DataType dtype_ = DataType::kFloat32;
};

class AllreduceWaitKernel : public AsyncOpKernel {
 public:
  explicit AllreduceWaitKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const double waited_at = SteadySeconds();
    const int64_t handle = ctx->input(0).scalar<int64_t>()();
    auto result = AsyncResults::Get().Take(handle);
    OP_REQUIRES_ASYNC(ctx, result != nullptr,
                      tensorflow::errors::InvalidArgument("non-blocking allreduce handle ", handle,
                                                          " is unknown or was already waited for"),
                      done);
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(1 + i).NumElements();
    OP_REQUIRES_ASYNC(ctx, total == result->count,
                      tensorflow::errors::InvalidArgument("non-blocking allreduce handle ", handle, " holds ",
                                                          result->count, " elements, but `like` has ", total),
                      done);
    const int n = n_;
    result->OnDone([ctx, done, result, n, waited_at](const Status& s) {
      if (!s.ok) {
        ctx->SetStatus(ToTf(s));
        done();
        return;
      }
      const char* p = result->buffer.data();
      for (int i = 0; i < n; ++i) {
        Tensor* out = nullptr;
        tensorflow::Status st = ctx->allocate_output(i, ctx->input(1 + i).shape(), &out);
        if (!st.ok()) {
          ctx->SetStatus(st);
          done();
          return;
        }
        auto dst = out->tensor_data();
        std::memcpy(const_cast<char*>(dst.data()), p, dst.size());
        p += dst.size();
      }
      Tensor* times = nullptr;
      tensorflow::Status st = ctx->allocate_output(n, TensorShape({4}), &times);
      if (st.ok()) {
        auto t = times->vec<double>();
        t(0) = result->t_enqueued;
        t(1) = result->t_data;
        t(2) = result->t_done;
        t(3) = waited_at;
      } else {
        ctx->SetStatus(st);
      }
      done();
    });
  }

 private:
  int n_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("HetsyncAllreduceStart").Device(tensorflow::DEVICE_CPU), AllreduceStartKernel);
REGISTER_KERNEL_BUILDER(Name("HetsyncAllreduceWait").Device(tensorflow::DEVICE_CPU).HostMemory("handle"),
                        AllreduceWaitKernel);

}  // namespace
}  // namespace hetsync
