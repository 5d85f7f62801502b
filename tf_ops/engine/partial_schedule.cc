// PartialSchedule: activation (eager-SGD §4.1 solo, §4.2 majority), rounds, send/receive buffers (§5, Fig 7).
#include "engine/partial_schedule.h"

#include <algorithm>
#include <cstring>

#include "engine/engine.h"

namespace hetsync {
namespace {

template <typename T>
void AddInto(const void* in, char* inout, int64_t n) {
  const T* a = static_cast<const T*>(in);
  T* b = reinterpret_cast<T*>(inout);
  for (int64_t i = 0; i < n; ++i) b[i] += a[i];
}

void CopyString(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(cap - 1, s.size()));
}

int Dimensions(int size) {
  int d = 0;
  while ((1 << d) < size) ++d;
  return d;
}

}  // namespace

PartialSchedule::PartialSchedule(uint64_t id, const PartialSpec& spec, bool local, double timeout)
    : id_(id), spec_(spec), local_(local), timeout_(timeout) {
  if (local) send_buf_.assign(spec.count * DataTypeSize(spec.dtype), 0);
}

PartialSchedule::~PartialSchedule() = default;

std::string PartialSchedule::SetLocal(EngineContext& ctx, const PartialSpec& spec) {
  if (local_) {
    if (spec == spec_) return "";
    return "partial allreduce '" + spec.name + "' on rank " + std::to_string(ctx.rank) + ": called with " +
           spec.desc + " but earlier with " + spec_.desc + " (one name, one set of tensors: use another name)";
  }
  if (!(spec == spec_)) {  // rounds run with other tensors are not this rank's
    acc_buf_.clear();
    acc_rounds_ = 0;
  }
  spec_ = spec;  // may differ from the activations seen so far: the next round reports it on every rank
  local_ = true;
  send_buf_.assign(spec.count * DataTypeSize(spec.dtype), 0);
  return "";
}

void PartialSchedule::Deposit(const void* data) {
  if (spec_.dtype == DataType::kFloat64) {
    AddInto<double>(data, send_buf_.data(), spec_.count);
  } else {
    AddInto<float>(data, send_buf_.data(), spec_.count);
  }
  if (!has_contribution_) deposit_round_ = next_round_;
  has_contribution_ = true;
}

void PartialSchedule::Discard() {
  std::fill(acc_buf_.begin(), acc_buf_.end(), 0);
  acc_rounds_ = 0;
  std::fill(send_buf_.begin(), send_buf_.end(), 0);
  has_contribution_ = false;
  consumed_round_ = result_round_;
}

void PartialSchedule::Drain(void* out, size_t bytes) {
  std::memset(out, 0, bytes);
  if (local_ && send_buf_.size() == bytes) {
    const bool unconsumed = result_round_ > consumed_round_ && ResultMatchesLocal();
    const std::vector<char>* results = spec_.accumulate ? &acc_buf_ : (unconsumed ? &recv_buf_ : nullptr);
    const std::vector<const std::vector<char>*> sources = {results, has_contribution_ ? &send_buf_ : nullptr};
    for (const std::vector<char>* src : sources) {
      if (!src || src->size() != bytes) continue;
      if (spec_.dtype == DataType::kFloat64) {
        AddInto<double>(src->data(), static_cast<char*>(out), spec_.count);
      } else {
        AddInto<float>(src->data(), static_cast<char*>(out), spec_.count);
      }
    }
  }
  Discard();
}

int PartialSchedule::Designated(EngineContext& ctx, int64_t round) const {
  if (spec_.mode == PartialMode::kAll) return kAllCoordinator;
  return MajorityInitiator(spec_.seed, spec_.name, round, ctx.size);
}

bool PartialSchedule::AllPresentArrived(EngineContext& ctx) const {
  auto it = arrived_.find(next_round_);
  if (it == arrived_.end() || it->second.empty()) return false;  // nobody waits: no empty rounds
  for (int r = 0; r < ctx.size; ++r) {
    const bool away = r == ctx.rank ? ctx.control.away() : ctx.partial.PeerAway(r);
    if (!it->second.count(r) && !away) return false;
  }
  return true;
}

