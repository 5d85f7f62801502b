// The non-blocking allreduce: start -> handle, wait(handle) (OD-SGD §3.3 "execution sequences": the gradient
// allreduce of step t runs while step t+1 computes).
//
// AsyncAllreduceOp sums one fused buffer over EVERY rank (strictly: no rank is excluded, unlike P-Reduce's
// EXCLUDE or the partial allreduce's away ranks -- a synchronous method needs every contribution in every call).
// Two phases on the progress thread:
//   1. headers: each rank sends {seq, count} to every peer (tag kAsyncAllreduceTag) and waits for theirs, so a
//      rank that never calls is named after `timeout` ("waiting for ranks [3]") instead of hanging inside MPI;
//   2. data: the backend's MPI_Iallreduce (sum, in place) over all ranks, tested with MPI_Test while the caller
//      computes.
// The op is Serial: serial ops start in enqueue order, which every rank shares, so the data phases of several
// outstanding calls -- and of P-Reduces on the same member set -- match on the shared communicator.
//
// AsyncResults is the handle table: Start registers a result and returns its handle; the op completes it on the
// progress thread; Wait takes it (once) and runs a callback when it is complete. Generic: any op whose result is a
// buffer can complete an AsyncResult the same way (docs/engine.md, "The non-blocking allreduce").
#ifndef HETSYNC_ENGINE_ALLREDUCE_OP_H_
#define HETSYNC_ENGINE_ALLREDUCE_OP_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace hetsync {

constexpr int kAsyncAllreduceTag = 0x4857;

// One started call: its buffer (the sum, once done), status and engine timestamps (steady clock, seconds).
struct AsyncResult {
  std::vector<char> buffer;
  DataType dtype = DataType::kFloat32;
  int64_t count = 0;
  double t_enqueued = 0, t_data = 0, t_done = 0;  // start called / headers complete, data phase began / done

  // Completes once (progress thread); runs the waiter if one is registered.
  void Complete(const Status& s);
  // Runs `fn(status)` now if complete, else on completion (on the progress thread).
  void OnDone(std::function<void(const Status&)> fn);

 private:
  std::mutex mu_;
  bool done_ = false;
  Status status_;
  std::function<void(const Status&)> waiter_;
};

class AsyncResults {
 public:
  static AsyncResults& Get();
  int64_t Add(std::shared_ptr<AsyncResult> r);
  // Removes and returns the result of `handle` (nullptr if unknown or already taken).
  std::shared_ptr<AsyncResult> Take(int64_t handle);
  size_t pending() const;

 private:
  mutable std::mutex mu_;
  int64_t next_ = 1;
  std::map<int64_t, std::shared_ptr<AsyncResult>> table_;
};

class AsyncAllreduceOp : public Operation {
 public:
  AsyncAllreduceOp(std::shared_ptr<AsyncResult> result, double timeout_seconds);
  const char* Name() const override { return "AsyncAllreduce"; }
  bool Serial() const override { return true; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  bool ProgressHeaders(EngineContext& ctx);
  bool ProgressData(EngineContext& ctx);
  bool Done(EngineContext& ctx, Status s);

  std::shared_ptr<AsyncResult> result_;
  double timeout_;
  Clock::time_point deadline_;
  bool data_phase_ = false;
  int64_t seq_ = 0;
  std::shared_ptr<std::vector<int64_t>> mine_;   // {seq, count}, kept alive for the sends
  std::vector<int> peers_;
  std::vector<int64_t> theirs_;                  // 2 per peer
  std::vector<MPI_Request> send_reqs_, recv_reqs_;
  std::vector<char> got_;
  std::unique_ptr<PendingCollective> pending_;
};

double SteadySeconds();

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_ALLREDUCE_OP_H_
