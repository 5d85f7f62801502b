// Hop's update and token queues over MPI (Hop §4.1, §4.2, §6.1, §6.2): the engine side of sync="hop".
//
// A *queue set* (one per name, e.g. one per wrapped optimizer) holds this worker's HopState (hop_state.h: rotating
// update queues, token counts, the receive rules). All of its traffic is point-to-point on the engine communicator,
// tag kHopTag, one message kind per HopWire.kind:
//   UPDATE  [HopWire | parameters]: an enqueue into an out-neighbour's update queue (§4.1). The parameters travel
//           fused in one buffer (as P-Reduce's), sent by the progress thread while the worker computes.
//   TOKEN   n tokens for the receiver, which is an in-neighbour of the sender (§4.2 "insert token"); it carries the
//           sender's new iteration, which is how a worker knows its out-neighbours' iterations (§6.2 (b): we
//           piggyback it on tokens rather than asking).
//   AWAY / BACK  this worker's availability (control.h) changed: neighbours stop waiting for it while it is away.
// One tag and MPI's non-overtaking rule keep each sender's messages in order, which the receive rules rely on.
//
// The rule "no rank waits on a rank that is not coming" (docs/engine.md): a neighbour is *absent* while it has
// withdrawn in this session (its DONE, ctx.done) or announced AWAY. Absent in-neighbours are not waited for, tokens
// are taken from absent out-neighbours on credit (hop_state.h). Every session (rejoin, after a global consensus
// average that gave every worker the same model) starts each queue set afresh at iteration 0 with max_ig tokens;
// messages carry the session, older ones are dropped, newer ones kept until this rank rejoins.
#ifndef HETSYNC_ENGINE_HOP_H_
#define HETSYNC_ENGINE_HOP_H_

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/common.h"
#include "engine/hop_state.h"

namespace hetsync {

class EngineContext;

constexpr int kHopTag = 0x4856;
constexpr uint32_t kHopMagic = 0x48534F50;  // "HSOP"
constexpr uint32_t kHopUpdate = 1, kHopToken = 2, kHopAway = 3, kHopBack = 4;

// Fixed-size head of every Hop message (raw bytes: homogeneous cluster, as WireHeader).
struct HopWire {
  uint32_t magic;
  uint32_t kind;
  uint64_t id;  // fnv1a(queue set name); 0 for AWAY/BACK (they concern every set)
  uint64_t session;
  int64_t iter;   // UPDATE: the iteration the parameters belong to; TOKEN: the sender's new iteration
  int64_t n;      // TOKEN: tokens granted
  int64_t count;  // UPDATE: elements that follow
  int32_t sender;
  int32_t wire_half;  // UPDATE: the elements are IEEE half (Horovod fp16 compression), else float32
};

// A queue set: its configuration, state and gauges.
struct HopSet {
  std::string name;
  HopConfig cfg;
  bool wire_half = false;
  int64_t count = -1;  // elements per update (fixed by this rank's first send; Recv checks the updates' sizes)
  HopState state{HopConfig()};
  int64_t sends = 0, sends_skipped = 0;  // updates sent / not sent because the receiver was past (§6.2 (b))
  int64_t max_queue = 0;                 // largest QueueSize() seen (§4.2's bound)
  int64_t before[4] = {0, 0, 0, 0};      // dropped, skips, skipped iterations, used: of earlier sessions
  std::vector<int64_t> history;          // (iteration, steady-clock ns) of each entry into an iteration
  std::string failure;                   // e.g. a neighbour sent updates of another size
};

class HopQueues {
 public:
  void Start(EngineContext& ctx);
  void Stop(EngineContext& ctx);
  bool Poll(EngineContext& ctx);  // receive, follow sessions and availability; true if anything happened

  // Creates (or, with another configuration, replaces) the set `name`. Messages that arrived before are replayed.
  std::string Configure(EngineContext& ctx, const std::string& name, const HopConfig& cfg, bool wire_half);
  HopSet* Get(uint64_t id);
  // UPDATE of `data` (count elements, float32 or half as configured) to every out-neighbour that is not past this
  // worker's iteration; once per iteration (later calls in the same iteration send nothing). Returns sends made.
  int SendUpdate(EngineContext& ctx, uint64_t id, std::shared_ptr<std::vector<char>> msg);
  void SendTokens(EngineContext& ctx, HopSet& set, int64_t n);
  void RecordEntry(HopSet& set);

  int64_t Sets() const { return static_cast<int64_t>(sets_.size()); }

 private:
  struct InFlight {
    MPI_Request req;
    std::shared_ptr<std::vector<char>> buf;
  };
  void Receive(EngineContext& ctx);
  void Handle(EngineContext& ctx, std::shared_ptr<std::vector<char>> msg);
  void Apply(EngineContext& ctx, HopSet& set, std::shared_ptr<std::vector<char>> msg);
  void NewSession(EngineContext& ctx);
  void FollowAbsence(EngineContext& ctx);
  void Announce(EngineContext& ctx, bool away);

  std::vector<InFlight> inflight_;
  std::map<uint64_t, HopSet> sets_;
  std::map<uint64_t, std::vector<std::shared_ptr<std::vector<char>>>> unclaimed_;  // for sets not configured yet
  std::vector<std::shared_ptr<std::vector<char>>> future_;                        // of a later session
  std::set<int> away_peers_;
  uint64_t session_ = 0;
  bool announced_away_ = false;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_HOP_H_