void PartialSchedule::CallActivate(EngineContext& ctx) {
  const int64_t r = next_round_;
  if (spec_.mode == PartialMode::kSolo) {
    Activate(ctx, r, ctx.rank, -1, ctx.rank, spec_);
    return;
  }
  const int d = Designated(ctx, r);
  if (spec_.mode == PartialMode::kAll && d == ctx.rank) {
    arrived_[r].insert(ctx.rank);  // Poll activates once every rank has arrived or is away
  } else if (d == ctx.rank) {
    Activate(ctx, r, ctx.rank, -1, ctx.rank, spec_);
  } else if (arrive_sent_ < r) {
    arrive_sent_ = r;
    SendNotice(ctx, NoticeFor(ctx, spec_, kNoticeArrive, r), d);
  }
}

PartialNotice PartialSchedule::NoticeFor(EngineContext& ctx, const PartialSpec& spec, uint32_t kind,
                                         int64_t round) const {
  PartialNotice n;
  std::memset(&n, 0, sizeof(n));
  n.magic = kActivationMagic;
  n.kind = kind;
  n.id = id_;
  n.round = round;
  n.dim = -1;
  n.root = -1;
  n.sender = ctx.rank;
  n.mode = static_cast<int32_t>(spec.mode);
  n.seed = spec.seed;
  n.dtype = static_cast<int32_t>(spec.dtype);
  n.wire_half = spec.wire_half ? 1 : 0;
  n.accumulate = spec.accumulate ? 1 : 0;
  n.count = spec.count;
  n.timeout = spec.timeout;
  n.shape_hash = spec.shape_hash;
  CopyString(n.name, sizeof(n.name), spec.name);
  CopyString(n.desc, sizeof(n.desc), spec.desc);
  return n;
}

void PartialSchedule::SendNotice(EngineContext& ctx, const PartialNotice& n, int to) {
  auto msg = std::make_shared<PartialNotice>(n);
  std::vector<MPI_Request> reqs(1);
  MPI_Isend(msg.get(), sizeof(PartialNotice), MPI_BYTE, to, kActivationTag, ctx.comm, &reqs[0]);
  ctx.AdoptSends(std::move(reqs), msg);
}

void PartialSchedule::Activate(EngineContext& ctx, int64_t round, int from_node, int from_dim, int root,
                               const PartialSpec& spec) {
  Activation& a = acts_[round];
  if (!a.activated) {
    a.activated = true;
    a.root = root;
    a.spec = spec;
  }
  Forward(ctx, round, a, from_node, from_dim);
}

void PartialSchedule::Forward(EngineContext& ctx, int64_t round, Activation& a, int node, int from_dim) {
  // Recursive doubling: `node` (activated through dimension from_dim, or -1 when it initiated) sends on every higher
  // dimension. A send is consumed once per round, whichever activation fired it first (multiple initiators).
  const int dims = Dimensions(ctx.size);
  for (int j = from_dim + 1; j < dims; ++j) {
    if (!a.sent.insert({node, j}).second) continue;
    const int to = node ^ (1 << j);
    if (to >= ctx.size) {
      Forward(ctx, round, a, to, j);  // a rank missing from a non-power-of-two world: send on its behalf
    } else if (to != ctx.rank) {
      PartialNotice n = NoticeFor(ctx, a.spec, kNoticeActivate, round);
      n.dim = j;
      n.root = a.root;
      SendNotice(ctx, n, to);
    }
  }
}

void PartialSchedule::OnActivate(EngineContext& ctx, const PartialNotice& n) {
  if (!failure_.empty() || n.round < next_round_) return;  // that round already ran here (consumable)
  const PartialSpec spec = SpecFromNotice(n);
  Activate(ctx, n.round, ctx.rank, n.dim, n.root, spec);
}

void PartialSchedule::OnArrive(EngineContext& ctx, const PartialNotice& n) {
  if (n.round < next_round_) return;
  if (spec_.mode == PartialMode::kAll) {
    arrived_[n.round].insert(n.sender);
  } else {
    arrivals_.insert(n.round);
  }
}

void PartialSchedule::OnAbort(EngineContext& ctx, const PartialNotice& n) {
  std::string why(n.desc, strnlen(n.desc, sizeof(n.desc)));
  FailAll(ctx, Code::kUnavailable, why + " (reported by rank " + std::to_string(n.sender) + ")", n.root, false);
  ctx.Fail(failure_);
}

