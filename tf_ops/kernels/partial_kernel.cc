// HetsyncPartialAllreduce: thin AsyncOpKernel over engine::PartialAllreduceOp (eager-SGD solo/majority allreduce).
// Fuses the N inputs into one proposal, lets the engine deposit it and wait for its round, then splits the round's
// result (divided by the engine) back into N outputs, with the ADS response (§5.1) as two more outputs:
// info = [included, nap, round, initiator, staleness, active, rounds] and the per-rank contributor flags.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/partial_op.h"
#include "kernels/convert.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hetsync {
namespace {

// Outputs 0..N-1 shaped like inputs 0..N-1 (attr N); `n` receives N.
tensorflow::Status OutputsLikeInputs(tensorflow::shape_inference::InferenceContext* c, int* n) {
  TF_RETURN_IF_ERROR(c->GetAttr("N", n));
  for (int i = 0; i < *n; ++i) c->set_output(i, c->input(i));
  return tensorflow::OkStatus();
}

REGISTER_OP("HetsyncPartialAllreduce")
    .Attr("T: {float, double}")
    .Attr("N: int >= 1")
    .Attr("collective: string")
    .Attr("mode: {'solo', 'majority', 'all'}")
    .Attr("seed: int = 0")
    .Attr("timeout_seconds: float = -1")
    .Attr("wire_half: bool = false")
    .Attr("late: {'latest', 'accumulate'} = 'latest'")
    .Input("tensors: N * T")
    .Output("averaged: N * T")
    .Output("info: int64")
    .Output("contributors: int32")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(OutputsLikeInputs(c, &n));
      c->set_output(n, c->Vector(7));
      c->set_output(n + 1, c->Vector(c->UnknownDim()));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
One call of the persistent partial allreduce `collective` (eager-SGD solo or majority allreduce).
averaged: late='latest': the round's sum of contributions divided by their number (NAP); late='accumulate':
  the sum, over every round since this rank's previous call, of the round's sum divided by the world size.
info: [included (this call's tensors are in it), nap, round, initiator, staleness (rounds; -1 if not included),
  active (ranks whose call waited for the round), rounds (in `averaged`)].
contributors: per rank, 0: no data in the round, 1: stale data sent passively, 2: the data of a waiting call.
)doc");

void Split(const char* src, const std::vector<Tensor*>& outs) {
  for (Tensor* out : outs) {
    const size_t bytes = out->TotalBytes();
    if (bytes) std::memcpy(out->data(), src, bytes);
    src += bytes;
  }
}

class PartialAllreduceKernel : public AsyncOpKernel {
 public:
  explicit PartialAllreduceKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    std::string mode;
    int64_t seed = 0;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("collective", &spec_.name));
    OP_REQUIRES_OK(c, c->GetAttr("mode", &mode));
    OP_REQUIRES_OK(c, c->GetAttr("seed", &seed));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &tf_dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("wire_half", &spec_.wire_half));
    std::string late;
    OP_REQUIRES_OK(c, c->GetAttr("late", &late));
    spec_.accumulate = late == "accumulate";
    OP_REQUIRES(c, !spec_.wire_half || tf_dtype_ == tensorflow::DT_FLOAT,
                tensorflow::errors::InvalidArgument("HetsyncPartialAllreduce: wire_half needs float32 tensors"));
    OP_REQUIRES(c, FromTf(tf_dtype_, &spec_.dtype),
                tensorflow::errors::InvalidArgument("HetsyncPartialAllreduce: unsupported dtype"));
    OP_REQUIRES(c, !spec_.name.empty() && spec_.name.size() < kPartialNameChars,
                tensorflow::errors::InvalidArgument("partial allreduce name must have 1 to ", kPartialNameChars - 1,
                                                    " characters, got '", spec_.name, "'"));
    spec_.mode = mode == "majority" ? PartialMode::kMajority : mode == "all" ? PartialMode::kAll : PartialMode::kSolo;
    spec_.seed = static_cast<uint64_t>(seed);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Engine& engine = Engine::Get();
    OP_REQUIRES_ASYNC(ctx, engine.running(),
                      tensorflow::errors::FailedPrecondition(
                          "the hetsync engine is not running: call hetsync.init() (after hvd.init()) first"),
                      done);
    PartialSpec spec = spec_;
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    const std::string sig = ShapeSignature(ctx, n_);
    spec.count = total;
    spec.shape_hash = Fnv1a64(sig.data(), sig.size());
    spec.desc = std::string(DataTypeName(spec.dtype)) + " x " + std::to_string(total) + " " + sig + " (" +
                PartialModeName(spec.mode) + ", seed " + std::to_string(spec.seed) +
                (spec.wire_half ? ", fp16 wire" : "") + (spec.accumulate ? ", accumulate)" : ")");
    if (spec.desc.size() >= static_cast<size_t>(kPartialDescChars)) {
      spec.desc = spec.desc.substr(0, kPartialDescChars - 4) + "...";
    }

    std::vector<Tensor*> outputs(n_, nullptr);
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outputs[i]), done);
    }
    Tensor* info = nullptr;
    Tensor* contributors = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(n_, TensorShape({7}), &info), done);
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(n_ + 1, TensorShape({engine.size()}), &contributors), done);
    auto buffers = std::make_shared<std::vector<Tensor>>(2);
    const size_t esize = DataTypeSize(spec.dtype);
    for (auto& t : *buffers) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(tf_dtype_, TensorShape({total}), &t), done);
    }
    char* in = static_cast<char*>((*buffers)[0].data());
    for (int i = 0; i < n_; ++i) {
      const Tensor& t = ctx->input(i);
      if (t.NumElements()) std::memcpy(in, t.data(), t.NumElements() * esize);
      in += t.NumElements() * esize;
    }
    auto result = std::make_shared<PartialResult>();
    const char* sum = static_cast<const char*>((*buffers)[1].data());
        auto on_done = [ctx, done, outputs, info, contributors, result, sum, buffers](const Status& s) {
      if (!s.ok) {
        ctx->SetStatus(ToTf(s));
        done();
        return;
      }
      Split(sum, outputs);
      auto iv = info->vec<int64_t>();
      iv(0) = result->included ? 1 : 0;
      iv(1) = result->nap;
      iv(2) = result->round;
      iv(3) = result->initiator;
      iv(4) = result->staleness;
      iv(5) = result->active;
      iv(6) = result->rounds;
      auto cv = contributors->vec<int32_t>();
      for (int64_t i = 0; i < cv.size(); ++i) {
        cv(i) = i < static_cast<int64_t>(result->contributors.size()) ? result->contributors[i] : 0;
      }
      done();
    };
    auto op = std::make_shared<PartialAllreduceOp>(spec, timeout_, (*buffers)[0].data(), (*buffers)[1].data(),
                                                   buffers, result, std::move(on_done));
    Status st = engine.Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, st.ok, ToTf(st), done);
  }

 private:
  int n_ = 0;
  float timeout_ = -1;
  tensorflow::DataType tf_dtype_;
  PartialSpec spec_;
};

