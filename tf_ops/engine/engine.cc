#include "engine/engine.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/mpi_backend.h"
#include "engine/mpi_settings.h"

namespace hetsync {

std::string HaltedMessage(int rank);  // why ops fail after a peer's kKindFailing (defined with Engine::Abort)

const char* const kStatNames[kNumStats] = {
    "preduces", "bytes",     "cache_hits",  "cache_misses",  "cache_size",     "uncached_creations", "withdrawals_seen",
    "session",  "withdrawn", "failed",      "away_events",   "self_excluded",  "peers_excluded",     "away",
    "wire_bytes", "partial_rounds", "partial_contributed", "partial_staleness_sum", "partial_included",
    "partial_missed", "partial_pending", "partial_schedules"};

namespace {

constexpr double kDefaultTimeout = 120.0;
constexpr int kDefaultCacheSize = 64;
// How long MPI_Finalize's hook waits for a running section of engine MPI calls.  Sections are short (one
// progress-loop iteration) or give up when finalizing_ is set; the bound only matters if an MPI call blocks.
constexpr auto kFinalizeWait = std::chrono::seconds(10);

// The MPI_COMM_SELF attribute's delete callback: MPI_Finalize runs it before tearing anything down.
int OnMpiFinalize(MPI_Comm, int, void*, void*) {
  Engine::Get().BeforeMpiFinalize();
  return MPI_SUCCESS;
}

// Registers OnMpiFinalize once per process (start_mu_ held).
void WatchMpiFinalize() {
  static bool watching = false;
  if (watching) return;
  int keyval = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &OnMpiFinalize, &keyval, nullptr) != MPI_SUCCESS) return;
  watching = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) == MPI_SUCCESS;
}

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// Waits for `req` up to `seconds`, calling MPI_Test with short sleeps. Returns false on timeout, and at once when
// MPI_Finalize has begun (`finalizing`), so that the hook's wait for the caller's section ends.
bool WaitWithDeadline(MPI_Request* req, double seconds, const std::atomic<bool>& finalizing) {
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    if (finalizing) return false;
    int flag = 0;
    if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

void EngineContext::AdoptSends(std::vector<MPI_Request> reqs, std::shared_ptr<void> keepalive) {
  if (!reqs.empty()) orphans_.push_back(Orphan{std::move(reqs), std::move(keepalive)});
}

void EngineContext::PollOrphans() {
  for (size_t i = 0; i < orphans_.size();) {
    int flag = 0;
    MPI_Testall(static_cast<int>(orphans_[i].reqs.size()), orphans_[i].reqs.data(), &flag, MPI_STATUSES_IGNORE);
    if (flag) {
      orphans_[i] = std::move(orphans_.back());
      orphans_.pop_back();
    } else {
      ++i;
    }
  }
}

void EngineContext::FreeOrphans() {
  // MPI_Request_free on an active send is legal: the send still completes, we just never learn when. Their
  // buffers are leaked with `abandoned_` for the same reason.
  for (auto& o : orphans_) {
    for (auto& r : o.reqs) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    abandoned_.push_back(std::move(o.keepalive));
  }
  orphans_.clear();
}

Engine& Engine::Get() {
  static Engine* engine = new Engine();
  return *engine;
}

Status Engine::Info(int* rank, int* size, int* thread_level) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) {
    return Status::Error(Code::kFailedPrecondition,
                         std::string("MPI is ") + (fin ? "already finalized" : "not initialised") +
                             "; launch with horovodrun/mpirun and call hvd.init() first");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  MPI_Query_thread(thread_level);
  return Status::OK();
}

