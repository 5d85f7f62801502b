#include "engine/hop_op.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace hetsync {

const char* const kHopStatNames[kHopStats] = {
    "iteration", "queue_size", "max_queue", "dropped", "skips", "skipped_iters", "sends", "sends_skipped",
    "used",      "jump",       "session",   "absent",  "lag"};

namespace {

Clock::time_point Deadline(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string Waiting(const HopSet& set, const std::string& what, const std::vector<int>& peers, double timeout,
                    int rank) {
  return "Hop queue set '" + set.name + "' on rank " + std::to_string(rank) + ": " + what + " waited " +
         FormatSeconds(timeout) + " s for " + FormatRanks(peers) +
         " (neither arrived nor withdrew; a rank whose engine is gone never answers)";
}

}  // namespace

void HopConfigureOp::Start(EngineContext& ctx) {
  std::string err = ctx.hop.Configure(ctx, name_, cfg_, wire_half_);
  Finish(err.empty() ? Status::OK() : Status::Error(Code::kInvalidArgument, err));
}

HopSetOp::HopSetOp(std::string name, Callback cb)
    : Operation(std::move(cb)), name_(std::move(name)), id_(Fnv1a64(name_.data(), name_.size())) {}

HopSet* HopSetOp::Find(EngineContext& ctx) {
  if (ctx.failed()) {
    Finish(Status::Error(Code::kFailedPrecondition, "the hetsync engine is unusable after an earlier failure (" +
                                                        ctx.failure() + ")"));
    return nullptr;
  }
  HopSet* set = ctx.hop.Get(id_);
  if (!set || set->name != name_) {
    Finish(Status::Error(Code::kFailedPrecondition, "Hop queue set '" + name_ + "' is not configured on rank " +
                                                        std::to_string(ctx.rank) + " (ops.hop_configure first)"));
    return nullptr;
  }
  if (!set->failure.empty()) {
    Finish(Status::Error(Code::kInvalidArgument, set->failure));
    return nullptr;
  }
  return set;
}

void HopSendOp::Start(EngineContext& ctx) {
  HopSet* set = Find(ctx);
  if (!set) return;
  if (set->count >= 0 && set->count != count_) {
    Finish(Status::Error(Code::kInvalidArgument, "Hop queue set '" + name_ + "': this update has " +
                                                     std::to_string(count_) + " elements, earlier ones had " +
                                                     std::to_string(set->count)));
    return;
  }
  reinterpret_cast<HopWire*>(msg_->data())->count = count_;
  *sent_ = ctx.hop.SendUpdate(ctx, id_, msg_);
  ctx.MarkProgress();
  Finish(Status::OK());
}

void HopRecvOp::Start(EngineContext& ctx) {
  HopSet* set = Find(ctx);
  if (!set) return;
  if (timeout_ <= 0) timeout_ = ctx.default_timeout;
  start_ = Clock::now();
  deadline_ = Deadline(timeout_);
  k_ = set->state.iter() + offset_;
}

bool HopRecvOp::Progress(EngineContext& ctx) {
  if (finished()) return true;
  HopSet* set = Find(ctx);
  if (!set) return true;
  HopSelection sel;
  std::vector<int> missing;
  if (set->state.TryRecv(k_, &sel, &missing)) {
    for (const auto& e : sel.entries) {
      const HopWire& h = *reinterpret_cast<const HopWire*>(e.data->data());
      if (h.count != count_ || (h.wire_half != 0) != set->wire_half) {
        Finish(Status::Error(Code::kInvalidArgument,
                             "Hop queue set '" + name_ + "': rank " + std::to_string(e.sender) + " sends updates of " +
                                 std::to_string(h.count) + (h.wire_half ? " half" : " float32") + " elements, rank " +
                                 std::to_string(ctx.rank) + " has " + std::to_string(count_) +
                                 (set->wire_half ? " half" : " float32") +
                                 " elements: every rank must train the same model"));
        return true;
      }
    }
    Reduce(*set, sel);
    ctx.MarkProgress();
    Finish(Status::OK());
    return true;
  }
  if (Clock::now() < deadline_) return false;
  Finish(Status::Error(Code::kDeadlineExceeded,
                       Waiting(*set, "Recv(" + std::to_string(k_) + ")", missing, timeout_, ctx.rank) +
                           ": updates from these in-neighbours"));
  return true;
}

void HopRecvOp::Reduce(const HopSet& set, const HopSelection& sel) {
  double total = sel.self_weight;
  for (double w : sel.weights) total += w;
  const float self = static_cast<float>(sel.self_weight / total);
  for (int64_t e = 0; e < count_; ++e) out_[e] = own_[e] * self;
  std::vector<float> tmp;
  int64_t oldest = sel.k, newest = sel.k;
  for (size_t i = 0; i < sel.entries.size(); ++i) {
    const char* data = sel.entries[i].data->data() + sizeof(HopWire);
    const float* v = reinterpret_cast<const float*>(data);
    if (set.wire_half) {
      tmp.resize(count_);
      HalvesToFloats(reinterpret_cast<const uint16_t*>(data), tmp.data(), count_, 1.0f);
      v = tmp.data();
    }
    const float w = static_cast<float>(sel.weights[i] / total);
    for (int64_t e = 0; e < count_; ++e) out_[e] += w * v[e];
    oldest = std::min(oldest, sel.entries[i].iter);
    newest = std::max(newest, sel.entries[i].iter);
  }
  const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start_).count();
  *info_ = {sel.k, static_cast<int64_t>(sel.entries.size()), set.state.dropped(), oldest, newest, waited};
}

