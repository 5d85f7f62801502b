// Hop's queues at one worker, as a pure state machine (no MPI, no threads): update queues, token queues, the
// receive rules of standard decentralized training, backup workers and bounded staleness, and skipping iterations.
// Hop: Heterogeneity-aware Decentralized Training (Luo et al.), §4.1-§4.4, §5, §6.1, §6.2.
//
// The engine's HopQueues (hop.h) owns one HopState per queue set and feeds it what arrives over MPI; the property
// tests drive the same class through the C API at the bottom of hop_state.cc, so the rules are tested as written.
//
// Where the queues live. The paper keeps TokenQ(j->i) at worker j and lets i remove tokens from it remotely. Over
// message passing the natural owner is the consumer: worker i keeps, per out-neighbour j, the count of tokens j
// granted minus those i took. j "inserts a token into TokenQ(j->i)" by sending i a TOKEN message (carrying j's new
// iteration), i "removes" one locally. The identity of Theorem 2's proof holds with the messages in flight counted:
//     tokens_i[j] + (tokens j sent that i has not received) == Iter(j) - Iter(i) + max_ig.
//
// Absent neighbours (withdrawn for the session, or away: hop.h) are not waited for: an update is not required from
// them, and a token is taken from them on credit (the count may go negative), so once such a neighbour is back, its
// in-neighbours wait for it to catch up again and the identity above still holds.
#ifndef HETSYNC_ENGINE_HOP_STATE_H_
#define HETSYNC_ENGINE_HOP_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace hetsync {

struct HopConfig {
  int rank = 0;
  std::vector<int> in;   // N_in(i) without the self-loop
  std::vector<int> out;  // N_out(i) without the self-loop
  int max_ig = 4;        // §4.2: initial tokens per token queue, bound on Iter(i) - Iter(out-neighbour)
  int backup = 0;        // §4.3: updates a worker may go without per iteration (< |N_in|)
  int staleness = -1;    // §4.4: s >= 0 enables bounded staleness; -1 off
  // With staleness, which satisfactory updates Recv(k) reduces: false = §4.4's N_in^(k)(j), only those received
  // since this worker's previous reduce (the paper's rule); true = each in-neighbour's newest, again and again
  // until a newer one arrives (our variant, "newest").
  bool reuse_stale = true;
};

// One queue entry: the parameters worker `sender` had when it entered iteration `iter` (§4.1 tags (iter, w_id)).
struct HopEntry {
  int64_t iter = 0;
  int sender = -1;
  std::shared_ptr<std::vector<char>> data;  // opaque here (the engine fills and reads it)
};

// What a receive for iteration k selected, with the weights of the reduce (eq. 1 uniform, eq. 2 with staleness).
struct HopSelection {
  int64_t k = 0;
  double self_weight = 1.0;
  std::vector<HopEntry> entries;
  std::vector<double> weights;
};

class HopState {
 public:
  explicit HopState(HopConfig cfg);
  const HopConfig& config() const { return cfg_; }
  int64_t iter() const { return iter_; }

  // ---- arrivals ----
  // An update from an in-neighbour. Returns false if it was dropped at once as stale (§6.2 (a)).
  bool OnUpdate(HopEntry e);
  // Out-neighbour `from` entered iteration `from_iter` and so granted `n` tokens (§4.2 "insert token").
  void OnTokens(int from, int64_t from_iter, int64_t n);
  // A neighbour withdrew / went away (true) or came back (false).
  void SetAbsent(int peer, bool absent);

  // ---- the worker's steps ----
  // Recv(k) (Fig 4 line 13; Fig 8 with backup workers; Fig 9 with staleness). True when satisfied: *sel holds the
  // updates to reduce (consumed from the queues). Else *missing lists the in-neighbours it waits for.
  bool TryRecv(int64_t k, HopSelection* sel, std::vector<int>* missing);
  // §5: iterations to skip now (0: none): when behind every present out-neighbour by more than `trigger`
  // iterations (read from the token counts), min(skip, lag - 1), so the jump never passes an out-neighbour.
  int64_t PlanJump(int skip, int trigger) const;
  // Enter iteration iter()+steps: takes `steps` tokens from every out-neighbour (credit from absent ones). False
  // (nothing taken) while a present out-neighbour has fewer; *missing lists them. The caller then sends `steps`
  // tokens to every in-neighbour.
  bool TryAdvance(int64_t steps, std::vector<int>* missing);

  // §6.2 (b): send an update to out-neighbour `to` only if it is not past this worker's iteration (its iteration
  // is known from the tokens it sent).
  bool ShouldSendTo(int to) const;
  bool sent_current() const { return sent_iter_ == iter_; }
  void MarkSent() { sent_iter_ = iter_; }

  // ---- gauges ----
  int64_t Tokens(int out) const;
  int64_t KnownIter(int peer) const;  // out-neighbour: from its tokens; in-neighbour: its newest update; -1 unknown
  int64_t QueueSize() const;          // entries held (rotating queues, or newest-per-neighbour with staleness)
  int64_t QueueSizeFrom(int peer) const;
  int64_t dropped() const { return dropped_; }
  int64_t skips() const { return skips_; }
  int64_t skipped_iters() const { return skipped_iters_; }
  int64_t used() const { return used_; }
  void Discard() { ++dropped_; }  // an update that arrived after this worker withdrew
  bool absent(int peer) const { return absent_.count(peer) > 0; }

 private:
  bool Stale(int64_t iter) const;
  void DropOlderThan(int64_t k);
  bool RecvQueued(int64_t k, HopSelection* sel, std::vector<int>* missing);
  bool RecvStale(int64_t k, HopSelection* sel, std::vector<int>* missing);
  int Need(int pool) const;

  HopConfig cfg_;
  int64_t iter_ = 0;
  int64_t sent_iter_ = -1;
  std::vector<std::vector<HopEntry>> queues_;  // §6.1 rotating queues: index iter mod (max_ig + 1)
  std::map<int, HopEntry> latest_;             // staleness: the newest update per in-neighbour (kept, reused)
  std::set<int> reduced_;                      // staleness: in-neighbours whose latest_ entry was reduced already
  std::map<int, int64_t> tokens_;              // per out-neighbour: granted - taken
  std::map<int, int64_t> newest_;              // per in-neighbour: newest update iteration that arrived
  std::map<int, int64_t> peer_iter_;           // per out-neighbour: iteration its latest token carried
  std::set<int> absent_;
  int64_t dropped_ = 0, skips_ = 0, skipped_iters_ = 0, used_ = 0;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_HOP_STATE_H_
