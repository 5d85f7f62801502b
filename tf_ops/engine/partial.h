// Partial allreduce: eager-SGD's solo and majority collectives (eager-SGD §4.1-§4.3, semantics of §5.1).
//
// A *persistent schedule* (one per collective name) serves an unbounded sequence of rounds r = 0, 1, 2, ...
// Round r runs once (its operations are consumable) and always over ALL ranks:
//   1. activation: the initiator -- any rank that calls (solo), or only the rank a seeded RNG designates for round r
//      (majority, §4.2) -- sends ACTIVATE(r) along a recursive-doubling broadcast (a union of binomial trees, one
//      per possible root, §4.1). A rank that receives it on dimension d forwards it on every dimension above d it
//      has not sent on yet; a rank that calls forwards on every dimension. Ranks missing from a non-power-of-two
//      world are emulated by the rank that would have sent to them, so every rank is reached.
//   2. data: as soon as a rank is activated its progress thread runs a recursive-doubling allreduce of its *send
//      buffer* (§4.3, passive participation): the gradients its Python thread deposited and that no earlier round
//      took yet (stale ones), or nothing. Each rank's data travels with a per-rank flag, so the result is the sum
//      of the contributions that were there and the list of contributors (NAP, "accepted" bits of §5.1).
//   3. the result goes to the schedule's receive buffer; a rank that calls late finds it there (Fig 7).
//
// Calls (PartialAllreduceOp) deposit their tensors into the send buffer and then:
//   - a round finished since this rank's last call: return its result at once; the deposit waits for the next
//     round (not included now);
//   - a round is running its data phase with the old buffer: wait for it, then the same;
//   - otherwise: activate (solo), or wait for the designated initiator (majority); the next round includes the
//     deposit (included = true).
// Majority and the rule "no rank waits on a rank that is not coming": a waiting rank tells the designated initiator
// (ARRIVE); if that rank is away (control.h: between steps for longer than away_after, at an epoch end, inside a
// Horovod collective, idle or withdrawn), its progress thread activates the round on its behalf.
//
// Failures: every rank's data comes from its progress thread, so only a rank whose engine is gone (dead, or shut
// down) can stall a round. The rank that waits earliest in the round's exchange for a partner (steps wait a
// second longer each) reports it to every rank (ABORT) when its timeout passes, so every rank names the same rank.
// Members calling the same name with different dtype/size/shapes: every rank gets the same INVALID_ARGUMENT.
// See docs/engine.md, "Partial collectives".
#ifndef HETSYNC_ENGINE_PARTIAL_H_
#define HETSYNC_ENGINE_PARTIAL_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/common.h"