void HopAdvanceOp::Start(EngineContext& ctx) {
  if (!Find(ctx)) return;
  if (steps_ < 1) {
    Finish(Status::Error(Code::kInvalidArgument, "Hop advance needs steps >= 1, got " + std::to_string(steps_)));
    return;
  }
  if (timeout_ <= 0) timeout_ = ctx.default_timeout;
  deadline_ = Deadline(timeout_);
}

bool HopAdvanceOp::Progress(EngineContext& ctx) {
  if (finished()) return true;
  HopSet* set = Find(ctx);
  if (!set) return true;
  std::vector<int> missing;
  if (set->state.TryAdvance(steps_, &missing)) {
    ctx.hop.RecordEntry(*set);
    ctx.hop.SendTokens(ctx, *set, steps_);
    *iter_ = set->state.iter();
    ctx.MarkProgress();
    Finish(Status::OK());
    return true;
  }
  if (Clock::now() < deadline_) return false;
  Finish(Status::Error(Code::kDeadlineExceeded,
                       Waiting(*set, "entering iteration " + std::to_string(set->state.iter() + steps_), missing,
                               timeout_, ctx.rank) +
                           ": tokens from these out-neighbours (they are max_ig=" + std::to_string(set->cfg.max_ig) +
                           " iterations behind)"));
  return true;
}

void HopQueryOp::Start(EngineContext& ctx) {
  HopSet* set = Find(ctx);
  if (!set) return;
  const HopState& st = set->state;
  int64_t lag = std::numeric_limits<int64_t>::max();
  int64_t absent = 0;
  std::set<int> peers(set->cfg.in.begin(), set->cfg.in.end());
  peers.insert(set->cfg.out.begin(), set->cfg.out.end());
  out_->neighbours.clear();
  for (int p : peers) {
    const bool in = std::find(set->cfg.in.begin(), set->cfg.in.end(), p) != set->cfg.in.end();
    const bool out = std::find(set->cfg.out.begin(), set->cfg.out.end(), p) != set->cfg.out.end();
    if (out && !st.absent(p)) lag = std::min(lag, st.Tokens(p) - set->cfg.max_ig);
    absent += st.absent(p) ? 1 : 0;
    out_->neighbours.insert(out_->neighbours.end(), {p, in ? 1 : 0, out ? 1 : 0, out ? st.Tokens(p) : 0,
                                                     st.KnownIter(p), st.QueueSizeFrom(p), st.absent(p) ? 1 : 0});
  }
  if (lag == std::numeric_limits<int64_t>::max()) lag = 0;
  const int64_t* b = set->before;  // counters are totals over the sessions; the iteration is this session's
  out_->stats = {st.iter(), st.QueueSize(), set->max_queue, b[0] + st.dropped(), b[1] + st.skips(),
                 b[2] + st.skipped_iters(), set->sends, set->sends_skipped, b[3] + st.used(),
                 st.PlanJump(skip_, trigger_),
                 static_cast<int64_t>(ctx.session), absent, lag};
  out_->history = set->history;
  Finish(Status::OK());
}

}  // namespace hetsync
