// The control plane: every control message a rank receives goes into one mailbox, keyed by the partial-collective
// *instance* it belongs to, and the rank's own availability decides whether it takes part in an instance.
//
// Why: the rule "no rank ever waits on a rank that is not coming". A rank may be computing (it will come), or be
// somewhere it cannot take part from: inside a user's global Horovod collective, between epochs, finished. The
// rank whose presence is in question decides, on its progress thread, once per instance: IN (its own op started
// the instance and sent its header) or OUT (it answers the instance's headers with EXCLUDE). Every member receives
// the same header-or-EXCLUDE from it, so every member computes the same effective group -- no timeouts involved,
// and the answer comes within a progress-loop tick even while the rank's Python thread is blocked elsewhere.
//
// Instances are named by a key (stream, seq): a stream is a sequence of instances each rank runs in increasing
// seq order (the Ripples static schedule's iteration, a Group Generator group id, or per-group call counters for
// plain ops.p_reduce calls). Monotonic seqs let the mailbox recognise late messages without remembering history.
// See docs/engine.md, "Availability and exclusion".
#ifndef HETSYNC_ENGINE_CONTROL_H_
#define HETSYNC_ENGINE_CONTROL_H_

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "engine/common.h"

namespace hetsync {

class EngineContext;

constexpr uint32_t kHeaderMagic = 0x48535932;  // "HSY2"
constexpr int kMaxListedRanks = 64;           // group ranks carried verbatim (for messages); the hash covers all
constexpr int kSignatureChars = 512;          // human-readable shape signature carried verbatim (truncated)

// Fixed-size control message. Sent as MPI_BYTE: hetsync assumes a homogeneous cluster (same endianness/ABI).
struct WireHeader {
  uint32_t magic;
  uint32_t kind;  // kKindPReduce, kKindDone, kKindExclude or kKindFailing
  uint64_t session;
  uint64_t stream;  // instance key, with seq
  int64_t seq;
  int32_t sender;
  int32_t dtype;
  int64_t count;
  uint64_t shape_hash;
  uint64_t group_hash;
  int32_t group_size;
  int32_t group_listed;
  int32_t group[kMaxListedRanks];
  char signature[kSignatureChars];
};
constexpr uint32_t kKindPReduce = 1;  // "I am IN this instance; here is what I contribute"
constexpr uint32_t kKindDone = 2;     // "I withdrew: OUT of every instance I have not started, this session"
constexpr uint32_t kKindExclude = 3;  // "I am OUT of this instance"
constexpr uint32_t kKindFailing = 4;  // "I am ending with an uncaught exception: stop calling MPI" (Engine::Abort)
constexpr int kFailingAckTag = 0x4858;  // a peer's answer to kKindFailing: one int, "my engine stopped calling MPI"

struct InstanceKey {
  uint64_t stream = 0;
  int64_t seq = 0;
  bool operator<(const InstanceKey& o) const { return stream != o.stream ? stream < o.stream : seq < o.seq; }
  bool operator==(const InstanceKey& o) const { return stream == o.stream && seq == o.seq; }
};

// Where this rank's Python thread is, as the Keras integration reports it (hetsync/fit_hook.py):
//   kInStep  -- inside a train step (or a region marked as compute): peers wait for it, it is coming;
//   kBetween -- left its step; counts as away once it has stayed out longer than `away_after` seconds;
//   kAway    -- known to be away (epoch end, finished): OUT at once.
enum class Availability : int { kInStep = 0, kBetween = 1, kAway = 2 };

// Reported availability; written by any thread, read by the progress thread.
struct AvailabilityFlag {
  std::atomic<int> state{static_cast<int>(Availability::kInStep)};
  std::atomic<int64_t> since_ns{0};  // steady-clock time of the last change
  std::atomic<double> away_after{0.2};
  std::atomic<bool> pinned{false};  // idle rank: stays kAway whatever else reports (e.g. an injected delay)
  void Set(Availability a);
  void Pin(bool away);
};
AvailabilityFlag& GlobalAvailability();

class ControlPlane {
 public:
  void Start(EngineContext& ctx);  // posts the persistent receive
  void Stop(EngineContext& ctx);   // cancels it (before the shutdown drain)

  // Progress thread, every loop: receives what arrived, applies availability changes. True if anything happened.
  bool Poll(EngineContext& ctx);

  // ---- used by a P-Reduce (or any op that joins instances) ----
  // Whether this rank already decided OUT of `key`; consumes the decision.
  bool TakeDecidedOut(const InstanceKey& key);
  bool IsLate(const InstanceKey& key) const;  // seq <= the last seq this rank resolved in the stream
  // This rank starts `key` (IN): messages for it are kept even while the rank is away, and every older instance
  // of the stream is late from now on (this rank will never go back to it).
  void Join(EngineContext& ctx, const InstanceKey& key);
  // The message `sender` sent for `key`: 0 none yet, 1 a header (copied into *out), 2 EXCLUDE. Consumes it.
  int Take(const InstanceKey& key, int sender, WireHeader* out);
  // `key` is over on this rank (joined or skipped): later messages for it and for older seqs are late.
  void Resolve(EngineContext& ctx, const InstanceKey& key);
  // OUT of these instances of `stream`, whatever the availability (a coordinator excluded this rank).
  void Exclude(EngineContext& ctx, uint64_t stream, const std::vector<int64_t>& seqs);
  // New session (rejoin): forget every instance; deliver buffered messages of the new session.
  void NewSession(EngineContext& ctx);

  bool away() const { return out_; }

 private:
  void Post(EngineContext& ctx);
  void Deliver(EngineContext& ctx, const WireHeader& h);
  void SendExclude(EngineContext& ctx, const InstanceKey& key, int to);
  void DecideOut(EngineContext& ctx, const InstanceKey& key);
  bool OutNow(const EngineContext& ctx);

  MPI_Request req_ = MPI_REQUEST_NULL;
  std::shared_ptr<WireHeader> inbox_;
  std::map<InstanceKey, std::map<int, WireHeader>> box_;  // pending messages per instance and sender
  std::set<InstanceKey> decided_out_;
  std::map<uint64_t, int64_t> last_resolved_;
  std::vector<WireHeader> future_;  // messages of a newer session, delivered at NewSession
  InstanceKey active_;
  bool has_active_ = false;
  bool out_ = false;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_CONTROL_H_
