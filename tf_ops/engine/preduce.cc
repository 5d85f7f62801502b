#include "engine/preduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "engine/mpi_backend.h"

namespace hetsync {
namespace {

std::string Unusable(const EngineContext& ctx) {
  return "the hetsync engine is unusable after an earlier failure (" + ctx.failure() +
         "); unmatched protocol messages may still be in flight and could pair with a later P-Reduce, so every "
         "operation now fails: call engine_shutdown() and engine_start() on every rank to recover";
}

std::string Withdrawn(const EngineContext& ctx) {
  return "rank " + std::to_string(ctx.rank) + " has withdrawn from P-Reduce session " +
         std::to_string(ctx.session) + "; every rank must call rejoin() before it can P-Reduce again";
}

void FillCommon(WireHeader* h, uint32_t kind, const EngineContext& ctx) {
  std::memset(h, 0, sizeof(*h));
  h->magic = kHeaderMagic;
  h->kind = kind;
  h->session = ctx.session;
  h->sender = ctx.rank;
}

std::vector<int> ListedGroup(const WireHeader& h) {
  return std::vector<int>(h.group, h.group + std::max(0, std::min(h.group_listed, kMaxListedRanks)));
}

std::string GroupText(const WireHeader& h) {
  std::string s = FormatRanks(ListedGroup(h));
  if (h.group_size > h.group_listed) s.insert(s.size() - 1, ", ... (" + std::to_string(h.group_size) + " ranks)");
  return s;
}

bool SameGroup(const WireHeader& a, const WireHeader& b) {
  return a.group_hash == b.group_hash && a.group_size == b.group_size;
}

// "float32 x 10 [(2, 5)]", prefixed with the requested group when `with_group`.
std::string Describe(const WireHeader& h, bool with_group) {
  std::string s = with_group ? "group " + GroupText(h) + " " : "";
  std::string sig(h.signature, strnlen(h.signature, kSignatureChars));
  return s + DataTypeName(static_cast<DataType>(h.dtype)) + " x " + std::to_string(h.count) + " " + sig;
}

// Keeps an abandoned collective's buffer and request alive for as long as the process lives.
struct InFlight {
  std::shared_ptr<void> buffer;
  std::unique_ptr<PendingCollective> pending;
};

}  // namespace

PReduceOp::PReduceOp(std::vector<int> group, DataType dtype, int64_t count, std::string shape_signature,
                     double timeout_seconds, void* data, std::shared_ptr<void> keepalive, Callback cb,
                     uint64_t stream, int64_t seq, std::shared_ptr<int> effective)
    : Operation(std::move(cb)),
      group_(std::move(group)),
      dtype_(dtype),
      count_(count),
      signature_(std::move(shape_signature)),
      timeout_(timeout_seconds),
      data_(data),
      keepalive_(std::move(keepalive)),
      key_{stream, seq},
      effective_size_(std::move(effective)) {}

PReduceOp::~PReduceOp() = default;

bool PReduceOp::Done(EngineContext& ctx, Status s) {
  ctx.control.Resolve(ctx, key_);
  return Fail(std::move(s));
}

bool PReduceOp::Identity(EngineContext& ctx) {
  if (effective_size_) *effective_size_ = 1;
  ++ctx.counters->preduces;
  return Done(ctx, Status::OK());
}

void PReduceOp::Start(EngineContext& ctx) {
  if (ctx.failed()) {
    Fail(Status::Error(Code::kFailedPrecondition, Unusable(ctx)));
    return;
  }
  std::string bad = ValidateGroup(group_, ctx.rank, ctx.size);
  if (!bad.empty()) {
    Fail(Status::Error(Code::kInvalidArgument, bad));
    return;
  }
  if (ctx.withdrawn) {
    Fail(Status::Error(Code::kFailedPrecondition, Withdrawn(ctx)));
    return;
  }
  if (count_ < 0 || !DataTypeValid(static_cast<int32_t>(dtype_)) || (count_ > 0 && data_ == nullptr)) {
    Fail(Status::Error(Code::kInternal, "P-Reduce got an invalid buffer, count or dtype"));
    return;
  }
  std::sort(group_.begin(), group_.end());
  const uint64_t group_hash = Fnv1a64(group_.data(), group_.size() * sizeof(int));
  if (key_.stream == 0) {  // implicit key: the n-th P-Reduce of this group on this rank
    key_.stream = group_hash | (1ULL << 63);
    key_.seq = ++ctx.implicit_seq[key_.stream];
  } else if (ctx.control.IsLate(key_)) {
    Fail(Status::Error(Code::kInvalidArgument,
                       "P-Reduce instance " + std::to_string(key_.seq) + " of stream " + std::to_string(key_.stream) +
                           " is not after the last one this rank ran: instance ids must increase"));
    return;
  }
  if (timeout_ <= 0) timeout_ = ctx.default_timeout;
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  // Size 1, or this rank is already OUT of the instance (it was away when a peer asked): identity, no messages.
  if (group_.size() == 1 || ctx.control.TakeDecidedOut(key_)) {
    Identity(ctx);
    return;
  }

  mine_ = std::make_shared<WireHeader>();
  FillCommon(mine_.get(), kKindPReduce, ctx);
  mine_->stream = key_.stream;
  mine_->seq = key_.seq;
  mine_->dtype = static_cast<int32_t>(dtype_);
  mine_->count = count_;
  mine_->shape_hash = Fnv1a64(signature_.data(), signature_.size());
  mine_->group_hash = group_hash;
  mine_->group_size = static_cast<int32_t>(group_.size());
  mine_->group_listed = std::min<int32_t>(mine_->group_size, kMaxListedRanks);
  std::copy(group_.begin(), group_.begin() + mine_->group_listed, mine_->group);
  std::string sig = signature_;
  if (sig.size() >= static_cast<size_t>(kSignatureChars)) sig = sig.substr(0, kSignatureChars - 4) + "...";
  std::memcpy(mine_->signature, sig.data(), sig.size());

  // IN: from now on this rank keeps every message of the instance, whatever its availability.
  ctx.control.Join(ctx, key_);
  // Ranks known to have withdrawn in this session are neither sent to nor waited for.
  for (int r : group_) {
    if (r != ctx.rank && !ctx.done.count(r)) peers_.push_back(r);
  }
  received_.resize(peers_.size());
  send_reqs_.assign(peers_.size(), MPI_REQUEST_NULL);
  got_.assign(peers_.size(), 0);
  for (size_t i = 0; i < peers_.size(); ++i) {
    MPI_Isend(mine_.get(), sizeof(WireHeader), MPI_BYTE, peers_[i], kHeaderTag, ctx.comm, &send_reqs_[i]);
  }
}

bool PReduceOp::Progress(EngineContext& ctx) {
  if (finished()) {
    ReleaseSends(ctx);
    return true;
  }
  bool done = phase_ == Phase::kHeaders ? ProgressHeaders(ctx) : ProgressData(ctx);
  if (done) ReleaseSends(ctx);
  return done;
}

void PReduceOp::ReleaseSends(EngineContext& ctx) {
  // Header sends to ranks that withdrew are matched only after the next rejoin (and discarded there as stale);
  // hand them to the engine rather than wait.
  ctx.AdoptSends(std::move(send_reqs_), mine_);
  send_reqs_.clear();
}

bool PReduceOp::ProgressHeaders(EngineContext& ctx) {
  bool all = true;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (got_[i]) continue;
    int kind = ctx.control.Take(key_, peers_[i], &received_[i]);
    // A DONE orders after every header its sender sent before it, and the mailbox delivers in arrival order: a
    // withdrawn peer with no header here never joined this instance.
    if (kind == 0 && ctx.done.count(peers_[i])) kind = 2;
    if (kind == 0) {
      all = false;
      continue;
    }
    ctx.MarkProgress();
    got_[i] = static_cast<char>(kind);
    if (kind == 2) ++ctx.counters->peers_excluded;
  }
  if (all) return CheckHeadersAndStartData(ctx);
  if (Clock::now() < deadline_) return false;

