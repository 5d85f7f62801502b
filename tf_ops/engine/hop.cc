// HopQueues: Hop's queue sets and their messages (protocol in hop.h).
#include "engine/hop.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "engine/engine.h"

namespace hetsync {
namespace {

static_assert(std::is_trivially_copyable<HopWire>::value, "HopWire is sent as raw bytes");
constexpr size_t kMaxHistory = 200000;  // values (2 per entry into an iteration)

const HopWire& Head(const std::vector<char>& msg) { return *reinterpret_cast<const HopWire*>(msg.data()); }

std::string CheckConfig(const HopConfig& cfg, int size) {
  auto bad = [&](const std::vector<int>& v, const char* what) -> std::string {
    std::set<int> seen;
    for (int r : v) {
      if (r < 0 || r >= size) return std::string(what) + " rank " + std::to_string(r) + " is not in [0, " +
                                     std::to_string(size) + ")";
      if (r == cfg.rank) return std::string(what) + " list contains this rank (" + std::to_string(r) +
                                "); the self-loop is implicit";
      if (!seen.insert(r).second) return std::string(what) + " rank " + std::to_string(r) + " is listed twice";
    }
    return "";
  };
  std::string err = bad(cfg.in, "in-neighbour");
  if (err.empty()) err = bad(cfg.out, "out-neighbour");
  if (err.empty() && cfg.max_ig < 1) err = "max_ig must be >= 1, got " + std::to_string(cfg.max_ig);
  if (err.empty() && !cfg.in.empty() && (cfg.backup < 0 || cfg.backup >= static_cast<int>(cfg.in.size()))) {
    err = "backup_workers must be in [0, " + std::to_string(cfg.in.size()) + ") for rank " +
          std::to_string(cfg.rank) + " with " + std::to_string(cfg.in.size()) + " in-neighbours, got " +
          std::to_string(cfg.backup);
  }
  return err;
}

bool SameConfig(const HopConfig& a, const HopConfig& b) {
  return a.rank == b.rank && a.in == b.in && a.out == b.out && a.max_ig == b.max_ig && a.backup == b.backup &&
         a.staleness == b.staleness && a.reuse_stale == b.reuse_stale;
}

}  // namespace

void HopQueues::Start(EngineContext& ctx) {
  inflight_.clear();
  sets_.clear();
  unclaimed_.clear();
  future_.clear();
  away_peers_.clear();
  session_ = ctx.session;
  announced_away_ = false;
}

void HopQueues::Stop(EngineContext& ctx) {
  // A matched receive cannot be cancelled, and waiting for it could hang on a peer that is gone: free the request
  // and keep its buffer for good (MPI may still write it).
  for (auto& f : inflight_) {
    int done = 0;
    MPI_Test(&f.req, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Request_free(&f.req);
      ctx.Abandon(f.buf);
    }
  }
  inflight_.clear();
}

bool HopQueues::Poll(EngineContext& ctx) {
  bool any = false;
  if (ctx.session != session_) {
    NewSession(ctx);
    any = true;
  }
  const size_t before = inflight_.size();
  Receive(ctx);
  any = any || inflight_.size() != before;
  for (size_t i = 0; i < inflight_.size();) {
    int flag = 0;
    MPI_Test(&inflight_[i].req, &flag, MPI_STATUS_IGNORE);
    if (!flag) {
      ++i;
      continue;
    }
    auto buf = std::move(inflight_[i].buf);
    inflight_.erase(inflight_.begin() + i);
    Handle(ctx, std::move(buf));
    any = true;
  }
  if (!sets_.empty()) FollowAbsence(ctx);
  return any;
}

void HopQueues::Receive(EngineContext& ctx) {
  for (int i = 0; i < 64; ++i) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    MPI_Improbe(MPI_ANY_SOURCE, kHopTag, ctx.comm, &flag, &msg, &st);
    if (!flag) return;
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    auto buf = std::make_shared<std::vector<char>>(std::max<size_t>(bytes, sizeof(HopWire)));
    InFlight f{MPI_REQUEST_NULL, buf};
    MPI_Imrecv(buf->data(), bytes, MPI_BYTE, &msg, &f.req);
    inflight_.push_back(std::move(f));
  }
}

