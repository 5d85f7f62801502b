// The hetsync communication engine: one per process, one background progress thread, its own MPI communicator.
//
// Why a separate engine instead of Horovod's: Horovod's collectives are global (every rank, negotiated by its
// coordinator); partial collectives (Ripples P-Reduce, eager-SGD solo/majority allreduce, Hop queues) involve a
// subset of ranks that changes every step. They need their own communicator (so their messages never match
// Horovod's) and their own thread (so they progress while the user's step computes). See docs/engine.md.
#ifndef HETSYNC_ENGINE_ENGINE_H_
#define HETSYNC_ENGINE_ENGINE_H_

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/common.h"
#include "engine/control.h"
#include "engine/hop.h"
#include "engine/partial.h"

namespace hetsync {

using Clock = std::chrono::steady_clock;

// Control-plane tag on the engine communicator: headers, EXCLUDE and DONE notices (control.h). One tag, so a
// rank's DONE reaches every peer after all of its earlier headers (MPI non-overtaking).
constexpr int kHeaderTag = 0x4853;

// Counters. Written by the progress thread, read by Stats() from any thread.
struct EngineCounters {
  std::atomic<int64_t> preduces{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> withdrawals_seen{0};
  std::atomic<int64_t> session{0};
  std::atomic<bool> withdrawn{false};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> away_events{0};     // times this rank went away (control.h)
  std::atomic<int64_t> self_excluded{0};   // instances this rank decided OUT of
  std::atomic<int64_t> peers_excluded{0};  // members missing from this rank's instances (EXCLUDE or DONE)
  std::atomic<int64_t> away{0};            // 1 while this rank counts as away
  std::atomic<int64_t> wire_bytes{0};      // bytes this rank's data phases reduced (after compression)
  // Partial allreduce (partial.h)
  std::atomic<int64_t> partial_rounds{0};         // rounds this rank took part in (with or without a call)
  std::atomic<int64_t> partial_contributed{0};    // rounds that carried this rank's data (actively or passively)
  std::atomic<int64_t> partial_staleness_sum{0};  // over those: rounds the oldest part of the data waited
  std::atomic<int64_t> partial_included{0};       // calls whose tensors are in the round they returned
  std::atomic<int64_t> partial_missed{0};         // calls that came late (tensors kept for the next round)
  std::atomic<int64_t> partial_pending{0};        // activations/arrivals buffered + requests in flight
  std::atomic<int64_t> partial_schedules{0};      // persistent schedules on this rank
};

// Snapshot returned by Engine::Stats(); the order of kStatNames is the order of the TF stats vector.
constexpr int kNumStats = 22;
struct EngineStats {
  int64_t values[kNumStats] = {0};
};
extern const char* const kStatNames[kNumStats];

// What an Operation may touch while the progress thread drives it. Everything here is used by the progress
// thread only (no locking), except the atomic counters.
class EngineContext {
 public:
  MPI_Comm comm = MPI_COMM_NULL;  // the engine's own communicator (dup of MPI_COMM_WORLD)
  int rank = -1;
  int size = 0;
  double default_timeout = 120.0;
  Backend* backend = nullptr;
  EngineCounters* counters = nullptr;

  // ---- P-Reduce session state (withdrawal protocol, see preduce.h) ----
  uint64_t session = 0;
  std::set<int> done;      // ranks that withdrew in this session
  bool withdrawn = false;  // this rank withdrew in this session
  ControlPlane control;    // the mailbox and this rank's availability (control.h)
  PartialCollectives partial;  // persistent partial-allreduce schedules (partial.h)
  HopQueues hop;               // Hop's update and token queues (hop.h)
  std::map<uint64_t, int64_t> implicit_seq;  // per-group call counters: implicit instance keys
  int64_t async_allreduce_seq = 0;           // AsyncAllreduceOp calls started on this rank (allreduce_op.h)
  int failing_peer = -1;  // a peer announced it is ending with an uncaught exception (kKindFailing)

  // ---- failure: after a timeout, stale control messages may be in flight, so every later op fails fast ----
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  void Fail(const std::string& why) {
    if (failure_.empty()) failure_ = why;
    if (counters) counters->failed = true;
  }

  // An op calls this whenever its state advanced; the progress loop backs off only when nobody did.
  void MarkProgress() { progressed_ = true; }
  // An op in a bandwidth phase (a collective that MPI only advances inside MPI_Test) asks for tight polling.
  void MarkBusy() { busy_ = true; }

  // Send requests an op no longer waits for (e.g. a header to a rank that withdrew and will only receive it, as a
  // stale message, after the next rejoin). The engine keeps `keepalive` (the send buffer) until they complete.
  void AdoptSends(std::vector<MPI_Request> reqs, std::shared_ptr<void> keepalive);
  // Keeps `keepalive` alive forever: for a collective that timed out and can no longer be cancelled, whose buffer
  // MPI may still write.
  void Abandon(std::shared_ptr<void> keepalive) { abandoned_.push_back(std::move(keepalive)); }

