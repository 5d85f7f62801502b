// RoundExec: the data phase of one partial-allreduce round (eager-SGD §4.1: "For the allreduce, we use a recursive
// doubling implementation"), run by the progress thread of every rank, whether or not its Python thread called.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "engine/engine.h"
#include "engine/partial_schedule.h"

namespace hetsync {
namespace {

// A partner that has not sent by step_start + timeout + index * kStepSlack is reported. Later steps wait longer, so
// the rank that waits directly on a dead rank (the earliest step) reports first and every rank names it (ABORT).
constexpr double kStepSlack = 1.0;

size_t AlignUp(size_t n) { return (n + 7) & ~static_cast<size_t>(7); }

template <typename T>
void AddInto(const char* in, char* inout, int64_t n) {
  const T* a = reinterpret_cast<const T*>(in);
  T* b = reinterpret_cast<T*>(inout);
  for (int64_t i = 0; i < n; ++i) b[i] += a[i];
}

}  // namespace

RoundExec::RoundExec(EngineContext& ctx, uint64_t id, int tag, int64_t round, const PartialSpec& spec,
                     bool caller, double timeout)
    : id_(id), tag_(tag), round_(round), spec_(spec), timeout_(timeout) {
  data_offset_ = AlignUp(sizeof(Head) + ctx.size);
  bytes_ = data_offset_ + spec.count * (spec.wire_half ? 2 : DataTypeSize(spec.dtype));
  buf_ = std::make_shared<std::vector<char>>(bytes_, 0);
  in_ = std::make_shared<std::vector<char>>(bytes_, 0);
  Head* h = head();
  h->id = id;
  h->round = round;
  h->size = ctx.size;
  h->sizes_differ = 0;
  h->lo_rank = -1;
  h->diff_rank = -1;
  if (caller) {
    h->lo_rank = ctx.rank;
    h->lo_hash = Fnv1a64(spec.desc.data(), spec.desc.size(), spec.shape_hash ^ static_cast<uint64_t>(spec.count));
    std::memcpy(h->lo_desc, spec.desc.data(), std::min(spec.desc.size(), sizeof(h->lo_desc) - 1));
  }
  rank_ = ctx.rank;
  Plan(ctx.rank, ctx.size);
  step_start_ = std::chrono::steady_clock::now();
}

RoundExec::~RoundExec() = default;

void RoundExec::Plan(int rank, int size) {
  // Phases: 0 fold-in, 1..D recursive doubling, D+1 fold-out. A wait in phase p reports after timeout + p seconds.
  int pof2 = 1, dims = 0;
  while (pof2 * 2 <= size) {
    pof2 *= 2;
    ++dims;
  }
  const int rem = size - pof2;
  if (rank >= pof2) {  // folded: hand the data to a partner, get the result back
    steps_.push_back({rank - pof2, true, false, false, 0});
    steps_.push_back({rank - pof2, false, true, false, dims + 1});
    return;
  }
  if (rank < rem) steps_.push_back({rank + pof2, false, true, true, 0});
  int phase = 1;
  for (int mask = 1; mask < pof2; mask <<= 1) steps_.push_back({rank ^ mask, true, true, true, phase++});
  if (rank < rem) steps_.push_back({rank + pof2, true, false, false, dims + 1});
}

void RoundExec::Post(EngineContext& ctx) {
  const Step& s = steps_[step_];
  received_ = -1;
  matched_ = false;
  if (s.send) MPI_Isend(buf_->data(), static_cast<int>(bytes_), MPI_BYTE, s.partner, tag_, ctx.comm, &send_);
  posted_ = true;
  step_start_ = std::chrono::steady_clock::now();
}

void RoundExec::Merge(const Head& theirs) {
  Head* mine = head();
  if (theirs.sizes_differ) mine->sizes_differ = 1;
  if (theirs.lo_rank < 0) return;
  if (mine->lo_rank < 0) {
    std::memcpy(&mine->lo_rank, &theirs.lo_rank, sizeof(Head) - offsetof(Head, lo_rank));
    return;
  }
  // Candidates for the merged diff: each part's lo and diff; keep the lowest whose tensors differ from merged lo.
  const Head* lo = theirs.lo_rank < mine->lo_rank ? &theirs : mine;
  const Head* other = lo == mine ? &theirs : mine;
  struct Cand {
    int32_t rank;
    uint64_t hash;
    const char* desc;
  } cands[4] = {{lo->diff_rank, lo->diff_hash, lo->diff_desc},
                {other->lo_rank, other->lo_hash, other->lo_desc},
                {other->diff_rank, other->diff_hash, other->diff_desc},
                {-1, 0, nullptr}};
  Head merged = *lo;
  merged.sizes_differ = mine->sizes_differ;
  merged.diff_rank = -1;
  for (const Cand& c : cands) {
    if (c.rank < 0 || c.hash == lo->lo_hash) continue;
    if (merged.diff_rank < 0 || c.rank < merged.diff_rank) {
      merged.diff_rank = c.rank;
      merged.diff_hash = c.hash;
      std::memcpy(merged.diff_desc, c.desc, sizeof(merged.diff_desc));
    }
  }
  merged.id = mine->id;
  merged.round = mine->round;
  merged.size = mine->size;
  *mine = merged;
}

bool RoundExec::Combine(std::string* error) {
  const Head* theirs = reinterpret_cast<const Head*>(in_->data());
  Head* mine = head();
  if (theirs->id != mine->id || theirs->round != mine->round) {
    *error = "partial allreduce '" + spec_.name + "': round " + std::to_string(round_) +
             " received data of another collective or round (two collective names share a message tag; rename "
             "one of them)";
    return false;
  }
  Merge(*theirs);
  if (received_ != static_cast<int>(bytes_)) {  // other tensors: the round fails everywhere (FinishRound)
    mine->sizes_differ = 1;
    return true;
  }
  const uint8_t* tf = reinterpret_cast<const uint8_t*>(in_->data() + sizeof(Head));
  for (int i = 0; i < mine->size; ++i) flags()[i] = std::max(flags()[i], tf[i]);
  const char* td = in_->data() + data_offset_;
  if (spec_.wire_half) {
    AddHalves(reinterpret_cast<const uint16_t*>(td), reinterpret_cast<uint16_t*>(data()), spec_.count);
  } else if (spec_.dtype == DataType::kFloat64) {
    AddInto<double>(td, data(), spec_.count);
  } else {
    AddInto<float>(td, data(), spec_.count);
  }
  return true;
}

bool RoundExec::Progress(EngineContext& ctx, std::string* error, int* culprit) {
  while (step_ < steps_.size()) {
    if (!posted_) Post(ctx);
    const Step& s = steps_[step_];
    int recv_done = 1, send_done = 1;
    if (s.recv && !matched_) {
      // Probe first: a partner with other tensors sends another size, which must not truncate (see Combine).
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      MPI_Improbe(s.partner, tag_, ctx.comm, &flag, &msg, &st);
      if (flag) {
        MPI_Get_count(&st, MPI_BYTE, &received_);
        if (in_->size() < static_cast<size_t>(std::max<int>(received_, sizeof(Head)))) {
          in_->resize(std::max<int>(received_, sizeof(Head)));
        }
        MPI_Imrecv(in_->data(), received_, MPI_BYTE, &msg, &recv_);
        matched_ = true;
      } else {
        recv_done = 0;
      }
    }
    if (recv_ != MPI_REQUEST_NULL && MPI_Test(&recv_, &recv_done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      *error = "partial allreduce '" + spec_.name + "': receiving round " + std::to_string(round_) +
               " from rank " + std::to_string(s.partner) + " failed";
      return true;
    }
    if (send_ != MPI_REQUEST_NULL) MPI_Test(&send_, &send_done, MPI_STATUS_IGNORE);
    if (!recv_done || !send_done) {
      ctx.MarkBusy();
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
      if (!recv_done && waited > timeout_ + kStepSlack * s.phase) {
        *culprit = s.partner;
        *error = "partial allreduce '" + spec_.name + "': rank " + std::to_string(s.partner) +
                 " sent nothing for round " + std::to_string(round_) + " within " + FormatSeconds(timeout_) +
                 " s (its engine is gone: the process died or shut hetsync down)";
        return true;
      }
      return false;
    }
    if (s.recv) {
      if (s.combine) {
        if (!Combine(error)) return true;
      } else if (received_ == static_cast<int>(bytes_)) {
        buf_.swap(in_);  // the folded rank gets the result
      } else {
        head()->sizes_differ = 1;
        Merge(*reinterpret_cast<const Head*>(in_->data()));
      }
    }
    ctx.MarkProgress();
    posted_ = false;
    ++step_;
  }
  return true;
}

void RoundExec::Abandon(EngineContext& ctx) {
  if (recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&recv_);
    MPI_Wait(&recv_, MPI_STATUS_IGNORE);
  }
  if (send_ != MPI_REQUEST_NULL) {
    std::vector<MPI_Request> reqs{send_};
    send_ = MPI_REQUEST_NULL;
    ctx.AdoptSends(std::move(reqs), buf_);
  }
}

int64_t RoundExec::Outstanding() const {
  return (recv_ != MPI_REQUEST_NULL ? 1 : 0) + (send_ != MPI_REQUEST_NULL ? 1 : 0);
}

}  // namespace hetsync