void HopQueues::Handle(EngineContext& ctx, std::shared_ptr<std::vector<char>> msg) {
  const HopWire& h = Head(*msg);
  if (h.magic != kHopMagic) {
    ctx.Fail("corrupt Hop message from rank " + std::to_string(h.sender) + " (bad magic)");
    return;
  }
  if (h.session < session_) return;  // a message of an older session: its queues are gone
  if (h.session > session_) {        // the sender rejoined first: keep it for our next session
    future_.push_back(std::move(msg));
    return;
  }
  if (h.kind == kHopAway) {
    away_peers_.insert(h.sender);
    return;
  }
  if (h.kind == kHopBack) {
    away_peers_.erase(h.sender);
    return;
  }
  auto it = sets_.find(h.id);
  if (it == sets_.end()) {
    unclaimed_[h.id].push_back(std::move(msg));
    return;
  }
  Apply(ctx, it->second, std::move(msg));
}

void HopQueues::Apply(EngineContext& ctx, HopSet& set, std::shared_ptr<std::vector<char>> msg) {
  const HopWire h = Head(*msg);
  const auto& peers = h.kind == kHopUpdate ? set.cfg.in : set.cfg.out;
  if (std::find(peers.begin(), peers.end(), h.sender) == peers.end()) {
    set.failure = "Hop queue set '" + set.name + "': rank " + std::to_string(h.sender) + " sent " +
                  (h.kind == kHopUpdate ? "an update" : "tokens") + " to rank " + std::to_string(ctx.rank) +
                  ", which is not its " + (h.kind == kHopUpdate ? "out" : "in") +
                  "-neighbour here: the ranks disagree on the topology";
    return;
  }
  if (h.kind == kHopToken) {
    set.state.OnTokens(h.sender, h.iter, h.n);
    return;
  }
  if (ctx.withdrawn) {  // this worker receives nothing more in this session
    set.state.Discard();
    return;
  }
  HopEntry e;
  e.iter = h.iter;
  e.sender = h.sender;
  e.data = std::move(msg);
  set.state.OnUpdate(std::move(e));
  set.max_queue = std::max(set.max_queue, set.state.QueueSize());
}

void HopQueues::NewSession(EngineContext& ctx) {
  session_ = ctx.session;
  for (auto& kv : sets_) {
    HopSet& s = kv.second;
    const int64_t now[4] = {s.state.dropped(), s.state.skips(), s.state.skipped_iters(), s.state.used()};
    for (int i = 0; i < 4; ++i) s.before[i] += now[i];
    s.state = HopState(s.cfg);
    s.history.clear();
    s.failure.clear();
  }
  away_peers_.clear();
  announced_away_ = false;
  unclaimed_.clear();
  std::vector<std::shared_ptr<std::vector<char>>> later;
  later.swap(future_);
  for (auto& m : later) Handle(ctx, std::move(m));  // re-buffers those of sessions still ahead
}

void HopQueues::FollowAbsence(EngineContext& ctx) {
  const bool away = ctx.control.away() || ctx.withdrawn;
  if (away != announced_away_) Announce(ctx, away);
  for (auto& kv : sets_) {
    HopSet& s = kv.second;
    for (const auto* list : {&s.cfg.in, &s.cfg.out}) {
      for (int p : *list) s.state.SetAbsent(p, ctx.done.count(p) > 0 || away_peers_.count(p) > 0);
    }
  }
}

