#include "engine/hop_state.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace hetsync {

HopState::HopState(HopConfig cfg) : cfg_(std::move(cfg)) {
  queues_.resize(static_cast<size_t>(std::max(1, cfg_.max_ig + 1)));
  for (int j : cfg_.out) tokens_[j] = cfg_.max_ig;  // §4.2 initialization: max_ig tokens per token queue
}

bool HopState::Stale(int64_t iter) const {
  return cfg_.staleness >= 0 ? iter < iter_ - cfg_.staleness : iter < iter_;
}

bool HopState::OnUpdate(HopEntry e) {
  auto nw = newest_.emplace(e.sender, e.iter).first;
  nw->second = std::max(nw->second, e.iter);
  if (Stale(e.iter)) {  // §6.2 (a): it can never be used, drop it now rather than at a later dequeue
    ++dropped_;
    return false;
  }
  if (cfg_.staleness >= 0) {  // §6.1: among one sender's entries only the newest is kept
    auto it = latest_.find(e.sender);
    if (it != latest_.end()) {
      ++dropped_;
      if (it->second.iter >= e.iter) return false;
      reduced_.erase(e.sender);
      it->second = std::move(e);
      return true;
    }
    latest_.emplace(e.sender, std::move(e));
    return true;
  }
  const int64_t horizon = iter_ + cfg_.max_ig;
  if (e.iter > horizon) {
    // Only possible while this worker was absent to the sender (it took our tokens on credit): keep only the
    // sender's newest such entry. The older ones are never waited for (a newer one of the sender arrived).
    for (auto& q : queues_) {
      auto keep = std::remove_if(q.begin(), q.end(),
                                 [&](const HopEntry& x) { return x.sender == e.sender && x.iter > horizon; });
      dropped_ += static_cast<int64_t>(q.end() - keep);
      q.erase(keep, q.end());
    }
  }
  queues_[static_cast<size_t>(e.iter % static_cast<int64_t>(queues_.size()))].push_back(std::move(e));
  return true;
}

void HopState::OnTokens(int from, int64_t from_iter, int64_t n) {
  auto t = tokens_.find(from);
  if (t == tokens_.end()) return;  // not an out-neighbour (the engine checks senders)
  t->second += n;
  auto p = peer_iter_.emplace(from, from_iter).first;
  p->second = std::max(p->second, from_iter);
}

void HopState::SetAbsent(int peer, bool absent) {
  if (absent) {
    absent_.insert(peer);
  } else {
    absent_.erase(peer);
  }
}

int HopState::Need(int pool) const {
  const int want = static_cast<int>(cfg_.in.size()) - cfg_.backup;
  return std::max(0, std::min(want, pool));
}

void HopState::DropOlderThan(int64_t k) {
  for (auto& q : queues_) {
    auto keep = std::remove_if(q.begin(), q.end(), [k](const HopEntry& e) { return e.iter < k; });
    dropped_ += static_cast<int64_t>(q.end() - keep);
    q.erase(keep, q.end());
  }
}

bool HopState::TryRecv(int64_t k, HopSelection* sel, std::vector<int>* missing) {
  missing->clear();
  return cfg_.staleness >= 0 ? RecvStale(k, sel, missing) : RecvQueued(k, sel, missing);
}

// Fig 4 / Fig 8: updates tagged k from |N_in| - backup in-neighbours, plus every other one tagged k already here.
// An in-neighbour is not waited for when it is absent, or when a newer update of it arrived without the one for k
// (per-sender message order is preserved, so that one is never coming: the sender skipped iterations, §5).
bool HopState::RecvQueued(int64_t k, HopSelection* sel, std::vector<int>* missing) {
  DropOlderThan(k);
  auto& q = queues_[static_cast<size_t>(k % static_cast<int64_t>(queues_.size()))];
  std::set<int> have;
  for (const auto& e : q) {
    if (e.iter == k) have.insert(e.sender);
  }
  for (int j : cfg_.in) {
    if (have.count(j) || absent(j)) continue;
    auto nw = newest_.find(j);
    if (nw != newest_.end() && nw->second > k) continue;
    missing->push_back(j);
  }
  const int pool = static_cast<int>(have.size() + missing->size());
  if (static_cast<int>(have.size()) < Need(pool)) return false;
  sel->k = k;
  sel->self_weight = 1.0;  // eq. (1): every update, the worker's own included, has the same weight
  sel->entries.clear();
  sel->weights.clear();
  auto taken = std::stable_partition(q.begin(), q.end(), [k](const HopEntry& e) { return e.iter != k; });
  for (auto it = taken; it != q.end(); ++it) {
    sel->entries.push_back(std::move(*it));
    sel->weights.push_back(1.0);
  }
  q.erase(taken, q.end());
  used_ += static_cast<int64_t>(sel->entries.size());
  missing->clear();
  return true;
}

