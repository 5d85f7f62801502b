// One persistent schedule of a partial allreduce (eager-SGD §4.1 "persistent schedules") and the data phase of
// one round (RoundExec). Progress thread only. The protocol is described in partial.h.
#ifndef HETSYNC_ENGINE_PARTIAL_SCHEDULE_H_
#define HETSYNC_ENGINE_PARTIAL_SCHEDULE_H_

#include <mpi.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/partial.h"

namespace hetsync {

// The data phase of one round at one rank: a recursive-doubling allreduce over all ranks of a message
// [head | per-rank contributor flags | data] (non-powers of two: the ranks above the largest power of two fold
// into a partner first and get the result back last). Consumable: it runs once per round.
class RoundExec {
 public:
  // Agreement on the tensors travels with the data: (lo) the lowest calling rank in the sender's part of the
  // exchange and (diff) the lowest one there whose tensors differ from lo's. Merging two parts keeps both exact, so
  // after the allreduce every rank holds the same pair for the whole world: one message on every rank.
  struct Head {
    uint64_t id;
    int64_t round;
    int32_t size;          // world size the flags were laid out for
    int32_t sizes_differ;  // a partner's message had another size (its data was not added)
    int32_t lo_rank;       // -1: no calling rank in this part (passive ranks run the initiator's tensors)
    int32_t diff_rank;     // -1: all calling ranks agree
    uint64_t lo_hash;
    uint64_t diff_hash;
    char lo_desc[kPartialDescChars];
    char diff_desc[kPartialDescChars];
  };
  RoundExec(EngineContext& ctx, uint64_t id, int tag, int64_t round, const PartialSpec& spec, bool caller,
            double timeout);
  ~RoundExec();

  char* data() { return buf_->data() + data_offset_; }
  uint8_t* flags() { return reinterpret_cast<uint8_t*>(buf_->data() + sizeof(Head)); }
  Head* head() { return reinterpret_cast<Head*>(buf_->data()); }
  int64_t round() const { return round_; }
  const PartialSpec& spec() const { return spec_; }

  // Drives the exchange; true when done. On failure *error is set (and *culprit to the silent partner, if any).
  bool Progress(EngineContext& ctx, std::string* error, int* culprit);
  // Engine stopping: cancel the receive, hand the send to the engine (its buffer stays alive).
  void Abandon(EngineContext& ctx);
  int64_t Outstanding() const;

 private:
  struct Step {
    int partner;
    bool send;
    bool recv;
    bool combine;  // recv: add into ours (else replace ours: the folded rank getting the result)
    int phase;     // position in the whole exchange (deadline slack, see partial_round.cc)
  };
  void Plan(int rank, int size);
  void Post(EngineContext& ctx);
  bool Combine(std::string* error);
  void Merge(const Head& theirs);

  uint64_t id_;
  int tag_;
  int rank_ = -1;
  int64_t round_;
  PartialSpec spec_;
  double timeout_;
  size_t data_offset_ = 0;
  size_t bytes_ = 0;
  std::shared_ptr<std::vector<char>> buf_;
  std::shared_ptr<std::vector<char>> in_;
  std::vector<Step> steps_;
  size_t step_ = 0;
  bool posted_ = false;
  int received_ = -1;  // bytes of the current step's receive, once it completed
  MPI_Request send_ = MPI_REQUEST_NULL;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  bool matched_ = false;  // the current step's message was probed and is being received
  std::chrono::steady_clock::time_point step_start_;
};

class PartialSchedule {
 public:
  PartialSchedule(uint64_t id, const PartialSpec& spec, bool local, double timeout);
  ~PartialSchedule();

  uint64_t id() const { return id_; }
  const PartialSpec& spec() const { return spec_; }
  const std::string& failure() const { return failure_; }
  bool executing() const { return exec_ != nullptr; }
  int64_t current_round() const { return exec_ ? exec_->round() : -1; }
  int64_t next_round() const { return next_round_; }
  int64_t result_round() const { return result_round_; }
  int64_t consumed_round() const { return consumed_round_; }
  bool call_in_flight = false;

