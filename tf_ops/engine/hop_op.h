// Operations on Hop queue sets (hop.h), one per step of the parallel computation graph (Hop §3.2, Fig 7):
//   HopSendOp     Send: enqueue this worker's parameters to its out-neighbours (returns at once; the progress
//                 thread completes the sends while the worker computes);
//   HopRecvOp     Recv + Reduce: wait until the receive rule for iteration iter()+offset is satisfied, then average
//                 this worker's parameters with the selected updates (eq. 1, or eq. 2 with staleness);
//   HopAdvanceOp  enter a new iteration: take `steps` tokens from every out-neighbour, grant `steps` tokens to
//                 every in-neighbour (steps > 1: a jump, §5);
//   HopConfigureOp / HopQueryOp  create a set; read its gauges.
// None is serial: they must never queue behind a P-Reduce. Every blocking one has a deadline whose error names the
// neighbours it waited for.
#ifndef HETSYNC_ENGINE_HOP_OP_H_
#define HETSYNC_ENGINE_HOP_OP_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/hop.h"

namespace hetsync {

class HopConfigureOp : public Operation {
 public:
  HopConfigureOp(std::string name, HopConfig cfg, bool wire_half, Callback cb)
      : Operation(std::move(cb)), name_(std::move(name)), cfg_(std::move(cfg)), wire_half_(wire_half) {}
  const char* Name() const override { return "HopConfigure"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }

 private:
  std::string name_;
  HopConfig cfg_;
  bool wire_half_;
};

// Base of the ops that act on an existing set: looks it up and fails with a clear message otherwise.
class HopSetOp : public Operation {
 public:
  HopSetOp(std::string name, Callback cb);

 protected:
  HopSet* Find(EngineContext& ctx);  // nullptr after Finish(error)
  std::string name_;
  uint64_t id_;
};

class HopSendOp : public HopSetOp {
 public:
  // `msg` is [HopWire | count elements]; the op fills the head. *sent receives the number of neighbours sent to.
  HopSendOp(std::string name, std::shared_ptr<std::vector<char>> msg, int64_t count, std::shared_ptr<int64_t> sent,
            Callback cb)
      : HopSetOp(std::move(name), std::move(cb)), msg_(std::move(msg)), count_(count), sent_(std::move(sent)) {}
  const char* Name() const override { return "HopSend"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }

 private:
  std::shared_ptr<std::vector<char>> msg_;
  int64_t count_;
  std::shared_ptr<int64_t> sent_;
};

// info: [k, updates reduced, dropped (total), oldest iteration reduced, newest, microseconds waited]
class HopRecvOp : public HopSetOp {
 public:
  HopRecvOp(std::string name, const float* own, float* out, int64_t count, int64_t offset, double timeout,
            std::shared_ptr<void> keepalive, std::shared_ptr<std::vector<int64_t>> info, Callback cb)
      : HopSetOp(std::move(name), std::move(cb)), own_(own), out_(out), count_(count), offset_(offset),
        timeout_(timeout), keepalive_(std::move(keepalive)), info_(std::move(info)) {}
  const char* Name() const override { return "HopRecv"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  void Reduce(const HopSet& set, const HopSelection& sel);
  const float* own_;
  float* out_;
  int64_t count_, offset_;
  double timeout_;
  std::shared_ptr<void> keepalive_;
  std::shared_ptr<std::vector<int64_t>> info_;
  int64_t k_ = 0;
  Clock::time_point start_, deadline_;
};

class HopAdvanceOp : public HopSetOp {
 public:
  HopAdvanceOp(std::string name, int64_t steps, double timeout, std::shared_ptr<int64_t> iter, Callback cb)
      : HopSetOp(std::move(name), std::move(cb)), steps_(steps), timeout_(timeout), iter_(std::move(iter)) {}
  const char* Name() const override { return "HopAdvance"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  int64_t steps_;
  double timeout_;
  std::shared_ptr<int64_t> iter_;
  Clock::time_point deadline_;
};

// stats: kHopStatNames order; neighbours: rows of [peer, in, out, tokens, known iteration, queued from it, absent];
// history: (iteration, steady-clock ns) per entry into an iteration this session.
constexpr int kHopStats = 13;
extern const char* const kHopStatNames[kHopStats];
struct HopReport {
  std::vector<int64_t> stats, neighbours, history;
};

class HopQueryOp : public HopSetOp {
 public:
  HopQueryOp(std::string name, int skip, int trigger, std::shared_ptr<HopReport> out, Callback cb)
      : HopSetOp(std::move(name), std::move(cb)), skip_(skip), trigger_(trigger), out_(std::move(out)) {}
  const char* Name() const override { return "HopQuery"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }

 private:
  int skip_, trigger_;
  std::shared_ptr<HopReport> out_;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_HOP_OP_H_
