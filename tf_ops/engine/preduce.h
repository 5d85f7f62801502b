// P-Reduce: partial all-reduce (average) over a group of ranks, Ripples §3.2 / §6.1, plus the withdrawal and
// session operations that let ranks stop at different steps.
//
// Protocol (one P-Reduce at a time per process, in enqueue order -- Operation::Serial). Every P-Reduce is an
// *instance* with a key (stream, seq) that all members agree on (control.h):
//   1. group of size 1, or an instance this rank already decided OUT of: identity.
//   2. header exchange on the engine communicator, tag kHeaderTag: MPI_Isend our WireHeader to each other member;
//      each member's reply for this key arrives in the control plane's mailbox: its header (IN), EXCLUDE (OUT:
//      away, withdrawn, or a coordinator excluded it), or its DONE (withdrew this session).
//   3. all headers must agree on requested group, dtype, count and shape hash, else INVALID_ARGUMENT everywhere.
//   4. in-place SUM over the effective group (members that sent a header) through the Backend (cached
//      communicator). The caller divides by the effective size while copying the result out (one pass).
#ifndef HETSYNC_ENGINE_PREDUCE_H_
#define HETSYNC_ENGINE_PREDUCE_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace hetsync {

class PReduceOp : public Operation {
 public:
  // `group` in any order (validated with ValidateGroup). `data` holds count elements of dtype: the caller fills it
  // before Enqueue and finds the average there when the callback runs. `keepalive` owns that memory (for the TF
  // kernel: a reference to the output or fused tensor); the op keeps it so that an abandoned (timed-out)
  // collective can keep the memory alive while MPI may still write to it. timeout_seconds <= 0: engine default.
  // `stream` 0 means "implicit": the key is (hash of the group, n-th P-Reduce of this group on this rank).
  // `effective` (may be null) receives the effective group size: the caller divides the sum by it.
  PReduceOp(std::vector<int> group, DataType dtype, int64_t count, std::string shape_signature,
            double timeout_seconds, void* data, std::shared_ptr<void> keepalive, Callback cb,
            uint64_t stream = 0, int64_t seq = 0, std::shared_ptr<int> effective = nullptr);
  ~PReduceOp() override;

  const char* Name() const override { return "P-Reduce"; }
  bool Serial() const override { return true; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  bool Identity(EngineContext& ctx);
  bool Done(EngineContext& ctx, Status s);
  bool ProgressHeaders(EngineContext& ctx);
  bool CheckHeadersAndStartData(EngineContext& ctx);
  bool ProgressData(EngineContext& ctx);
  void ReleaseSends(EngineContext& ctx);
  bool Fail(Status s) {
    Finish(std::move(s));
    return true;
  }

  std::vector<int> group_;  // sorted requested group
  DataType dtype_;
  int64_t count_;
  std::string signature_;
  double timeout_;
  void* data_;
  std::shared_ptr<void> keepalive_;
  InstanceKey key_;
  std::shared_ptr<int> effective_size_;

  enum class Phase { kHeaders, kData } phase_ = Phase::kHeaders;
  Clock::time_point deadline_;
  std::shared_ptr<WireHeader> mine_;   // shared: outlives the op while sends are in flight
  std::vector<int> peers_;             // members whose header we wait for
  std::vector<WireHeader> received_;   // one per peer
  std::vector<MPI_Request> send_reqs_;
  std::vector<char> got_;              // per peer: 0 waiting, 1 header, 2 DONE
  std::vector<int> effective_;         // reduced group (requested minus withdrawn)
  std::unique_ptr<PendingCollective> pending_;
};

// Withdraw(): tell every other rank that this rank does no more P-Reduces in this session.
class WithdrawOp : public Operation {
 public:
  using Operation::Operation;
  const char* Name() const override { return "Withdraw"; }
  bool Serial() const override { return true; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }
};

// Rejoin(): collective over all ranks (after a global consensus step): new session, done-set cleared.
class RejoinOp : public Operation {
 public:
  using Operation::Operation;
  const char* Name() const override { return "Rejoin"; }
  bool Serial() const override { return true; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }
};

// Exclude(stream, seqs): this rank is OUT of these instances whatever its availability (a coordinator, e.g. the
// Group Generator, took it out of groups it had not received yet). Not serial: it must not queue behind a
// P-Reduce that may itself be waiting on a peer of one of these instances.
class ExcludeOp : public Operation {
 public:
  ExcludeOp(uint64_t stream, std::vector<int64_t> seqs, Callback cb)
      : Operation(std::move(cb)), stream_(stream), seqs_(std::move(seqs)) {}
  const char* Name() const override { return "Exclude"; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext&) override { return true; }

 private:
  uint64_t stream_;
  std::vector<int64_t> seqs_;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_PREDUCE_H_