Status Engine::Start(double timeout_seconds, int cache_size) {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  if (running_) return Status::OK();
  int init = 0, fin = 0, provided = -1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Query_thread(&provided);
  if (!init || fin || provided != MPI_THREAD_MULTIPLE) {
    std::string have = !init ? "MPI not initialised" : fin ? "MPI already finalized" : ThreadLevelName(provided);
    return Status::Error(Code::kFailedPrecondition,
                         "hetsync needs MPI initialised with MPI_THREAD_MULTIPLE (provided: " + have +
                             "); launch with horovodrun/mpirun and call hvd.init() first");
  }
  WatchMpiFinalize();
  {
    // Tests only: a pause inside every progress-loop section of MPI calls, to make the finalize race happen
    // (tests/mpi/finalize_race.py).  Unset: no pause.
    const char* pause = std::getenv("HETSYNC_ENGINE_TEST_PAUSE_MS");
    section_pause_ms_ = pause ? std::max(0, std::atoi(pause)) : 0;
  }
  ApplyMpiSettings();  // MPI is Horovod's by now: the engine's settings go in through MPI_T (mpi_settings.h)
  if (cache_size < 0) {
    const char* env = std::getenv("HETSYNC_COMM_CACHE_SIZE");
    cache_size = env ? std::atoi(env) : kDefaultCacheSize;
    if (cache_size < 0) cache_size = kDefaultCacheSize;
  }
  MPI_Comm comm;
  int err = MPI_Comm_dup(MPI_COMM_WORLD, &comm);  // our own communicator: never match Horovod's messages
  if (err != MPI_SUCCESS) return Status::Error(Code::kInternal, "MPI_Comm_dup failed: " + MpiErrorString(err));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_name(comm, const_cast<char*>("hetsync-engine"));

  // Fresh state: a restart after a failure gets a new communicator, so stale messages of the old one can never
  // match again -- the documented way to recover from a timeout.
  for (auto& p : ctx_.abandoned_) graveyard_.push_back(std::move(p));
  ctx_ = EngineContext();
  ctx_.comm = comm;
  // A started engine begins where a new process does: this rank is coming (an earlier run's AWAY or idle pin
  // would exclude it from the new engine's first exchanges).
  GlobalAvailability().Pin(false);
  GlobalAvailability().Set(Availability::kInStep);
  MPI_Comm_rank(comm, &ctx_.rank);
  MPI_Comm_size(comm, &ctx_.size);
  ctx_.default_timeout = timeout_seconds > 0 ? timeout_seconds : kDefaultTimeout;
  counters_.preduces = 0;
  counters_.bytes = 0;
  counters_.withdrawals_seen = 0;
  counters_.session = 0;
  counters_.withdrawn = false;
  counters_.failed = false;
  counters_.away_events = 0;
  counters_.self_excluded = 0;
  counters_.peers_excluded = 0;
  counters_.away = 0;
  counters_.wire_bytes = 0;
  for (auto* c : {&counters_.partial_rounds, &counters_.partial_contributed, &counters_.partial_staleness_sum,
                  &counters_.partial_included, &counters_.partial_missed, &counters_.partial_pending,
                  &counters_.partial_schedules}) {
    *c = 0;
  }
  ctx_.counters = &counters_;
  backend_ = std::make_unique<MpiBackend>(comm, cache_size);
  ctx_.backend = backend_.get();
  last_backend_stats_ = BackendStats();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    queue_.clear();
  }
  ctx_.control.Start(ctx_);
  ctx_.partial.Start(ctx_);
  ctx_.hop.Start(ctx_);
  thread_ = std::thread([this] {
    // Named, so that top -H and /proc/<pid>/task/*/comm tell the progress thread's CPU from TensorFlow's and
    // Horovod's (docs/engine.md, "What the progress thread costs").
    pthread_setname_np(pthread_self(), "hetsync-engine");
    Loop();
  });
  running_ = true;
  return Status::OK();
}

Status Engine::Enqueue(std::shared_ptr<Operation> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (mpi_gone_) {
      return Status::Error(Code::kAborted, "MPI was finalized: Horovod shut down (an exception on a rank?)");
    }
    if (halted_by_ >= 0) return Status::Error(Code::kAborted, HaltedMessage(halted_by_));
    if (!running_ || stop_) {
      return Status::Error(Code::kFailedPrecondition,
                           "the hetsync engine is not running: call hetsync.init() (after hvd.init()) first");
    }
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
  return Status::OK();
}

