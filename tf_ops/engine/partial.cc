// PartialCollectives: the registry of persistent schedules and their notice mailbox (protocol in partial.h).
#include "engine/partial.h"

#include <cstring>

#include "engine/engine.h"
#include "engine/partial_schedule.h"

namespace hetsync {
namespace {

static_assert(std::is_trivially_copyable<PartialNotice>::value, "PartialNotice is sent as raw bytes");

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

PartialSpec SpecFromNotice(const PartialNotice& n) {
  PartialSpec spec;
  spec.name = std::string(n.name, strnlen(n.name, sizeof(n.name)));
  spec.mode = static_cast<PartialMode>(n.mode);
  spec.seed = n.seed;
  spec.dtype = static_cast<DataType>(n.dtype);
  spec.wire_half = n.wire_half != 0;
  spec.accumulate = n.accumulate != 0;
  spec.count = n.count;
  spec.shape_hash = n.shape_hash;
  spec.desc = std::string(n.desc, strnlen(n.desc, sizeof(n.desc)));
  spec.timeout = n.timeout;
  return spec;
}

const char* PartialModeName(PartialMode m) {
  return m == PartialMode::kMajority ? "majority" : m == PartialMode::kAll ? "all" : "solo";
}

int MajorityInitiator(uint64_t seed, const std::string& name, int64_t round, int size) {
  const uint64_t name_hash = Fnv1a64(name.data(), name.size());
  const uint64_t x = seed ^ name_hash ^ (static_cast<uint64_t>(round) * 0x9E3779B97F4A7C15ULL);
  return static_cast<int>(SplitMix64(x) % static_cast<uint64_t>(size));
}

PartialCollectives::PartialCollectives() = default;
PartialCollectives::~PartialCollectives() = default;
PartialCollectives::PartialCollectives(PartialCollectives&&) = default;
PartialCollectives& PartialCollectives::operator=(PartialCollectives&&) = default;

void PartialCollectives::Start(EngineContext& ctx) {
  schedules_.clear();
  away_peers_.clear();
  announced_away_ = false;
  inbox_ = std::make_shared<PartialNotice>();
  PostReceive(ctx);
}

void PartialCollectives::PostReceive(EngineContext& ctx) {
  MPI_Irecv(inbox_.get(), sizeof(PartialNotice), MPI_BYTE, MPI_ANY_SOURCE, kActivationTag, ctx.comm, &req_);
}

void PartialCollectives::Stop(EngineContext& ctx) {
  for (auto& kv : schedules_) kv.second->Abandon(ctx);
  if (req_ == MPI_REQUEST_NULL) return;
  MPI_Cancel(&req_);
  MPI_Wait(&req_, MPI_STATUS_IGNORE);
  req_ = MPI_REQUEST_NULL;
}

bool PartialCollectives::Poll(EngineContext& ctx) {
  bool any = false;
  for (int i = 0; i < 64 && req_ != MPI_REQUEST_NULL; ++i) {
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    PartialNotice n = *inbox_;
    PostReceive(ctx);
    Handle(ctx, n);
    any = true;
  }
  AnnounceAvailability(ctx);
  for (auto& kv : schedules_) {
    if (kv.second->Poll(ctx)) any = true;
  }
  ctx.counters->partial_pending = Pending();
  ctx.counters->partial_schedules = static_cast<int64_t>(schedules_.size());
  return any;
}

void PartialCollectives::AnnounceAvailability(EngineContext& ctx) {
  // kAll rounds wait for every rank that is not away; rank 0 coordinates them and must know who is away, also
  // before this rank's first call (one small notice per change of the away latch: a few per epoch).
  if (ctx.rank == kAllCoordinator || ctx.size < 2) return;
  const bool away = ctx.control.away();
  if (away == announced_away_) return;
  announced_away_ = away;
  auto msg = std::make_shared<PartialNotice>();
  std::memset(msg.get(), 0, sizeof(PartialNotice));
  msg->magic = kActivationMagic;
  msg->kind = away ? kNoticeAway : kNoticeBack;
  msg->sender = ctx.rank;
  std::vector<MPI_Request> reqs(1);
  MPI_Isend(msg.get(), sizeof(PartialNotice), MPI_BYTE, kAllCoordinator, kActivationTag, ctx.comm, &reqs[0]);
  ctx.AdoptSends(std::move(reqs), msg);
}

void PartialCollectives::Handle(EngineContext& ctx, const PartialNotice& n) {
  if (n.magic != kActivationMagic) {
    ctx.Fail("corrupt partial-collective notice from rank " + std::to_string(n.sender) + " (bad magic)");
    return;
  }
  if (n.kind == kNoticeAway || n.kind == kNoticeBack) {
    if (n.kind == kNoticeAway) {
      away_peers_.insert(n.sender);
    } else {
      away_peers_.erase(n.sender);
    }
    return;
  }
  auto it = schedules_.find(n.id);
  if (it == schedules_.end()) {
    // A rank that has not called this collective yet still takes part (with no data): it learns the tensors'
    // size from the notice.
    PartialSpec spec = SpecFromNotice(n);
    if (n.kind == kNoticeAbort) spec.desc.clear();
    it = schedules_.emplace(n.id, std::make_unique<PartialSchedule>(n.id, spec, false, ctx.default_timeout)).first;
  }
  switch (n.kind) {
    case kNoticeActivate: it->second->OnActivate(ctx, n); break;
    case kNoticeArrive: it->second->OnArrive(ctx, n); break;
    case kNoticeAbort: it->second->OnAbort(ctx, n); break;
    default: ctx.Fail("unknown partial-collective notice kind " + std::to_string(n.kind));
  }
}

PartialSchedule* PartialCollectives::Get(EngineContext& ctx, const PartialSpec& spec, std::string* error) {
  const uint64_t id = Fnv1a64(spec.name.data(), spec.name.size());
  auto it = schedules_.find(id);
  if (it == schedules_.end()) {
    it = schedules_.emplace(id, std::make_unique<PartialSchedule>(id, spec, true, ctx.default_timeout)).first;
    return it->second.get();
  }
  if (it->second->spec().name != spec.name) {
    *error = "partial allreduce names '" + spec.name + "' and '" + it->second->spec().name +
             "' collide (same 64-bit hash): rename one";
    return nullptr;
  }
  *error = it->second->SetLocal(ctx, spec);
  return error->empty() ? it->second.get() : nullptr;
}

PartialSchedule* PartialCollectives::Find(const std::string& name) {
  auto it = schedules_.find(Fnv1a64(name.data(), name.size()));
  return it == schedules_.end() || it->second->spec().name != name ? nullptr : it->second.get();
}

int64_t PartialCollectives::Pending() const {
  int64_t n = 0;
  for (auto& kv : schedules_) n += kv.second->Pending();
  return n;
}

}  // namespace hetsync

// For hetsync/ops.py (ctypes): the majority initiator sequence, so tests and users can reproduce it.
extern "C" int hetsync_majority_initiator(uint64_t seed, const char* name, int64_t round, int size) {
  return hetsync::MajorityInitiator(seed, name ? name : "", round, size);
}
