// P-Reduce: partial all-reduce (average) over a group of ranks, Ripples §3.2 / §6.1, plus the withdrawal and
// session operations that let ranks stop at different steps.
//
// Protocol (one P-Reduce at a time per process, in enqueue order -- Operation::Serial):
//   1. group of size 1: identity.
//   2. header exchange on the engine communicator, tag kHeaderTag: MPI_Isend our WireHeader to each other member,
//      MPI_Irecv one from each (MPI's per-pair non-overtaking rule pairs the k-th headers of two ranks).
//   3. all headers must agree on requested group, dtype, count and shape hash, else INVALID_ARGUMENT everywhere.
//   4. a DONE header received instead of a P-Reduce header means that rank withdrew: it is excluded from this and
//      every later P-Reduce of the session. Every receiver finds the DONE at the same per-peer FIFO position, so
//      all members compute the same reduced group.
//   5. in-place SUM over the reduced group through the Backend (cached communicator), divide by its size.
#ifndef HETSYNC_ENGINE_PREDUCE_H_
#define HETSYNC_ENGINE_PREDUCE_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace hetsync {

constexpr uint32_t kHeaderMagic = 0x48535931;  // "HSY1"
constexpr int kMaxListedRanks = 64;           // group ranks carried verbatim (for messages); the hash covers all
constexpr int kSignatureChars = 512;          // human-readable shape signature carried verbatim (truncated)

// Fixed-size control message. Sent as MPI_BYTE: hetsync assumes a homogeneous cluster (same endianness/ABI).
struct WireHeader {
  uint32_t magic;
  uint32_t kind;  // kKindPReduce or kKindDone
  uint64_t session;
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
constexpr uint32_t kKindPReduce = 1;
constexpr uint32_t kKindDone = 2;

class PReduceOp : public Operation {
 public:
  // `group` in any order (validated with ValidateGroup). `data` holds count elements of dtype: the caller fills it
  // before Enqueue and finds the average there when the callback runs. `keepalive` owns that memory (for the TF
  // kernel: a reference to the output or fused tensor); the op keeps it so that an abandoned (timed-out)
  // collective can keep the memory alive while MPI may still write to it. timeout_seconds <= 0: engine default.
  PReduceOp(std::vector<int> group, DataType dtype, int64_t count, std::string shape_signature,
            double timeout_seconds, void* data, std::shared_ptr<void> keepalive, Callback cb);
  ~PReduceOp() override;

  const char* Name() const override { return "P-Reduce"; }
  bool Serial() const override { return true; }
  void Start(EngineContext& ctx) override;
  bool Progress(EngineContext& ctx) override;

 private:
  void PostRecv(EngineContext& ctx, size_t i);
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

  enum class Phase { kHeaders, kData } phase_ = Phase::kHeaders;
  Clock::time_point deadline_;
  std::shared_ptr<WireHeader> mine_;   // shared: outlives the op while sends are in flight
  std::vector<int> peers_;             // members whose header we wait for
  std::vector<WireHeader> received_;   // one per peer
  std::vector<MPI_Request> recv_reqs_;
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

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_PREDUCE_H_