void Engine::Loop() {
  std::vector<std::shared_ptr<Operation>> active;
  std::deque<std::shared_ptr<Operation>> serial_waiting;
  bool serial_busy = false;
  int idle_rounds = 0;
  int sleep_us = 0;
  while (true) {
    std::deque<std::shared_ptr<Operation>> incoming;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (active.empty() && serial_waiting.empty() && queue_.empty() && !stop_ && idle_rounds > 16 && !ctx_.busy_) {
        // Idle: sleep until work arrives, but wake every millisecond: the control plane must answer peers'
        // headers (EXCLUDE while this rank is away) even when this rank has nothing of its own to do. With
        // partial-allreduce schedules, every 100 us: an activation is forwarded (and the round's exchange starts)
        // one wake-up after it arrives, and a round's latency is a few such hops.
        const bool fast = ctx_.counters->partial_schedules > 0 || ctx_.hop.Sets() > 0;
        auto nap = std::chrono::microseconds(fast ? 100 : 1000);
        cv_.wait_for(lock, nap, [this] { return stop_ || !queue_.empty(); });
      }
      if (stop_) break;
      incoming.swap(queue_);
    }
    // Horovod finalizes MPI on its own thread when it shuts down (after an error on any rank, or when a peer
    // exits); from then on no MPI call may be made.  This iteration's MPI calls run under mpi_mu_, which the
    // finalize hook takes: either the whole iteration runs before MPI_Finalize proceeds, or none of it does.
    std::unique_lock<std::timed_mutex> mpi(mpi_mu_);
    if (!MpiUsable()) {
      std::lock_guard<std::mutex> lock(mu_);
      mpi_gone_ = true;
      for (auto& op : incoming) serial_waiting.push_back(std::move(op));
      break;
    }
    if (section_pause_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(section_pause_ms_));
    ctx_.progressed_ = false;
    ctx_.busy_ = false;
    if (ctx_.control.Poll(ctx_)) ctx_.MarkProgress();
    if (ctx_.failing_peer >= 0) {  // a peer is ending: no MPI call from here on (Engine::Abort)
      std::lock_guard<std::mutex> lock(mu_);
      halted_by_ = ctx_.failing_peer;
      for (auto& op : incoming) serial_waiting.push_back(std::move(op));
      break;
    }
    if (ctx_.partial.Poll(ctx_)) ctx_.MarkProgress();  // rounds run here whether or not this rank called
    if (ctx_.hop.Poll(ctx_)) ctx_.MarkProgress();      // Hop updates and tokens arrive while the worker computes
    for (auto& op : incoming) {
      if (op->Serial()) {
        serial_waiting.push_back(std::move(op));
      } else {
        op->Start(ctx_);
        active.push_back(std::move(op));
      }
    }
    if (!serial_busy && !serial_waiting.empty()) {
      auto op = std::move(serial_waiting.front());
      serial_waiting.pop_front();
      serial_busy = true;
      op->Start(ctx_);
      active.push_back(std::move(op));
      ctx_.MarkProgress();
    }
    std::vector<std::shared_ptr<Operation>> finished;
    for (size_t i = 0; i < active.size();) {
      if (active[i]->Progress(ctx_)) {
        if (active[i]->Serial()) serial_busy = false;
        finished.push_back(std::move(active[i]));
        active.erase(active.begin() + i);
      } else {
        ++i;
      }
    }
    if (!ctx_.orphans_.empty()) ctx_.PollOrphans();
    mpi.unlock();  // callbacks run TF continuations: no MPI of ours, and they must not hold up MPI_Finalize
    for (auto& op : finished) op->Complete();

    // Back-off: with 8 ranks oversubscribed on 2 cores a spinning progress thread would steal the CPU the user's
    // step (and MPI's shared-memory peers) need. Yield first, then sleep 1, 2, 4 ... 200 us. While a data-phase
    // collective is in flight (MarkBusy) only yield: Open MPI's non-blocking collectives advance only inside
    // MPI_Test, and measured on 4 ranks / 2 cores a 20 us sleep between tests made a 10 MB MPI_Iallreduce ~3x
    // slower than a blocking MPI_Allreduce (which itself spins with sched_yield under mpi_yield_when_idle).
    if (!finished.empty() || ctx_.progressed_) {
      idle_rounds = 0;
      sleep_us = 0;
    } else if (ctx_.busy_ || ++idle_rounds <= 16) {
      std::this_thread::yield();
    } else {
      sleep_us = sleep_us == 0 ? 1 : std::min(sleep_us * 2, 200);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }
  // Stopping: fail whatever is still queued or running (ops in flight are abandoned, their buffers leaked).
  Status aborted = Status::Error(Code::kAborted, "the hetsync engine was shut down while this operation was pending");
  std::deque<std::shared_ptr<Operation>> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(queue_);
  }
  if (mpi_gone_) {
    aborted = Status::Error(Code::kAborted, "MPI was finalized while this operation was pending: Horovod shut "
                                            "down (an exception on a rank?)");
  }
  if (halted_by_ >= 0) aborted = Status::Error(Code::kAborted, HaltedMessage(halted_by_));
  {
    std::unique_lock<std::timed_mutex> mpi(mpi_mu_);
    if (!mpi_gone_ && halted_by_ < 0 && MpiUsable()) {
      for (auto& op : active) ctx_.Abandon(op);  // cancels MPI requests: not after MPI_Finalize
    }
  }
  for (auto& op : active) {
    op->Finish(aborted);
    op->Complete();
  }
  for (auto* q : {&serial_waiting, &rest}) {
    for (auto& op : *q) {
      op->Finish(aborted);
      op->Complete();
    }
  }
}