REGISTER_KERNEL_BUILDER(Name("HetsyncPartialAllreduce").Device(tensorflow::DEVICE_CPU), PartialAllreduceKernel);

REGISTER_OP("HetsyncPartialDiscard")
    .Attr("collective: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext*) { return tensorflow::OkStatus(); })
    .Doc("Drops what this rank's partial allreduce `collective` holds but has not returned (engine/partial_op.h).");

class PartialDiscardKernel : public AsyncOpKernel {
 public:
  explicit PartialDiscardKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("collective", &name_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto op = std::make_shared<PartialDiscardOp>(name_, [ctx, done](const Status& s) {
      ctx->SetStatus(ToTf(s));
      done();
    });
    Status st = Engine::Get().Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, st.ok, ToTf(st), done);
  }

 private:
  std::string name_;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncPartialDiscard").Device(tensorflow::DEVICE_CPU), PartialDiscardKernel);

REGISTER_OP("HetsyncPartialDrain")
    .Attr("T: {float, double}")
    .Attr("N: int >= 1")
    .Attr("collective: string")
    .Input("like: N * T")
    .Output("drained: N * T")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int n = 0;
      return OutputsLikeInputs(c, &n);
    })
    .Doc("What this rank's partial allreduce `collective` holds but has not returned, shaped like `like`; then "
         "forgotten (engine/partial_op.h, PartialDrainOp).");

class PartialDrainKernel : public AsyncOpKernel {
 public:
  explicit PartialDrainKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("collective", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &tf_dtype_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    std::vector<Tensor*> outputs(n_, nullptr);
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outputs[i]), done);
    }
    auto buffer = std::make_shared<Tensor>();
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(tf_dtype_, TensorShape({total}), buffer.get()), done);
    const char* data = static_cast<const char*>(buffer->data());
    auto op = std::make_shared<PartialDrainOp>(
        name_, buffer->data(), buffer->TotalBytes(), buffer, [ctx, done, outputs, data, buffer](const Status& s) {
          if (s.ok) Split(data, outputs);
          ctx->SetStatus(ToTf(s));
          done();
        });
    Status st = Engine::Get().Enqueue(op);
    OP_REQUIRES_ASYNC(ctx, st.ok, ToTf(st), done);
  }

 private:
  int n_ = 0;
  std::string name_;
  tensorflow::DataType tf_dtype_;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncPartialDrain").Device(tensorflow::DEVICE_CPU), PartialDrainKernel);

}  // namespace
}  // namespace hetsync