  // ---- calls (PartialAllreduceOp) ----
  // Records this rank's own spec (its first call defines it); "" or a message naming both specs.
  std::string SetLocal(EngineContext& ctx, const PartialSpec& spec);
  void Deposit(const void* data);  // send buffer += data (spec_.count elements of spec_.dtype)
  void CallActivate(EngineContext& ctx);  // solo: activate the next round; majority: designated or ARRIVE
  int Designated(EngineContext& ctx, int64_t round) const;
  // Whether the latest result was computed with this rank's own tensors' spec (a round this rank joined before its
  // first call ran with the initiator's; such a result is never returned to a call: it waits for the next round).
  bool ResultMatchesLocal() const { return result_spec_ == spec_; }
  void MarkConsumed() { consumed_round_ = result_round_; }
  void Discard();  // PartialDiscardOp: accumulated results and the undelivered deposit are dropped
  // PartialDrainOp: `out` (`bytes`, spec dtype) = the results this rank has not returned (accumulate: every round
  // since its last call; latest: the newest, if unconsumed) + its undelivered deposit; then Discard().
  void Drain(void* out, size_t bytes);
  // Copies the latest result out and marks it consumed.
  PartialResult TakeResult(EngineContext& ctx, void* out, bool included);

  // ---- notices (PartialCollectives) ----
  void OnActivate(EngineContext& ctx, const PartialNotice& n);
  void OnArrive(EngineContext& ctx, const PartialNotice& n);
  void OnAbort(EngineContext& ctx, const PartialNotice& n);

  bool Poll(EngineContext& ctx);
  void Abandon(EngineContext& ctx);
  int64_t Pending() const;
  // The schedule stops for good: every waiting and later call gets `why` (code `code`). With `tell_others`, every
  // other rank's schedule stops with the same message (ABORT naming `culprit`), and the engine is failed.
  void FailAll(EngineContext& ctx, Code code, const std::string& why, int culprit, bool tell_others);
  Code failure_code() const { return failure_code_; }
  void set_timeout(double t) {
    timeout_ = t;
    spec_.timeout = t;
  }

 private:
  struct Activation {
    bool activated = false;
    int root = -1;
    PartialSpec spec;  // the initiator's (what the round runs with)
    std::set<std::pair<int, int>> sent;  // consumed sends: (node it sends for, dimension)
  };
  void Activate(EngineContext& ctx, int64_t round, int from_node, int from_dim, int root, const PartialSpec& spec);
  void Forward(EngineContext& ctx, int64_t round, Activation& a, int node, int from_dim);
  void SendNotice(EngineContext& ctx, const PartialNotice& n, int to);
  void StartRound(EngineContext& ctx);
  void FinishRound(EngineContext& ctx);
  void Normalize(const PartialSpec& ran, int divisor);
  PartialNotice NoticeFor(EngineContext& ctx, const PartialSpec& spec, uint32_t kind, int64_t round) const;

  uint64_t id_;
  PartialSpec spec_;  // this rank's (after its first call), else the first activation's
  bool local_ = false;
  double timeout_;
  std::vector<char> send_buf_;
  bool has_contribution_ = false;
  int64_t deposit_round_ = 0;  // next_round_ when the oldest part of the send buffer was deposited
  std::vector<char> recv_buf_;  // the latest round's result, divided (by its contributors, or P with accumulate)
  std::vector<char> acc_buf_;   // accumulate: the sum of the results since the last call took them
  int64_t acc_rounds_ = 0;
  PartialResult result_;
  PartialSpec result_spec_;
  int64_t result_round_ = -1;
  int64_t consumed_round_ = -1;
  int64_t next_round_ = 0;
  int64_t arrive_sent_ = -1;
  std::map<int64_t, Activation> acts_;
  std::unique_ptr<RoundExec> exec_;
  std::string failure_;
  Code failure_code_ = Code::kOk;
  int64_t my_staleness_ = -1;  // staleness of this rank's data in the running round (-1: none)
  std::set<int64_t> arrivals_;  // majority, designated rank: rounds a peer waits for
  std::map<int64_t, std::set<int>> arrived_;  // kAll, rank 0: round -> ranks whose call waits for it
  bool AllPresentArrived(EngineContext& ctx) const;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_PARTIAL_SCHEDULE_H_