bool PartialSchedule::Poll(EngineContext& ctx) {
  if (!failure_.empty()) return false;
  bool any = false;
  while (!arrivals_.empty() && *arrivals_.begin() < next_round_) arrivals_.erase(arrivals_.begin());
  arrived_.erase(arrived_.begin(), arrived_.lower_bound(next_round_));
  if (!exec_ && spec_.mode == PartialMode::kAll && ctx.rank == kAllCoordinator && AllPresentArrived(ctx)) {
    auto it = acts_.find(next_round_);
    if (it == acts_.end() || !it->second.activated) {
      Activate(ctx, next_round_, ctx.rank, -1, ctx.rank, spec_);
      any = true;
    }
  }
  if (!exec_ && spec_.mode == PartialMode::kMajority && arrivals_.count(next_round_) && ctx.control.away()) {
    // A peer waits for a round this rank initiates, and this rank is not coming soon: initiate it now.
    auto it = acts_.find(next_round_);
    if ((it == acts_.end() || !it->second.activated) && Designated(ctx, next_round_) == ctx.rank) {
      Activate(ctx, next_round_, ctx.rank, -1, ctx.rank, spec_);
      any = true;
    }
  }
  if (!exec_) {
    auto it = acts_.find(next_round_);
    if (it != acts_.end() && it->second.activated) {
      StartRound(ctx);
      any = true;
    }
  }
  if (exec_) {
    std::string err;
    int culprit = -1;
    if (exec_->Progress(ctx, &err, &culprit)) {
      if (!err.empty()) {
        FailAll(ctx, Code::kUnavailable, err, culprit, true);
      } else {
        FinishRound(ctx);
      }
      any = true;
    }
  }
  return any;
}

void PartialSchedule::StartRound(EngineContext& ctx) {
  Activation& a = acts_[next_round_];
  const int tag = kPartialDataTagBase + static_cast<int>(id_ % kPartialDataTags);
  // A rank that called runs the round with its own tensors, one that did not yet with the initiator's (zeros); if
  // calling ranks' tensors differ, the exchange finds it on every rank (RoundExec::Merge).
  const double timeout = a.spec.timeout > 0 ? a.spec.timeout : timeout_;  // the initiator's: same deadlines everywhere
  exec_ = std::make_unique<RoundExec>(ctx, id_, tag, next_round_, local_ ? spec_ : a.spec, local_, timeout);
  my_staleness_ = -1;
  if (local_ && has_contribution_) {  // passive or active: the progress thread sends what the buffer holds
    if (spec_.wire_half) {
      FloatsToHalves(reinterpret_cast<const float*>(send_buf_.data()), reinterpret_cast<uint16_t*>(exec_->data()),
                     spec_.count);
    } else {
      std::memcpy(exec_->data(), send_buf_.data(), send_buf_.size());
    }
    std::fill(send_buf_.begin(), send_buf_.end(), 0);
    has_contribution_ = false;
    exec_->flags()[ctx.rank] = call_in_flight ? 2 : 1;  // a waiting call's deposit is in it: active
    my_staleness_ = next_round_ - deposit_round_;
    ++ctx.counters->partial_contributed;
    ctx.counters->partial_staleness_sum += my_staleness_;
  }
}

