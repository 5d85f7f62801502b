// Hop queue ops: thin AsyncOpKernels over the engine's Hop operations (engine/hop_op.h). Each fuses its float32
// inputs into one buffer (one message per update, as P-Reduce does) and splits results back.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/hop_op.h"
#include "kernels/convert.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hetsync {
namespace {

#define HOP_REQUIRE_ENGINE(ctx, done)                                                                        \
  OP_REQUIRES_ASYNC(ctx, Engine::Get().running(),                                                           \
                    tensorflow::errors::FailedPrecondition(                                                 \
                        "the hetsync engine is not running: call hetsync.init() (after hvd.init()) first"), \
                    done)

void Enqueue(OpKernelContext* ctx, std::shared_ptr<Operation> op, AsyncOpKernel::DoneCallback done) {
  Status st = Engine::Get().Enqueue(std::move(op));
  OP_REQUIRES_ASYNC(ctx, st.ok, ToTf(st), done);
}

REGISTER_OP("HetsyncHopConfigure")
    .Attr("queue: string")
    .Attr("in_neighbours: list(int) >= 0")
    .Attr("out_neighbours: list(int) >= 0")
    .Attr("max_ig: int")
    .Attr("backup: int = 0")
    .Attr("staleness: int = -1")
    .Attr("reuse_stale: bool = true")
    .Attr("wire_half: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext*) { return tensorflow::OkStatus(); })
    .Doc("Creates this worker's Hop queue set `name` (Hop §4.1, §4.2): its neighbours, max_ig, backup, staleness.");

class HopConfigureKernel : public AsyncOpKernel {
 public:
  explicit HopConfigureKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    std::vector<int64_t> in, out;
    int64_t max_ig = 0, backup = 0, staleness = -1;
    OP_REQUIRES_OK(c, c->GetAttr("queue", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("in_neighbours", &in));
    OP_REQUIRES_OK(c, c->GetAttr("out_neighbours", &out));
    OP_REQUIRES_OK(c, c->GetAttr("max_ig", &max_ig));
    OP_REQUIRES_OK(c, c->GetAttr("backup", &backup));
    OP_REQUIRES_OK(c, c->GetAttr("staleness", &staleness));
    OP_REQUIRES_OK(c, c->GetAttr("reuse_stale", &cfg_.reuse_stale));
    OP_REQUIRES_OK(c, c->GetAttr("wire_half", &wire_half_));
    cfg_.in.assign(in.begin(), in.end());
    cfg_.out.assign(out.begin(), out.end());
    cfg_.max_ig = static_cast<int>(max_ig);
    cfg_.backup = static_cast<int>(backup);
    cfg_.staleness = static_cast<int>(staleness);
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    HOP_REQUIRE_ENGINE(ctx, done);
    HopConfig cfg = cfg_;
    cfg.rank = Engine::Get().rank();
    auto cb = [ctx, done](const Status& s) {
      ctx->SetStatus(ToTf(s));
      done();
    };
    Enqueue(ctx, std::make_shared<HopConfigureOp>(name_, cfg, wire_half_, cb), done);
  }

 private:
  std::string name_;
  HopConfig cfg_;
  bool wire_half_ = false;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncHopConfigure").Device(tensorflow::DEVICE_CPU), HopConfigureKernel);

REGISTER_OP("HetsyncHopSend")
    .Attr("queue: string")
    .Attr("N: int >= 1")
    .Attr("wire_half: bool = false")
    .Input("tensors: N * float")
    .Output("sent: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return tensorflow::OkStatus();
    })
    .Doc("Send (Hop Fig 7 line 11): enqueue the tensors, fused, to the out-neighbours not past this iteration; "
         "once per iteration. sent: neighbours sent to.");

class HopSendKernel : public AsyncOpKernel {
 public:
  explicit HopSendKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("queue", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("wire_half", &wire_half_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    HOP_REQUIRE_ENGINE(ctx, done);
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    const size_t esize = wire_half_ ? 2 : 4;
    auto msg = std::make_shared<std::vector<char>>(sizeof(HopWire) + total * esize);
    std::memset(msg->data(), 0, sizeof(HopWire));
    char* dst = msg->data() + sizeof(HopWire);
    for (int i = 0; i < n_; ++i) {
      const Tensor& t = ctx->input(i);
      const int64_t m = t.NumElements();
      if (!m) continue;
      if (wire_half_) {
        FloatsToHalves(t.flat<float>().data(), reinterpret_cast<uint16_t*>(dst), m);
      } else {
        std::memcpy(dst, t.flat<float>().data(), m * esize);
      }
      dst += m * esize;
    }
    Tensor* sent_t = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &sent_t), done);
    auto sent = std::make_shared<int64_t>(0);
    auto cb = [ctx, done, sent, sent_t](const Status& s) {
      if (s.ok) sent_t->scalar<int64_t>()() = *sent;
      ctx->SetStatus(ToTf(s));
      done();
    };
    Enqueue(ctx, std::make_shared<HopSendOp>(name_, msg, total, sent, cb), done);
  }

 private:
  std::string name_;
  int n_ = 0;
  bool wire_half_ = false;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncHopSend").Device(tensorflow::DEVICE_CPU), HopSendKernel);

REGISTER_OP("HetsyncHopRecv")
    .Attr("queue: string")
    .Attr("N: int >= 1")
    .Attr("timeout_seconds: float = -1")
    .Input("tensors: N * float")
    .Input("offset: int64")
    .Output("averaged: N * float")
    .Output("info: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < n; ++i) c->set_output(i, c->input(i));
      c->set_output(n, c->Vector(6));
      return tensorflow::OkStatus();
    })
    .Doc("Recv + Reduce (Hop Fig 7 lines 13-14) for iteration current+offset: the tensors averaged with the updates "
         "the receive rule selects. info: [k, updates, dropped, oldest iteration, newest, microseconds waited].");

class HopRecvKernel : public AsyncOpKernel {
 public:
  explicit HopRecvKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("queue", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    HOP_REQUIRE_ENGINE(ctx, done);
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    auto buffers = std::make_shared<std::vector<Tensor>>(2);
    for (auto& t : *buffers) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({total}), &t), done);
    }
    float* own = (*buffers)[0].flat<float>().data();
    for (int i = 0; i < n_; ++i) {
      const Tensor& t = ctx->input(i);
      if (t.NumElements()) std::memcpy(own, t.flat<float>().data(), t.NumElements() * sizeof(float));
      own += t.NumElements();
    }
    std::vector<Tensor*> outputs(n_, nullptr);
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outputs[i]), done);
    }
    Tensor* info_t = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(n_, TensorShape({6}), &info_t), done);
    const int64_t offset = ctx->input(n_).scalar<int64_t>()();
    auto info = std::make_shared<std::vector<int64_t>>(6, 0);
    const float* avg = (*buffers)[1].flat<float>().data();
    auto cb = [ctx, done, outputs, info_t, info, avg, buffers](const Status& s) {
      if (s.ok) {
        const char* src = reinterpret_cast<const char*>(avg);
        for (Tensor* out : outputs) {
          if (out->TotalBytes()) std::memcpy(out->data(), src, out->TotalBytes());
          src += out->TotalBytes();
        }
        for (int i = 0; i < 6; ++i) info_t->vec<int64_t>()(i) = (*info)[i];
      }
      ctx->SetStatus(ToTf(s));
      done();
    };
    Enqueue(ctx,
            std::make_shared<HopRecvOp>(name_, (*buffers)[0].flat<float>().data(), (*buffers)[1].flat<float>().data(),
                                        total, offset, timeout_, buffers, info, cb),
            done);
  }

 private:
  std::string name_;
  int n_ = 0;
  float timeout_ = -1;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncHopRecv").Device(tensorflow::DEVICE_CPU), HopRecvKernel);