  std::vector<int> missing;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (!got_[i]) missing.push_back(peers_[i]);
  }
  std::string msg = "P-Reduce on group " + FormatRanks(group_) + " timed out after " + FormatSeconds(timeout_) +
                    " s waiting for ranks " + FormatRanks(missing) +
                    " (they are inside their train step but never reached this P-Reduce, or died)";
  ctx.Fail(msg);
  return Done(ctx, Status::Error(Code::kDeadlineExceeded,
                                 msg + "; the hetsync engine is now unusable until it is shut down and started "
                                       "again on every rank (see docs/engine.md, timeouts)"));
}

bool PReduceOp::CheckHeadersAndStartData(EngineContext& ctx) {
  effective_.clear();
  std::vector<const WireHeader*> headers;  // of effective members, in rank order
  for (int r : group_) {
    if (r == ctx.rank) {
      effective_.push_back(r);
      headers.push_back(mine_.get());
      continue;
    }
    auto it = std::find(peers_.begin(), peers_.end(), r);
    if (it == peers_.end()) continue;  // withdrew earlier in this session
    size_t i = it - peers_.begin();
    if (got_[i] != 1) continue;  // OUT of this instance
    effective_.push_back(r);
    headers.push_back(&received_[i]);
  }
  // Every member sees the same set of headers, so comparing the lowest rank's header with the first differing
  // one yields the same message on every member.
  const WireHeader& ref = *headers.front();
  for (size_t k = 1; k < headers.size(); ++k) {
    const WireHeader& h = *headers[k];
    bool group_differs = !SameGroup(ref, h);
    if (!group_differs && ref.dtype == h.dtype && ref.count == h.count && ref.shape_hash == h.shape_hash) continue;
    std::string msg = "P-Reduce mismatch in group " + FormatRanks(effective_) + ": rank " +
                      std::to_string(ref.sender) + " sent " + Describe(ref, group_differs) + ", rank " +
                      std::to_string(h.sender) + " sent " + Describe(h, group_differs);
    // Different requested groups mean the ranks' schedules disagree: headers may now be unmatched.
    if (group_differs) ctx.Fail(msg);
    return Done(ctx, Status::Error(Code::kInvalidArgument, msg));
  }
  if (effective_.size() == 1) return Identity(ctx);  // everybody else is OUT
  Status s = ctx.backend->StartAllreduceSum(effective_, data_, count_, dtype_, &pending_);
  if (!s.ok) {
    ctx.Fail(s.message);
    return Done(ctx, s);
  }
  phase_ = Phase::kData;
  // The data phase gets its own deadline of the same length: the header phase may legitimately have spent most
  // of the first one waiting for a straggler (Ripples' heterogeneity), whereas now every member is present.
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  ctx.MarkProgress();
  return ProgressData(ctx);
}