 private:
  friend class Engine;
  struct Orphan {
    std::vector<MPI_Request> reqs;
    std::shared_ptr<void> keepalive;
  };
  void PollOrphans();
  void FreeOrphans();  // MPI_Request_free on what is left (shutdown)
  std::string failure_;
  bool progressed_ = false;
  bool busy_ = false;
  std::vector<Orphan> orphans_;
  std::vector<std::shared_ptr<void>> abandoned_;
};

// A request driven by the progress thread. Subclasses: PReduceOp, WithdrawOp, RejoinOp (preduce.h),
// PartialAllreduceOp (partial_op.h), the Hop ops (hop_op.h), AsyncAllreduceOp (allreduce_op.h); new ones plug in
// the same way -- see docs/engine.md.
class Operation {
 public:
  using Callback = std::function<void(const Status&)>;
  explicit Operation(Callback cb) : callback_(std::move(cb)) {}
  virtual ~Operation() = default;

  virtual const char* Name() const = 0;
  // Serial ops (the P-Reduce family) run one at a time per process, in enqueue order, so that their per-peer
  // message order is the same everywhere. Non-serial ops start as soon as they are enqueued.
  virtual bool Serial() const { return false; }
  // Called once on the progress thread when the op becomes active. Post non-blocking MPI here.
  virtual void Start(EngineContext& ctx) = 0;
  // Called repeatedly on the progress thread; must not block. Returns true when finished (status() is final).
  virtual bool Progress(EngineContext& ctx) = 0;

  const Status& status() const { return status_; }
  // Engine-internal: runs the completion callback exactly once.
  void Complete() {
    if (callback_) {
      Callback cb = std::move(callback_);
      callback_ = nullptr;
      cb(status_);
    }
  }

 protected:
  // Records the final status; Progress() should then return true.
  void Finish(Status s) {
    status_ = std::move(s);
    finished_ = true;
  }
  bool finished() const { return finished_; }

 private:
  friend class Engine;  // aborts pending ops at shutdown
  Callback callback_;
  Status status_;
  bool finished_ = false;
};

class Engine {
 public:
  static Engine& Get();  // process-wide singleton (never destroyed: a static destructor must not join threads)

  // Collective over MPI_COMM_WORLD. Idempotent while running. timeout_seconds <= 0 and cache_size < 0 mean
  // "default" (120 s; env HETSYNC_COMM_CACHE_SIZE or 64).
  Status Start(double timeout_seconds, int cache_size);
  // Collective (best effort: each of its two barriers gives up after 10 s). With drain=false only the local
  // thread is stopped (used at process exit, where a peer may already be gone). Idempotent.
  Status Shutdown(bool drain = true);
  // This process is ending with an uncaught exception: stops the progress thread, tells every peer's engine to
  // stop calling MPI (kKindFailing) and waits up to `wait_seconds` for their answers.  Why: this process's exit
  // shuts its Horovod down, and then every rank's Horovod finalizes MPI on its own thread (Horovod started MPI);
  // a peer's engine still inside an MPI call at that moment would crash.  Idempotent.
  Status Abort(double wait_seconds);
  // Hands `op` to the progress thread; its callback runs later on that thread. Fails (without running the
  // callback) if the engine is not running.
  Status Enqueue(std::shared_ptr<Operation> op);
  // Run by MPI_Finalize itself, before it tears anything down (an attribute of MPI_COMM_SELF: MPI deletes those
  // first).  From here on no section of the engine's MPI calls begins, and the section now running (if any) ends
  // before this returns (bounded by kFinalizeWaitSeconds).  Why: Horovod finalizes MPI on its own thread when a
  // peer exits, and Open MPI aborts a process that makes any MPI call after MPI_Finalize -- checking
  // MPI_Finalized before each call leaves a window between the check and the call.
  void BeforeMpiFinalize();

  bool running() const { return running_; }
  bool away() const { return counters_.away.load() != 0; }
  int rank() const { return ctx_.rank; }
  int size() const { return ctx_.size; }
  EngineStats Stats() const;

  // World rank/size and MPI thread level; works before Start (needs MPI initialised).
  static Status Info(int* rank, int* size, int* thread_level);

 private:
  Engine() = default;
  void Loop();
  void Drain();
  void TellPeersAndWait(double wait_seconds);  // Abort's kKindFailing round
  Status StopThread(const char* what);         // Shutdown's and Abort's first step (start_mu_ held)

  mutable std::mutex start_mu_;  // serialises Start/Shutdown/Stats
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Held around each section of MPI calls (a progress-loop iteration, Drain, the failing notice): the finalize
  // hook takes it, so no section straddles MPI_Finalize.  Order: mu_ is never held while taking it.
  std::timed_mutex mpi_mu_;
  std::atomic<bool> finalizing_{false};  // MPI_Finalize has begun: long MPI waits give up, no new section starts
  bool MpiUsable() const;                // with mpi_mu_ held: neither finalizing nor finalized
  int section_pause_ms_ = 0;             // HETSYNC_ENGINE_TEST_PAUSE_MS (tests): a pause inside each loop section
  bool stop_ = false;
  bool mpi_gone_ = false;  // MPI was finalized under the progress thread (Horovod shut down after an error)
  int halted_by_ = -1;     // the peer whose kKindFailing stopped the progress thread (no MPI call since)
  std::deque<std::shared_ptr<Operation>> queue_;  // guarded by mu_
  EngineContext ctx_;
  EngineCounters counters_;
  std::unique_ptr<Backend> backend_;
  BackendStats last_backend_stats_;
  // Buffers MPI may still write to (abandoned collectives), kept across restarts: never freed.
  std::vector<std::shared_ptr<void>> graveyard_;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_ENGINE_H_