namespace hetsync {

class EngineContext;

constexpr int kActivationTag = 0x4854;     // ACTIVATE / ARRIVE / ABORT notices of every schedule
constexpr int kPartialDataTagBase = 0x5000;  // + (schedule id % kPartialDataTags): the data exchange
constexpr int kPartialDataTags = 4096;
constexpr uint32_t kActivationMagic = 0x48535041;  // "HSPA"
constexpr int kPartialNameChars = 64;
constexpr int kPartialDescChars = 192;

// kAll: a round runs once every rank has called or is away (rank 0's engine coordinates; away ranks take part
// passively, as in every mode). ESync's aggregation and OD-SGD's overlapped allreduce build on it.
enum class PartialMode : int32_t { kSolo = 0, kMajority = 1, kAll = 2 };
const char* PartialModeName(PartialMode m);

// What every rank must agree on for one collective name.
struct PartialSpec {
  std::string name;
  PartialMode mode = PartialMode::kSolo;
  uint64_t seed = 0;
  DataType dtype = DataType::kFloat32;  // of the tensors and of the send/receive buffers
  bool wire_half = false;               // float32 data travels and is summed as IEEE half (Horovod fp16 compression)
  // Late calls: false -- the latest round's result, divided by its contributors (the paper, §5 and §5.1);
  // true -- the sum of every round since this rank's previous call, each divided by the world size, so every
  // rank applies every contribution exactly once with weight 1/P (see docs/engine.md, "Late rounds").
  bool accumulate = false;
  int64_t count = 0;
  uint64_t shape_hash = 0;
  std::string desc;  // "float32 x 10 [(2, 5)] (solo)"
  double timeout = 0;  // not part of the agreement: a round runs with its initiator's (the notice carries it)
  bool operator==(const PartialSpec& o) const {
    return mode == o.mode && seed == o.seed && dtype == o.dtype && wire_half == o.wire_half &&
           accumulate == o.accumulate && count == o.count && shape_hash == o.shape_hash;
  }
};

// The rank majority mode designates to initiate `round` (§4.2): the same on every rank, from the shared seed.
// splitmix64(seed ^ fnv1a(name) ^ round * golden) % size; hetsync/ops.py reproduces it (majority_initiator).
int MajorityInitiator(uint64_t seed, const std::string& name, int64_t round, int size);

// A round's outcome as one call sees it.
struct PartialResult {
  bool included = false;    // this call's tensors are in the sum
  int nap = 0;              // number of ranks whose contribution is in the sum (the average divides by it)
  int active = 0;           // of those, ranks whose call was waiting for this round (§6.1's "active processes")
  int64_t round = -1;
  int initiator = -1;       // the rank that started the round (the first activation this rank received; majority:
                            // only the designated rank activates, so a test can check it against the seeded RNG)
  int64_t staleness = -1;   // included: rounds the oldest part of the contribution waited (0 = fresh)
  int64_t rounds = 1;       // rounds in the returned tensors (accumulate: every round since the previous call)
  std::vector<uint8_t> contributors;  // per rank: 0 none, 1 passive (stale data, no call waiting), 2 active
};

// Fixed-size notice on kActivationTag (raw bytes: homogeneous cluster, as WireHeader).
struct PartialNotice {
  uint32_t magic;
  uint32_t kind;  // kNoticeActivate, kNoticeArrive, kNoticeAbort
  uint64_t id;    // fnv1a(name)
  int64_t round;
  int32_t dim;     // ACTIVATE: the broadcast dimension it travelled on
  int32_t root;    // ACTIVATE: the initiator; ABORT: the rank that stalled the round
  int32_t sender;
  int32_t mode;
  uint64_t seed;
  int32_t dtype;
  int32_t wire_half;
  int32_t accumulate;
  int32_t reserved;
  double timeout;
  int64_t count;
  uint64_t shape_hash;
  char name[kPartialNameChars];
  char desc[kPartialDescChars];  // the sender's spec (ACTIVATE/ARRIVE) or the failure (ABORT)
};
constexpr uint32_t kNoticeActivate = 1;
constexpr uint32_t kNoticeArrive = 2;
constexpr uint32_t kNoticeAbort = 3;
constexpr uint32_t kNoticeAway = 4;  // to rank 0 (kAll's coordinator): the sender is away now / back (id 0)
constexpr uint32_t kNoticeBack = 5;
constexpr int kAllCoordinator = 0;

// The sender's spec, as a notice carries it (one place, so no field is forgotten).
PartialSpec SpecFromNotice(const PartialNotice& n);

class PartialSchedule;

// All persistent schedules of this rank; driven by the progress thread (Engine::Loop) whether or not a call waits.
class PartialCollectives {
 public:
  PartialCollectives();
  ~PartialCollectives();
  PartialCollectives(PartialCollectives&&);
  PartialCollectives& operator=(PartialCollectives&&);
  void Start(EngineContext& ctx);
  void Stop(EngineContext& ctx);
  bool Poll(EngineContext& ctx);  // receive notices, drive rounds; true if anything advanced

  // For PartialAllreduceOp (progress thread).
  PartialSchedule* Get(EngineContext& ctx, const PartialSpec& spec, std::string* error);
  PartialSchedule* Find(const std::string& name);  // nullptr if this rank has none by that name

  // Gauges for Engine::Stats (EngineCounters has the partial_* counters).
  int64_t Pending() const;  // activations and arrivals buffered + requests in flight (bounded over rounds)
  int64_t Schedules() const { return static_cast<int64_t>(schedules_.size()); }
  // kAll (rank 0): whether `rank` announced that it is away.
  bool PeerAway(int rank) const { return away_peers_.count(rank) > 0; }

 private:
  void PostReceive(EngineContext& ctx);
  void Handle(EngineContext& ctx, const PartialNotice& n);
  void AnnounceAvailability(EngineContext& ctx);

  MPI_Request req_ = MPI_REQUEST_NULL;
  std::shared_ptr<PartialNotice> inbox_;
  std::map<uint64_t, std::unique_ptr<PartialSchedule>> schedules_;
  std::set<int> away_peers_;     // rank 0: ranks whose last notice was AWAY
  bool announced_away_ = false;  // other ranks: what rank 0 was last told
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_PARTIAL_H_