// Fig 9 as §4.4's text says: the newest update of each in-neighbour, received now or in an earlier iteration, is
// satisfactory when it is at most s iterations old, and Recv(k) waits until every in-neighbour has one. Which of
// them it reduces: the paper's N_in^(k)(j), only those received since the previous reduce (reuse_stale false),
// or every satisfactory one, kept and reused until a newer one replaces it (reuse_stale true, our variant). The
// reduce weights each by Iter(u) - (k - s) + 1 (eq. 2; the worker's own parameters, of iteration k, by s + 1).
// With backup workers as well (the hybrid of Table 1), |N_in| - backup satisfactory neighbours suffice.
bool HopState::RecvStale(int64_t k, HopSelection* sel, std::vector<int>* missing) {
  const int64_t min_iter = k - cfg_.staleness;
  std::vector<const HopEntry*> good;
  for (int j : cfg_.in) {
    auto it = latest_.find(j);
    if (it != latest_.end() && it->second.iter >= min_iter) {
      good.push_back(&it->second);
    } else if (!absent(j)) {
      missing->push_back(j);
    }
  }
  const int pool = static_cast<int>(good.size() + missing->size());
  if (static_cast<int>(good.size()) < Need(pool)) return false;
  sel->k = k;
  sel->self_weight = static_cast<double>(cfg_.staleness + 1);
  sel->entries.clear();
  sel->weights.clear();
  for (const HopEntry* e : good) {
    if (!cfg_.reuse_stale && !reduced_.insert(e->sender).second) continue;  // reduced in an earlier iteration
    sel->entries.push_back(*e);
    sel->weights.push_back(static_cast<double>(e->iter - min_iter + 1));
  }
  used_ += static_cast<int64_t>(sel->entries.size());
  missing->clear();
  return true;
}

int64_t HopState::PlanJump(int skip, int trigger) const {
  if (skip <= 0) return 0;
  int64_t lag = std::numeric_limits<int64_t>::max();
  for (int j : cfg_.out) {
    if (!absent(j)) lag = std::min(lag, tokens_.at(j) - cfg_.max_ig);  // = Iter(j) - Iter(i), tokens in flight aside
  }
  if (lag == std::numeric_limits<int64_t>::max() || lag <= trigger) return 0;
  return std::max<int64_t>(0, std::min<int64_t>(skip, lag - 1));
}

bool HopState::TryAdvance(int64_t steps, std::vector<int>* missing) {
  missing->clear();
  for (int j : cfg_.out) {
    if (!absent(j) && tokens_.at(j) < steps) missing->push_back(j);
  }
  if (!missing->empty()) return false;
  for (int j : cfg_.out) tokens_[j] -= steps;
  iter_ += steps;
  if (steps > 1) {
    ++skips_;
    skipped_iters_ += steps - 1;
  }
  if (cfg_.staleness < 0) DropOlderThan(iter_);
  return true;
}

bool HopState::ShouldSendTo(int to) const {
  auto p = peer_iter_.find(to);
  if (p == peer_iter_.end()) return true;
  return p->second <= iter_ + std::max(0, cfg_.staleness);
}

int64_t HopState::Tokens(int out) const {
  auto t = tokens_.find(out);
  return t == tokens_.end() ? 0 : t->second;
}

int64_t HopState::KnownIter(int peer) const {
  auto p = peer_iter_.find(peer);
  if (p != peer_iter_.end()) return p->second;
  auto n = newest_.find(peer);
  return n == newest_.end() ? -1 : n->second;
}