bool PReduceOp::ProgressData(EngineContext& ctx) {
  bool done = false;
  Status s = pending_->Test(&done);
  if (!s.ok) {
    ctx.Fail(s.message);
    ctx.Abandon(std::make_shared<InFlight>(InFlight{keepalive_, std::move(pending_)}));
    return Done(ctx, s);
  }
  if (!done) {
    ctx.MarkBusy();
    if (Clock::now() < deadline_) return false;
    std::string msg = "P-Reduce on group " + FormatRanks(effective_) + " timed out after " +
                      FormatSeconds(timeout_) + " s in its data phase (allreduce)";
    ctx.Fail(msg);
    // MPI may still write into the buffer: keep it (and the request) alive forever.
    ctx.Abandon(std::make_shared<InFlight>(InFlight{keepalive_, std::move(pending_)}));
    return Done(ctx, Status::Error(Code::kDeadlineExceeded, msg + "; the hetsync engine is now unusable"));
  }
  pending_.reset();  // frees an uncached communicator
  if (effective_size_) *effective_size_ = static_cast<int>(effective_.size());
  ++ctx.counters->preduces;
  ctx.counters->bytes += count_ * static_cast<int64_t>(DataTypeSize(dtype_));
  ctx.counters->wire_bytes += count_ * static_cast<int64_t>(DataTypeSize(dtype_));
  ctx.MarkProgress();
  return Done(ctx, Status::OK());
}

void WithdrawOp::Start(EngineContext& ctx) {
  if (ctx.failed()) {
    Finish(Status::Error(Code::kFailedPrecondition, Unusable(ctx)));
    return;
  }
  if (ctx.withdrawn) {  // idempotent
    Finish(Status::OK());
    return;
  }
  // Sent on the header tag, after every earlier P-Reduce header of this rank (serial op order): a peer that gets
  // it has every header this rank ever sent it, so a missing one means OUT.
  auto done = std::make_shared<WireHeader>();
  FillCommon(done.get(), kKindDone, ctx);
  std::vector<MPI_Request> reqs;
  for (int r = 0; r < ctx.size; ++r) {
    if (r == ctx.rank || ctx.done.count(r)) continue;
    reqs.emplace_back();
    MPI_Isend(done.get(), sizeof(WireHeader), MPI_BYTE, r, kHeaderTag, ctx.comm, &reqs.back());
  }
  ctx.AdoptSends(std::move(reqs), done);
  ctx.withdrawn = true;
  ctx.counters->withdrawn = true;
  Finish(Status::OK());
}

void RejoinOp::Start(EngineContext& ctx) {
  if (ctx.failed()) {
    Finish(Status::Error(Code::kFailedPrecondition, Unusable(ctx)));
    return;
  }
  // Messages of the old session still in flight (headers to ranks that had withdrawn, DONEs nobody waited for)
  // carry the old session id and are dropped when received (ControlPlane::Deliver).
  ++ctx.session;
  ctx.done.clear();
  ctx.withdrawn = false;
  ctx.implicit_seq.clear();
  ctx.control.NewSession(ctx);
  ctx.counters->session = static_cast<int64_t>(ctx.session);
  ctx.counters->withdrawn = false;
  Finish(Status::OK());
}

void ExcludeOp::Start(EngineContext& ctx) {
  ctx.control.Exclude(ctx, stream_, seqs_);
  Finish(Status::OK());
}

}  // namespace hetsync
