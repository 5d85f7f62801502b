#include "engine/partial_op.h"

#include <cstring>

#include "engine/partial_schedule.h"

namespace hetsync {

bool PartialAllreduceOp::Error(Code code, const std::string& why) {
  if (sched_) sched_->call_in_flight = false;
  Finish(Status::Error(code, why));
  return true;
}

void PartialAllreduceOp::Start(EngineContext& ctx) {
  if (ctx.failed()) {
    Error(Code::kFailedPrecondition, "the hetsync engine is unusable after an earlier failure (" + ctx.failure() +
                                         "): call engine_shutdown() and engine_start() on every rank to recover");
    return;
  }
  if (spec_.dtype != DataType::kFloat32 && spec_.dtype != DataType::kFloat64) {
    Error(Code::kInvalidArgument, "partial allreduce '" + spec_.name + "' supports float32 and float64, got " +
                                      DataTypeName(spec_.dtype));
    return;
  }
  std::string err;
  PartialSchedule* s = ctx.partial.Get(ctx, spec_, &err);
  if (!s) {
    Error(Code::kInvalidArgument, err);
    return;
  }
  if (!s->failure().empty()) {
    Error(s->failure_code(), s->failure());
    return;
  }
  if (s->call_in_flight) {
    Error(Code::kFailedPrecondition, "partial allreduce '" + spec_.name +
                                         "' is already waiting for a round on this rank: call it again only after "
                                         "the previous call returned (or use another name)");
    return;
  }
  sched_ = s;
  if (timeout_ <= 0) timeout_ = ctx.default_timeout;
  s->set_timeout(timeout_);  // and the activations this rank sends carry it
  s->Deposit(in_);
  s->call_in_flight = true;
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  if (s->result_round() > s->consumed_round() && s->ResultMatchesLocal()) {
    Deliver(ctx, false);  // a round ran while this rank computed (Fig 7): late
    return;
  }
  s->MarkConsumed();
  if (s->executing()) {  // its data phase took the old buffer: wait for it, this deposit goes to the next round
    late_ = true;
    wait_round_ = s->current_round();
    return;
  }
  wait_round_ = s->next_round();
  s->CallActivate(ctx);
}

bool PartialAllreduceOp::Deliver(EngineContext& ctx, bool included) {
  *result_ = sched_->TakeResult(ctx, out_, included);
  if (included) {
    ++ctx.counters->partial_included;
  } else {
    ++ctx.counters->partial_missed;
  }
  sched_->call_in_flight = false;
  ctx.MarkProgress();
  Finish(Status::OK());
  return true;
}

bool PartialAllreduceOp::Progress(EngineContext& ctx) {
  if (finished()) return true;
  if (!sched_->failure().empty()) return Error(sched_->failure_code(), sched_->failure());
  if (sched_->result_round() >= wait_round_) {
    if (!late_ || sched_->ResultMatchesLocal()) return Deliver(ctx, !late_);
    // That round ran with another rank's spec (this rank had not called yet): run the next one with ours.
    late_ = false;
    wait_round_ = sched_->next_round();
    sched_->MarkConsumed();
    sched_->CallActivate(ctx);
    return false;
  }
  // A running exchange has its own deadlines (it names the silent rank); this one covers a round never activated.
  if (sched_->executing() || Clock::now() < deadline_) return false;
  std::string why = "partial allreduce '" + spec_.name + "': round " + std::to_string(wait_round_) +
                    " did not run within " + FormatSeconds(timeout_) + " s";
  int culprit = -1;
  if (spec_.mode == PartialMode::kAll) {
    why += ": some rank neither called it nor was away (rank " + std::to_string(kAllCoordinator) +
           "'s engine starts a round once every rank has called or is away; a rank whose engine is gone never does)";
  } else if (spec_.mode == PartialMode::kMajority) {
    culprit = sched_->Designated(ctx, wait_round_);
    why += ": its designated initiator, rank " + std::to_string(culprit) +
           ", is inside its train step but never called it (or died)";
  }
  sched_->FailAll(ctx, Code::kDeadlineExceeded, why, culprit, false);
  ctx.Fail(why);
  return Error(Code::kDeadlineExceeded, why);
}

void PartialDiscardOp::Start(EngineContext& ctx) {
  PartialSchedule* s = ctx.partial.Find(name_);
  if (s && s->call_in_flight) {
    Finish(Status::Error(Code::kFailedPrecondition, "partial allreduce '" + name_ + "' has a call in flight"));
    return;
  }
  if (s) s->Discard();
  Finish(Status::OK());
}

void PartialDrainOp::Start(EngineContext& ctx) {
  deadline_ = Clock::now() +
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ctx.default_timeout));
}

bool PartialDrainOp::Progress(EngineContext& ctx) {
  PartialSchedule* s = ctx.partial.Find(name_);
  if (!s) {
    std::memset(out_, 0, bytes_);
    Finish(Status::OK());
    return true;
  }
  if (s->call_in_flight) {
    Finish(Status::Error(Code::kFailedPrecondition, "partial allreduce '" + name_ + "' has a call in flight"));
    return true;
  }
  if (s->executing()) {  // a round this rank takes part in passively: its result belongs in the drain
    if (Clock::now() < deadline_) return false;
    Finish(Status::Error(Code::kDeadlineExceeded, "partial allreduce '" + name_ + "': round " +
                                                      std::to_string(s->current_round()) +
                                                      " still running when draining it"));
    return true;
  }
  s->Drain(out_, bytes_);
  Finish(Status::OK());
  return true;
}

}  // namespace hetsync