int64_t HopState::QueueSize() const {
  int64_t n = static_cast<int64_t>(latest_.size());
  for (const auto& q : queues_) n += static_cast<int64_t>(q.size());
  return n;
}

int64_t HopState::QueueSizeFrom(int peer) const {
  int64_t n = latest_.count(peer) ? 1 : 0;
  for (const auto& q : queues_) {
    for (const auto& e : q) n += e.sender == peer ? 1 : 0;
  }
  return n;
}

}  // namespace hetsync

// C API over HopState for the property tests (tests/test_hop_queues.py, through ctypes). An update's data is one
// float, so a test can check the reduce's weights against numpy.
extern "C" {
void* hetsync_hop_state_new(int rank, int n_in, const int* in, int n_out, const int* out, int max_ig, int backup,
                            int staleness, int reuse_stale) {
  hetsync::HopConfig cfg;
  cfg.rank = rank;
  cfg.in.assign(in, in + n_in);
  cfg.out.assign(out, out + n_out);
  cfg.max_ig = max_ig;
  cfg.backup = backup;
  cfg.staleness = staleness;
  cfg.reuse_stale = reuse_stale != 0;
  return new hetsync::HopState(cfg);
}
void hetsync_hop_state_free(void* s) { delete static_cast<hetsync::HopState*>(s); }
int hetsync_hop_state_update(void* s, int64_t iter, int sender, double value) {
  hetsync::HopEntry e;
  e.iter = iter;
  e.sender = sender;
  e.data = std::make_shared<std::vector<char>>(sizeof(double));
  std::memcpy(e.data->data(), &value, sizeof(double));
  return static_cast<hetsync::HopState*>(s)->OnUpdate(std::move(e)) ? 1 : 0;
}
void hetsync_hop_state_tokens(void* s, int from, int64_t from_iter, int64_t n) {
  static_cast<hetsync::HopState*>(s)->OnTokens(from, from_iter, n);
}
void hetsync_hop_state_absent(void* s, int peer, int absent) {
  static_cast<hetsync::HopState*>(s)->SetAbsent(peer, absent != 0);
}
// Returns 1 when satisfied: up to `cap` selected entries' (sender, iter, value, weight) and the self weight.
int hetsync_hop_state_try_recv(void* s, int64_t k, int cap, int* n, int* senders, int64_t* iters, double* values,
                               double* weights, double* self_weight) {
  hetsync::HopSelection sel;
  std::vector<int> missing;
  if (!static_cast<hetsync::HopState*>(s)->TryRecv(k, &sel, &missing)) {
    *n = static_cast<int>(missing.size());
    for (int i = 0; i < *n && i < cap; ++i) senders[i] = missing[i];
    return 0;
  }
  *n = static_cast<int>(sel.entries.size());
  *self_weight = sel.self_weight;
  for (int i = 0; i < *n && i < cap; ++i) {
    senders[i] = sel.entries[i].sender;
    iters[i] = sel.entries[i].iter;
    std::memcpy(&values[i], sel.entries[i].data->data(), sizeof(double));
    weights[i] = sel.weights[i];
  }
  return 1;
}
int64_t hetsync_hop_state_plan(void* s, int skip, int trigger) {
  return static_cast<hetsync::HopState*>(s)->PlanJump(skip, trigger);
}
int hetsync_hop_state_try_advance(void* s, int64_t steps) {
  std::vector<int> missing;
  return static_cast<hetsync::HopState*>(s)->TryAdvance(steps, &missing) ? 1 : 0;
}
int hetsync_hop_state_should_send(void* s, int to) {
  return static_cast<hetsync::HopState*>(s)->ShouldSendTo(to) ? 1 : 0;
}
int64_t hetsync_hop_state_iter(void* s) { return static_cast<hetsync::HopState*>(s)->iter(); }
int64_t hetsync_hop_state_token_count(void* s, int out) { return static_cast<hetsync::HopState*>(s)->Tokens(out); }
int64_t hetsync_hop_state_queue_size(void* s) { return static_cast<hetsync::HopState*>(s)->QueueSize(); }
int64_t hetsync_hop_state_dropped(void* s) { return static_cast<hetsync::HopState*>(s)->dropped(); }
}
