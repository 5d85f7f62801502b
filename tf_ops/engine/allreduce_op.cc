// AsyncAllreduceOp and the handle table (see allreduce_op.h).
#include "engine/allreduce_op.h"

#include <chrono>

namespace hetsync {
namespace {

struct Abandoned {
  std::shared_ptr<AsyncResult> result;  // MPI may still write into its buffer
  std::unique_ptr<PendingCollective> pending;
};

}  // namespace

double SteadySeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

void AsyncResult::Complete(const Status& s) {
  std::function<void(const Status&)> waiter;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = s;
    t_done = SteadySeconds();
    waiter = std::move(waiter_);
    waiter_ = nullptr;
  }
  if (waiter) waiter(s);
}

void AsyncResult::OnDone(std::function<void(const Status&)> fn) {
  Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      waiter_ = std::move(fn);
      return;
    }
    s = status_;
  }
  fn(s);
}

AsyncResults& AsyncResults::Get() {
  static AsyncResults* table = new AsyncResults();  // never destroyed (see Engine::Get)
  return *table;
}

int64_t AsyncResults::Add(std::shared_ptr<AsyncResult> r) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t h = next_++;
  table_.emplace(h, std::move(r));
  return h;
}

std::shared_ptr<AsyncResult> AsyncResults::Take(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(handle);
  if (it == table_.end()) return nullptr;
  auto r = std::move(it->second);
  table_.erase(it);
  return r;
}

size_t AsyncResults::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

AsyncAllreduceOp::AsyncAllreduceOp(std::shared_ptr<AsyncResult> result, double timeout_seconds)
    : Operation([result](const Status& s) { result->Complete(s); }),
      result_(std::move(result)),
      timeout_(timeout_seconds) {}

void AsyncAllreduceOp::Start(EngineContext& ctx) {
  if (ctx.failed()) {
    Finish(Status::Error(Code::kFailedPrecondition,
                         "the hetsync engine is unusable after an earlier failure: " + ctx.failure()));
    return;
  }
  if (timeout_ <= 0) timeout_ = ctx.default_timeout;
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  seq_ = ++ctx.async_allreduce_seq;
  if (ctx.size == 1) {  // the sum over one rank is the buffer itself
    result_->t_data = SteadySeconds();
    Finish(Status::OK());
    return;
  }
  mine_ = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{seq_, result_->count});
  for (int r = 0; r < ctx.size; ++r) {
    if (r != ctx.rank) peers_.push_back(r);
  }
  theirs_.assign(2 * peers_.size(), 0);
  send_reqs_.assign(peers_.size(), MPI_REQUEST_NULL);
  recv_reqs_.assign(peers_.size(), MPI_REQUEST_NULL);
  got_.assign(peers_.size(), 0);
  for (size_t i = 0; i < peers_.size(); ++i) {
    MPI_Irecv(&theirs_[2 * i], 2, MPI_INT64_T, peers_[i], kAsyncAllreduceTag, ctx.comm, &recv_reqs_[i]);
    MPI_Isend(mine_->data(), 2, MPI_INT64_T, peers_[i], kAsyncAllreduceTag, ctx.comm, &send_reqs_[i]);
  }
}

bool AsyncAllreduceOp::Progress(EngineContext& ctx) {
  if (finished()) return true;
  return data_phase_ ? ProgressData(ctx) : ProgressHeaders(ctx);
}

bool AsyncAllreduceOp::ProgressHeaders(EngineContext& ctx) {
  bool all = true;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (got_[i]) continue;
    int flag = 0;
    MPI_Test(&recv_reqs_[i], &flag, MPI_STATUS_IGNORE);
    if (!flag) {
      all = false;
      continue;
    }
    got_[i] = 1;
    ctx.MarkProgress();
  }
  if (!all) {
    if (Clock::now() < deadline_) return false;
    std::vector<int> missing;
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (!got_[i]) missing.push_back(peers_[i]);
    }
    std::string msg = "non-blocking allreduce #" + std::to_string(seq_) + " timed out after " +
                      FormatSeconds(timeout_) + " s waiting for ranks " + FormatRanks(missing) +
                      " (they never started it: dead, hung, or running a different number of allreduces)";
    ctx.Fail(msg);
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (!got_[i]) MPI_Cancel(&recv_reqs_[i]);
    }
    ctx.AdoptSends(std::move(recv_reqs_), std::make_shared<std::vector<int64_t>>(std::move(theirs_)));
    return Done(ctx, Status::Error(Code::kDeadlineExceeded,
                                   msg + "; the hetsync engine is now unusable until it is restarted"));
  }
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (theirs_[2 * i] != seq_ || theirs_[2 * i + 1] != result_->count) {
      std::string msg = "non-blocking allreduce mismatch: rank " + std::to_string(ctx.rank) + " started #" +
                        std::to_string(seq_) + " with " + std::to_string(result_->count) + " elements, rank " +
                        std::to_string(peers_[i]) + " #" + std::to_string(theirs_[2 * i]) + " with " +
                        std::to_string(theirs_[2 * i + 1]);
      ctx.Fail(msg);
      return Done(ctx, Status::Error(Code::kInvalidArgument, msg));
    }
  }
  std::vector<int> everyone(ctx.size);
  for (int r = 0; r < ctx.size; ++r) everyone[r] = r;
  result_->t_data = SteadySeconds();
  Status s = ctx.backend->StartAllreduceSum(everyone, result_->buffer.data(), result_->count, result_->dtype,
                                            &pending_);
  if (!s.ok) {
    ctx.Fail(s.message);
    return Done(ctx, s);
  }
  data_phase_ = true;
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
  ctx.MarkProgress();
  return ProgressData(ctx);
}

bool AsyncAllreduceOp::ProgressData(EngineContext& ctx) {
  bool done = false;
  Status s = pending_->Test(&done);
  if (s.ok && !done) {
    ctx.MarkBusy();
    if (Clock::now() < deadline_) return false;
    s = Status::Error(Code::kDeadlineExceeded, "non-blocking allreduce #" + std::to_string(seq_) +
                                                   " timed out after " + FormatSeconds(timeout_) +
                                                   " s in its data phase; the hetsync engine is now unusable");
  }
  if (!s.ok) {
    ctx.Fail(s.message);
    ctx.Abandon(std::make_shared<Abandoned>(Abandoned{result_, std::move(pending_)}));
    return Done(ctx, s);
  }
  pending_.reset();
  ctx.counters->bytes += result_->count * static_cast<int64_t>(DataTypeSize(result_->dtype));
  ctx.counters->wire_bytes += result_->count * static_cast<int64_t>(DataTypeSize(result_->dtype));
  ctx.MarkProgress();
  return Done(ctx, Status::OK());
}

bool AsyncAllreduceOp::Done(EngineContext& ctx, Status s) {
  ctx.AdoptSends(std::move(send_reqs_), mine_);
  send_reqs_.clear();
  Finish(std::move(s));
  return true;
}

}  // namespace hetsync
