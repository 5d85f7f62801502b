#include "engine/control.h"

#include <chrono>
#include <cstring>
#include <type_traits>

#include "engine/engine.h"

namespace hetsync {
namespace {

static_assert(std::is_trivially_copyable<WireHeader>::value, "WireHeader is sent as raw bytes");

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

void AvailabilityFlag::Set(Availability a) {
  if (pinned.load() && a != Availability::kAway) return;
  since_ns = NowNs();
  state = static_cast<int>(a);
}

void AvailabilityFlag::Pin(bool away) {
  pinned = away;
  if (away) {
    since_ns = NowNs();
    state = static_cast<int>(Availability::kAway);
  }
}

AvailabilityFlag& GlobalAvailability() {
  static AvailabilityFlag* flag = new AvailabilityFlag();
  return *flag;
}

void ControlPlane::Start(EngineContext& ctx) {
  box_.clear();
  decided_out_.clear();
  last_resolved_.clear();
  future_.clear();
  has_active_ = false;
  out_ = false;
  inbox_ = std::make_shared<WireHeader>();
  Post(ctx);
}

void ControlPlane::Post(EngineContext& ctx) {
  MPI_Irecv(inbox_.get(), sizeof(WireHeader), MPI_BYTE, MPI_ANY_SOURCE, kHeaderTag, ctx.comm, &req_);
}

void ControlPlane::Stop(EngineContext& ctx) {
  if (req_ == MPI_REQUEST_NULL) return;
  MPI_Cancel(&req_);
  MPI_Wait(&req_, MPI_STATUS_IGNORE);
  req_ = MPI_REQUEST_NULL;
}

bool ControlPlane::OutNow(const EngineContext& ctx) {
  if (ctx.withdrawn) return true;
  auto& flag = GlobalAvailability();
  auto state = static_cast<Availability>(flag.state.load());
  if (state == Availability::kAway) return true;
  if (state != Availability::kBetween) return false;
  double out_for = (NowNs() - flag.since_ns.load()) * 1e-9;
  return out_for > flag.away_after.load();
}

bool ControlPlane::Poll(EngineContext& ctx) {
  bool any = false;
  for (int i = 0; i < 64 && req_ != MPI_REQUEST_NULL; ++i) {
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    WireHeader h = *inbox_;
    Post(ctx);
    Deliver(ctx, h);
    any = true;
  }
  bool out = OutNow(ctx);
  if (out && !out_) {
    // Just went away: every instance a peer is waiting for and this rank has not started is decided OUT now.
    ++ctx.counters->away_events;
    std::vector<InstanceKey> pending;
    for (auto& kv : box_) {
      if (!(has_active_ && kv.first == active_)) pending.push_back(kv.first);
    }
    for (auto& key : pending) DecideOut(ctx, key);
    any = true;
  }
  out_ = out;
  ctx.counters->away = out ? 1 : 0;
  return any;
}

void ControlPlane::SendExclude(EngineContext& ctx, const InstanceKey& key, int to) {
  auto msg = std::make_shared<WireHeader>();
  std::memset(msg.get(), 0, sizeof(WireHeader));
  msg->magic = kHeaderMagic;
  msg->kind = kKindExclude;
  msg->session = ctx.session;
  msg->sender = ctx.rank;
  msg->stream = key.stream;
  msg->seq = key.seq;
  std::vector<MPI_Request> reqs(1);
  MPI_Isend(msg.get(), sizeof(WireHeader), MPI_BYTE, to, kHeaderTag, ctx.comm, &reqs[0]);
  ctx.AdoptSends(std::move(reqs), msg);
}

void ControlPlane::DecideOut(EngineContext& ctx, const InstanceKey& key) {
  if (decided_out_.insert(key).second) ++ctx.counters->self_excluded;
  auto it = box_.find(key);
  if (it == box_.end()) return;
  for (auto& kv : it->second) {
    if (kv.second.kind == kKindPReduce) SendExclude(ctx, key, kv.first);
  }
  box_.erase(it);
}

void ControlPlane::Deliver(EngineContext& ctx, const WireHeader& h) {
  if (h.magic != kHeaderMagic) {
    ctx.Fail("corrupt control message from rank " + std::to_string(h.sender) + " (bad magic)");
    return;
  }
  if (h.kind == kKindFailing) {  // any session: the sender is ending, Horovod will finalize MPI on every rank
    int stopped = 1;             // the answer it waits for; small, so sent eagerly: the call returns at once
    MPI_Send(&stopped, 1, MPI_INT, h.sender, kFailingAckTag, ctx.comm);
    ctx.failing_peer = h.sender;  // the progress loop makes no MPI call after this poll (Engine::Loop)
    return;
  }
  if (h.session < ctx.session) return;  // left over from an older session
  if (h.session > ctx.session) {        // a peer rejoined before us: keep it for our NewSession
    future_.push_back(h);
    return;
  }
  if (h.kind == kKindDone) {
    if (ctx.done.insert(h.sender).second) ++ctx.counters->withdrawals_seen;
    return;
  }
  InstanceKey key{h.stream, h.seq};
  bool active = has_active_ && key == active_;
  if (h.kind == kKindExclude) {
    if (active || !IsLate(key)) box_[key][h.sender] = h;
    return;
  }
  // A header. Late (this rank resolved the stream past it without joining it), or an instance this rank is OUT
  // of: answer EXCLUDE. Otherwise keep it until this rank's own op for the instance comes (it is computing).
  if (!active && (IsLate(key) || decided_out_.count(key) || out_)) {
    if (!IsLate(key) && decided_out_.insert(key).second) ++ctx.counters->self_excluded;
    SendExclude(ctx, key, h.sender);
    return;
  }
  box_[key][h.sender] = h;
}

void ControlPlane::Join(EngineContext& ctx, const InstanceKey& key) {
  active_ = key;
  has_active_ = true;
  // Seqs of a stream increase on every rank, so a rank that starts seq q skipped every older one it did not join
  // (e.g. the static schedule's iterations drift apart with uneven epochs): answer their headers as late.
  if (key.seq > INT64_MIN) Resolve(ctx, InstanceKey{key.stream, key.seq - 1});  // leaves active_ alone
}

bool ControlPlane::TakeDecidedOut(const InstanceKey& key) { return decided_out_.erase(key) > 0; }

bool ControlPlane::IsLate(const InstanceKey& key) const {
  auto it = last_resolved_.find(key.stream);
  return it != last_resolved_.end() && key.seq <= it->second;
}

int ControlPlane::Take(const InstanceKey& key, int sender, WireHeader* out) {
  auto it = box_.find(key);
  if (it == box_.end()) return 0;
  auto m = it->second.find(sender);
  if (m == it->second.end()) return 0;
  int kind = m->second.kind == kKindExclude ? 2 : 1;
  if (kind == 1) *out = m->second;
  it->second.erase(m);
  if (it->second.empty()) box_.erase(it);
  return kind;
}

void ControlPlane::Resolve(EngineContext& ctx, const InstanceKey& key) {
  if (has_active_ && key == active_) has_active_ = false;
  int64_t& last = last_resolved_.emplace(key.stream, key.seq).first->second;
  if (key.seq > last) last = key.seq;
  // Instances of this stream up to `last` that this rank never joined are over for it: answer their waiting
  // headers with EXCLUDE and forget them (their later headers are answered as late).
  auto lo = box_.lower_bound(InstanceKey{key.stream, INT64_MIN});
  while (lo != box_.end() && lo->first.stream == key.stream && lo->first.seq <= last) {
    for (auto& kv : lo->second) {
      if (kv.second.kind == kKindPReduce) SendExclude(ctx, lo->first, kv.first);
    }
    lo = box_.erase(lo);
  }
  auto d = decided_out_.lower_bound(InstanceKey{key.stream, INT64_MIN});
  while (d != decided_out_.end() && d->stream == key.stream && d->seq <= last) d = decided_out_.erase(d);
}

void ControlPlane::Exclude(EngineContext& ctx, uint64_t stream, const std::vector<int64_t>& seqs) {
  for (int64_t seq : seqs) {
    InstanceKey key{stream, seq};
    if ((has_active_ && key == active_) || IsLate(key)) continue;
    DecideOut(ctx, key);
  }
}

void ControlPlane::NewSession(EngineContext& ctx) {
  box_.clear();
  decided_out_.clear();
  last_resolved_.clear();
  has_active_ = false;
  out_ = OutNow(ctx);  // the latch still holds the old session's (withdrawn) state
  std::vector<WireHeader> later;
  later.swap(future_);
  for (auto& h : later) {
    if (h.session >= ctx.session) Deliver(ctx, h);  // re-buffers messages of sessions still ahead
  }
}

}  // namespace hetsync