void Engine::Drain() {
  // Best effort, two barriers, each bounded by the engine's default timeout (ranks can reach shutdown many seconds
  // apart on a loaded machine). Every rank enters the first after its own progress thread stopped, so after it no
  // new control message is sent on this communicator: receive and drop whatever is left (headers to ranks that
  // never arrived, DONE notices nobody waited for), free the cached communicators, then the second barrier. That
  // is our last MPI call: Horovod's shutdown is coordinated, so once any rank exits, every rank's Horovod thread
  // calls MPI_Finalize soon after, and no rank may still be inside an MPI call of ours by then. After a timed-out
  // barrier nothing more is done (a later barrier would pair with the wrong one on the other ranks). The engine
  // communicator itself is left to MPI_Finalize.
  const double deadline = ctx_.default_timeout;
  MPI_Request req;
  if (MPI_Ibarrier(ctx_.comm, &req) != MPI_SUCCESS || !WaitWithDeadline(&req, deadline, finalizing_)) return;
  std::vector<char> sink(64 * 1024);
  int empty_probes = 0;
  while (empty_probes < 20) {
    if (finalizing_) return;
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, ctx_.comm, &flag, &st);
    if (!flag) {
      ++empty_probes;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      continue;
    }
    empty_probes = 0;
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    if (bytes > static_cast<int>(sink.size())) sink.resize(bytes);
    MPI_Recv(sink.data(), bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, ctx_.comm, MPI_STATUS_IGNORE);
  }
  if (finalizing_) return;
  ctx_.PollOrphans();
  ctx_.FreeOrphans();
  backend_->Shutdown();
  if (finalizing_) return;
  if (MPI_Ibarrier(ctx_.comm, &req) == MPI_SUCCESS) WaitWithDeadline(&req, deadline, finalizing_);
}

