// PartialAllreduceOp: one call of a partial allreduce (eager-SGD §5.1 ADS object: the response is the round's
// update and whether this call's proposal is in it). The schedules themselves run without calls (partial.h).
#ifndef HETSYNC_ENGINE_PARTIAL_OP_H_
#define HETSYNC_ENGINE_PARTIAL_OP_H_

#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/partial.h"

namespace hetsync {

class PartialSchedule;

class PartialAllreduceOp : public Operation {
 public:
  // `in` holds spec.count elements (this call's proposal) and is read in Start; `out` receives the result (already
  // divided: see PartialSpec::accumulate). `keepalive` owns both. timeout_seconds <= 0: engine default.
  PartialAllreduceOp(PartialSpec spec, double timeout_seconds, const void* in, void* out,
                     std::shared_ptr<void> keepalive, std::shared_ptr<PartialResult> result, Callback cb)
      : Operation(std::move(cb)),
        spec_(std::move(spec)),
        timeout_(timeout_seconds),
        in_(in),
        out_(out),
        keepalive_(std::move(keepalive)),
        result_(std::move(result)) {}

  const char* Name() const override { return "PartialAllreduce"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  bool Deliver(EngineContext& ctx, bool included);
  bool Error(Code code, const std::string& why);

  PartialSpec spec_;
  double timeout_;
  const void* in_;
  void* out_;
  std::shared_ptr<void> keepalive_;
  std::shared_ptr<PartialResult> result_;
  PartialSchedule* sched_ = nullptr;
  int64_t wait_round_ = -1;
  bool late_ = false;
  Clock::time_point deadline_;
};

// Forgets what this rank's schedule `name` holds but has not returned: the accumulated results of rounds since its
// last call and its undelivered deposit (e.g. ESync after a consensus average, which already contains them).
class PartialDiscardOp : public Operation {
 public:
  PartialDiscardOp(std::string name, Callback cb) : Operation(std::move(cb)), name_(std::move(name)) {}
  const char* Name() const override { return "PartialDiscard"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }

 private:
  std::string name_;
};

// A live switch leaves eager-SGD (hetsync/switching.py): once the schedule `name` runs no round on this rank, what
// it holds but has not returned -- round results since its last call and its undelivered deposit -- is copied to
// `out` and forgotten, for the caller to apply locally (so no gradient is lost at a switch, none applied twice).
class PartialDrainOp : public Operation {
 public:
  PartialDrainOp(std::string name, void* out, size_t bytes, std::shared_ptr<void> keepalive, Callback cb)
      : Operation(std::move(cb)), name_(std::move(name)), out_(out), bytes_(bytes), keepalive_(std::move(keepalive)) {}
  const char* Name() const override { return "PartialDrain"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  std::string name_;
  void* out_;
  size_t bytes_;
  std::shared_ptr<void> keepalive_;
  Clock::time_point deadline_;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_PARTIAL_OP_H_