void PartialSchedule::FinishRound(EngineContext& ctx) {
  const int64_t r = exec_->round();
  const RoundExec::Head* h = exec_->head();
  if (h->diff_rank >= 0 || h->sizes_differ) {
    std::string why = "partial allreduce '" + spec_.name + "': the ranks disagree on the tensors: ";
    if (h->diff_rank >= 0) {
      why += "rank " + std::to_string(h->lo_rank) + " calls it with " +
             std::string(h->lo_desc, strnlen(h->lo_desc, sizeof(h->lo_desc))) + ", rank " +
             std::to_string(h->diff_rank) + " with " +
             std::string(h->diff_desc, strnlen(h->diff_desc, sizeof(h->diff_desc)));
    } else {
      why += "round " + std::to_string(r) + " exchanged messages of different sizes (two ranks initiated it with "
             "different tensors)";
    }
    exec_.reset();
    FailAll(ctx, Code::kInvalidArgument, why, -1, false);
    return;
  }
  const PartialSpec& ran = exec_->spec();
  const size_t bytes = ran.count * DataTypeSize(ran.dtype);
  if (ran.wire_half) {
    recv_buf_.resize(bytes);
    HalvesToFloats(reinterpret_cast<const uint16_t*>(exec_->data()), reinterpret_cast<float*>(recv_buf_.data()),
                   ran.count, 1.0f);
  } else {
    recv_buf_.assign(exec_->data(), exec_->data() + bytes);
  }
  ctx.counters->wire_bytes += ran.count * (ran.wire_half ? 2 : DataTypeSize(ran.dtype));
  const int nap = static_cast<int>(std::count_if(exec_->flags(), exec_->flags() + ctx.size, [](uint8_t f) { return f; }));
  Normalize(ran, ran.accumulate ? ctx.size : std::max(nap, 1));
  result_spec_ = exec_->spec();
  result_ = PartialResult();
  result_.round = r;
  result_.contributors.assign(exec_->flags(), exec_->flags() + ctx.size);
  for (uint8_t f : result_.contributors) {
    result_.nap += f > 0;
    result_.active += f == 2;
  }
  result_.initiator = acts_[r].root;  // the rank whose activation started this round, as its notices carried it
  result_.staleness = my_staleness_;
  result_round_ = r;
  next_round_ = r + 1;
  if (ran.accumulate && ran == spec_) {  // rounds before this rank's first call count too (same tensors)
    if (acc_buf_.size() != recv_buf_.size()) acc_buf_.assign(recv_buf_.size(), 0);
    if (ran.dtype == DataType::kFloat64) {
      AddInto<double>(recv_buf_.data(), acc_buf_.data(), ran.count);
    } else {
      AddInto<float>(recv_buf_.data(), acc_buf_.data(), ran.count);
    }
    ++acc_rounds_;
  }
  acts_.erase(acts_.begin(), acts_.upper_bound(r));
  exec_.reset();
  ++ctx.counters->partial_rounds;
}

void PartialSchedule::Normalize(const PartialSpec& ran, int divisor) {
  if (divisor == 1) return;
  if (ran.dtype == DataType::kFloat64) {
    double* p = reinterpret_cast<double*>(recv_buf_.data());
    for (int64_t i = 0; i < ran.count; ++i) p[i] /= divisor;
  } else {
    float* p = reinterpret_cast<float*>(recv_buf_.data());
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < ran.count; ++i) p[i] /= d;
  }
}

PartialResult PartialSchedule::TakeResult(EngineContext& ctx, void* out, bool included) {
  const std::vector<char>& src = spec_.accumulate ? acc_buf_ : recv_buf_;
  const size_t n = std::min(src.size(), send_buf_.size());
  if (n) std::memcpy(out, src.data(), n);
  if (n < send_buf_.size()) std::memset(static_cast<char*>(out) + n, 0, send_buf_.size() - n);  // no round yet
  consumed_round_ = result_round_;
  PartialResult r = result_;
  r.rounds = spec_.accumulate ? acc_rounds_ : 1;
  if (spec_.accumulate) {
    std::fill(acc_buf_.begin(), acc_buf_.end(), 0);
    acc_rounds_ = 0;
  }
  r.included = included;
  if (!included) r.staleness = -1;
  return r;
}

void PartialSchedule::FailAll(EngineContext& ctx, Code code, const std::string& why, int culprit,
                              bool tell_others) {
  if (!failure_.empty()) return;
  failure_ = why;
  failure_code_ = code;
  if (exec_) exec_->Abandon(ctx);
  if (!tell_others) return;
  ctx.Fail(why);
  PartialNotice n = NoticeFor(ctx, spec_, kNoticeAbort, exec_ ? exec_->round() : next_round_);
  n.root = culprit;
  CopyString(n.desc, sizeof(n.desc), why);
  for (int r = 0; r < ctx.size; ++r) {
    if (r != ctx.rank) SendNotice(ctx, n, r);
  }
}

void PartialSchedule::Abandon(EngineContext& ctx) {
  if (exec_) exec_->Abandon(ctx);
}

int64_t PartialSchedule::Pending() const {
  return static_cast<int64_t>(acts_.size() + arrivals_.size() + arrived_.size()) +
         (exec_ ? exec_->Outstanding() : 0);
}

}  // namespace hetsync