Status Engine::StopThread(const char* what) {
  if (std::this_thread::get_id() == thread_.get_id()) {  // e.g. a TF continuation run inline by a callback
    return Status::Error(Code::kFailedPrecondition, std::string("engine ") + what +
                                                        " cannot run on the engine's own thread");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  running_ = false;
  return Status::OK();
}

Status Engine::Shutdown(bool drain) {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  if (!running_) return Status::OK();
  Status stopped = StopThread("shutdown");
  if (!stopped.ok) return stopped;
  std::unique_lock<std::timed_mutex> mpi(mpi_mu_);  // one section: MPI_Finalize's hook waits for it to end
  const bool usable = halted_by_ < 0 && MpiUsable();
  if (usable) {
    ctx_.control.Stop(ctx_);
    ctx_.partial.Stop(ctx_);
    ctx_.hop.Stop(ctx_);
  }
  last_backend_stats_ = backend_->Stats();
  if (!usable || !MpiUsable()) {
    // Too late for any MPI call (or a failing peer asked for none); leak everything.
    backend_.release();  // NOLINT: intentionally leaked
    return Status::OK();
  }
  if (drain) {
    Drain();
    backend_.reset();
  } else {
    // Without drain (at exit) make no collective call: communicators are left to MPI_Finalize.
    ctx_.FreeOrphans();
    backend_.release();  // NOLINT: intentionally leaked, its destructor would free communicators
  }
  ctx_.backend = nullptr;
  return Status::OK();
}

Status Engine::Abort(double wait_seconds) {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  if (!running_) return Status::OK();
  Status stopped = StopThread("abort");
  if (!stopped.ok) return stopped;
  {
    std::unique_lock<std::timed_mutex> mpi(mpi_mu_);  // one section: MPI_Finalize's hook waits for it to end
    if (halted_by_ < 0 && MpiUsable()) TellPeersAndWait(wait_seconds);
  }
  backend_.release();  // NOLINT: intentionally leaked (no collective call from a failing process)
  ctx_.backend = nullptr;
  return Status::OK();
}

void Engine::TellPeersAndWait(double wait_seconds) {
  // One small notice per peer, then wait for each peer's answer ("my engine stopped calling MPI") up to
  // `wait_seconds`.  A peer that answered may exit at once, and its exit shuts this process's Horovod down, which
  // begins MPI_Finalize here: its hook sets finalizing_ and waits for mpi_mu_ (held by the caller), so the wait
  // ends at the next test.  Buffers and requests are leaked on purpose: the process is ending.
  auto* msg = new WireHeader();
  std::memset(msg, 0, sizeof(WireHeader));
  msg->magic = kHeaderMagic;
  msg->kind = kKindFailing;
  msg->session = ctx_.session;
  msg->sender = ctx_.rank;
  auto* answers = new std::vector<int>(ctx_.size, 0);
  std::vector<MPI_Request> recvs;
  for (int r = 0; r < ctx_.size; ++r) {
    if (r == ctx_.rank) continue;
    MPI_Request send;
    MPI_Isend(msg, sizeof(WireHeader), MPI_BYTE, r, kHeaderTag, ctx_.comm, &send);
    recvs.emplace_back();
    MPI_Irecv(&(*answers)[r], 1, MPI_INT, r, kFailingAckTag, ctx_.comm, &recvs.back());
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(wait_seconds);
  while (Clock::now() < deadline) {
    int all = 0;
    if (finalizing_) return;
    if (MPI_Testall(static_cast<int>(recvs.size()), recvs.data(), &all, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return;
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Engine::BeforeMpiFinalize() {
  finalizing_ = true;  // sections check it: a running one ends at its next check, none begins
  std::unique_lock<std::timed_mutex> wait(mpi_mu_, std::defer_lock);
  (void)wait.try_lock_for(kFinalizeWait);  // false only if one MPI call blocked that long: finalize goes on
}

bool Engine::MpiUsable() const {
  if (finalizing_) return false;
  int finalized = 0;
  MPI_Finalized(&finalized);  // MPI_Finalize may have run before the hook was registered (no engine then)
  return !finalized;
}

std::string HaltedMessage(int rank) {
  return "rank " + std::to_string(rank) + " is ending with an uncaught exception (its traceback names it): this "
         "rank's hetsync engine stopped so that Horovod can shut down";
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  EngineStats s;
  BackendStats b = running_ && backend_ ? backend_->Stats() : last_backend_stats_;
  s.values[0] = counters_.preduces;
  s.values[1] = counters_.bytes;
  s.values[2] = b.cache_hits;
  s.values[3] = b.cache_misses;
  s.values[4] = b.cache_size;
  s.values[5] = b.uncached_creations;
  s.values[6] = counters_.withdrawals_seen;
  s.values[7] = counters_.session;
  s.values[8] = counters_.withdrawn ? 1 : 0;
  s.values[9] = counters_.failed ? 1 : 0;
  s.values[10] = counters_.away_events;
  s.values[11] = counters_.self_excluded;
  s.values[12] = counters_.peers_excluded;
  s.values[13] = counters_.away;
  s.values[14] = counters_.wire_bytes;
  s.values[15] = counters_.partial_rounds;
  s.values[16] = counters_.partial_contributed;
  s.values[17] = counters_.partial_staleness_sum;
  s.values[18] = counters_.partial_included;
  s.values[19] = counters_.partial_missed;
  s.values[20] = counters_.partial_pending;
  s.values[21] = counters_.partial_schedules;
  return s;
}

}  // namespace hetsync

// C entry points for the Python control plane (hetsync/ops.py loads this library with ctypes as well): reporting
// where the Python thread is must cost nothing, so it is two atomic stores, no TF op and no queue.
extern "C" {
// From Python (ctypes) when this process is ending with an uncaught exception (hetsync/_runtime.py).
void hetsync_engine_abort(double wait_seconds) { hetsync::Engine::Get().Abort(wait_seconds); }

void hetsync_set_availability(int state) {
  hetsync::GlobalAvailability().Set(static_cast<hetsync::Availability>(state));
}
void hetsync_pin_away(int away) { hetsync::GlobalAvailability().Pin(away != 0); }
int hetsync_get_availability() { return hetsync::GlobalAvailability().state.load(); }
void hetsync_set_away_after(double seconds) { hetsync::GlobalAvailability().away_after = seconds; }
int hetsync_engine_away() { return hetsync::Engine::Get().away() ? 1 : 0; }
}