void HopQueues::Announce(EngineContext& ctx, bool away) {
  announced_away_ = away;
  std::set<int> peers;
  for (auto& kv : sets_) {
    peers.insert(kv.second.cfg.in.begin(), kv.second.cfg.in.end());
    peers.insert(kv.second.cfg.out.begin(), kv.second.cfg.out.end());
  }
  auto msg = std::make_shared<HopWire>();
  std::memset(msg.get(), 0, sizeof(HopWire));
  msg->magic = kHopMagic;
  msg->kind = away ? kHopAway : kHopBack;
  msg->session = session_;
  msg->sender = ctx.rank;
  std::vector<MPI_Request> reqs;
  for (int p : peers) {
    reqs.emplace_back();
    MPI_Isend(msg.get(), sizeof(HopWire), MPI_BYTE, p, kHopTag, ctx.comm, &reqs.back());
  }
  ctx.AdoptSends(std::move(reqs), msg);
}

std::string HopQueues::Configure(EngineContext& ctx, const std::string& name, const HopConfig& cfg, bool wire_half) {
  std::string err = CheckConfig(cfg, ctx.size);
  if (!err.empty()) return "Hop queue set '" + name + "': " + err;
  const uint64_t id = Fnv1a64(name.data(), name.size());
  auto it = sets_.find(id);
  if (it != sets_.end() && it->second.name != name) {
    return "Hop queue set names '" + name + "' and '" + it->second.name + "' collide (same hash): rename one";
  }
  if (it != sets_.end() && SameConfig(it->second.cfg, cfg) && it->second.wire_half == wire_half) return "";
  HopSet& s = sets_[id];
  s = HopSet();
  s.name = name;
  s.cfg = cfg;
  s.wire_half = wire_half;
  s.state = HopState(cfg);
  auto pending = unclaimed_.find(id);
  if (pending != unclaimed_.end()) {
    auto msgs = std::move(pending->second);
    unclaimed_.erase(pending);
    for (auto& m : msgs) Apply(ctx, s, std::move(m));
  }
  return "";
}

HopSet* HopQueues::Get(uint64_t id) {
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : &it->second;
}

int HopQueues::SendUpdate(EngineContext& ctx, uint64_t id, std::shared_ptr<std::vector<char>> msg) {
  HopSet& set = sets_.at(id);
  if (set.state.sent_current()) return 0;
  HopWire* h = reinterpret_cast<HopWire*>(msg->data());
  h->magic = kHopMagic;
  h->kind = kHopUpdate;
  h->id = id;
  h->session = session_;
  h->iter = set.state.iter();
  h->n = 0;
  h->sender = ctx.rank;
  h->wire_half = set.wire_half ? 1 : 0;
  if (set.count < 0) set.count = h->count;
  std::vector<MPI_Request> reqs;
  for (int j : set.cfg.out) {
    if (!set.state.ShouldSendTo(j) || ctx.done.count(j)) {  // past this iteration (§6.2 (b)), or withdrew
      ++set.sends_skipped;
      continue;
    }
    reqs.emplace_back();
    MPI_Isend(msg->data(), static_cast<int>(msg->size()), MPI_BYTE, j, kHopTag, ctx.comm, &reqs.back());
  }
  const int sent = static_cast<int>(reqs.size());
  set.sends += sent;
  ctx.AdoptSends(std::move(reqs), msg);
  set.state.MarkSent();
  return sent;
}

void HopQueues::SendTokens(EngineContext& ctx, HopSet& set, int64_t n) {
  auto msg = std::make_shared<HopWire>();
  std::memset(msg.get(), 0, sizeof(HopWire));
  msg->magic = kHopMagic;
  msg->kind = kHopToken;
  msg->id = Fnv1a64(set.name.data(), set.name.size());
  msg->session = session_;
  msg->iter = set.state.iter();
  msg->n = n;
  msg->sender = ctx.rank;
  std::vector<MPI_Request> reqs;
  for (int j : set.cfg.in) {
    reqs.emplace_back();
    MPI_Isend(msg.get(), sizeof(HopWire), MPI_BYTE, j, kHopTag, ctx.comm, &reqs.back());
  }
  ctx.AdoptSends(std::move(reqs), msg);
}

void HopQueues::RecordEntry(HopSet& set) {
  if (set.history.size() + 2 > kMaxHistory) return;
  set.history.push_back(set.state.iter());
  set.history.push_back(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

}  // namespace hetsync