REGISTER_OP("HetsyncHopAdvance")
    .Attr("queue: string")
    .Attr("timeout_seconds: float = -1")
    .Input("steps: int64")
    .Output("iteration: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return tensorflow::OkStatus();
    })
    .Doc("Enter iteration current+steps (Hop Fig 7 lines 8-10, 16-18; steps > 1 is a jump, §5): take `steps` "
         "tokens from every out-neighbour, grant `steps` to every in-neighbour. Returns the new iteration.");

class HopAdvanceKernel : public AsyncOpKernel {
 public:
  explicit HopAdvanceKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("queue", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("timeout_seconds", &timeout_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    HOP_REQUIRE_ENGINE(ctx, done);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    auto iter = std::make_shared<int64_t>(0);
    auto cb = [ctx, done, out, iter](const Status& s) {
      if (s.ok) out->scalar<int64_t>()() = *iter;
      ctx->SetStatus(ToTf(s));
      done();
    };
    Enqueue(ctx, std::make_shared<HopAdvanceOp>(name_, ctx->input(0).scalar<int64_t>()(), timeout_, iter, cb), done);
  }

 private:
  std::string name_;
  float timeout_ = -1;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncHopAdvance").Device(tensorflow::DEVICE_CPU), HopAdvanceKernel);

REGISTER_OP("HetsyncHopQuery")
    .Attr("queue: string")
    .Attr("skip: int = 0")
    .Attr("trigger: int = 0")
    .Output("stats: int64")
    .Output("neighbours: int64")
    .Output("history: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(kHopStats));
      c->set_output(1, c->Matrix(c->UnknownDim(), 7));
      c->set_output(2, c->Matrix(c->UnknownDim(), 2));
      return tensorflow::OkStatus();
    })
    .Doc("Gauges of Hop queue set `name` (engine/hop_op.h, kHopStatNames); stats[9] is the jump §5 would make now "
         "with `skip` and `trigger`.");

class HopQueryKernel : public AsyncOpKernel {
 public:
  explicit HopQueryKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    int64_t skip = 0, trigger = 0;
    OP_REQUIRES_OK(c, c->GetAttr("queue", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("skip", &skip));
    OP_REQUIRES_OK(c, c->GetAttr("trigger", &trigger));
    skip_ = static_cast<int>(skip);
    trigger_ = static_cast<int>(trigger);
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    HOP_REQUIRE_ENGINE(ctx, done);
    auto report = std::make_shared<HopReport>();
    auto cb = [ctx, done, report](const Status& s) {
      if (!s.ok) {
        ctx->SetStatus(ToTf(s));
        done();
        return;
      }
      const std::vector<int64_t>* parts[3] = {&report->stats, &report->neighbours, &report->history};
      const int64_t widths[3] = {0, 7, 2};
      for (int i = 0; i < 3; ++i) {
        const int64_t n = static_cast<int64_t>(parts[i]->size());
        TensorShape shape = widths[i] ? TensorShape({n / widths[i], widths[i]}) : TensorShape({n});
        Tensor* out = nullptr;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, shape, &out), done);
        if (n) std::memcpy(out->data(), parts[i]->data(), n * sizeof(int64_t));
      }
      done();
    };
    Enqueue(ctx, std::make_shared<HopQueryOp>(name_, skip_, trigger_, report, cb), done);
  }

 private:
  std::string name_;
  int skip_ = 0, trigger_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("HetsyncHopQuery").Device(tensorflow::DEVICE_CPU), HopQueryKernel);

}  // namespace
}  // namespace hetsync
