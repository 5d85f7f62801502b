#include "engine/mpi_backend.h"

#include <algorithm>
#include <climits>

namespace hetsync {
namespace {

// Tag for MPI_Comm_create_group. Members create communicators one at a time in the (agreed) P-Reduce order, so
// a single tag is unambiguous.
constexpr int kCreateTag = 0x4e53;

MPI_Datatype ToMpi(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;  // reduced with HalfSum below
  }
  return MPI_DATATYPE_NULL;
}

// MPI has no half type: sum IEEE halves through float (exact for two operands, then rounded once).
void HalfSum(void* in, void* inout, int* len, MPI_Datatype*) {
  AddHalves(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len);
}

MPI_Op HalfSumOp() {
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(&HalfSum, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

class MpiPending : public PendingCollective {
 public:
  MpiPending(MPI_Comm comm, bool owns_comm) : comm_(comm), owns_comm_(owns_comm) {}
  ~MpiPending() override {
    // Only reached for completed collectives: an abandoned (timed-out) one is leaked on purpose by the engine,
    // because MPI may still write into its buffer.
    if (owns_comm_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Status Test(bool* done) override {
    int flag = 0;
    int err = MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS) return Status::Error(Code::kInternal, "MPI_Iallreduce failed: " + MpiErrorString(err));
    *done = flag != 0;
    return Status::OK();
  }
  std::vector<MPI_Request> reqs_;

 private:
  MPI_Comm comm_;
  bool owns_comm_;
};

}  // namespace

std::string MpiErrorString(int err) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = 0;
  return "MPI error " + std::to_string(err) + ": " + std::string(text, len);
}

MpiBackend::MpiBackend(MPI_Comm parent, int cache_limit) : parent_(parent), cache_limit_(cache_limit) {
  MPI_Comm_group(parent_, &parent_group_);
}

MpiBackend::~MpiBackend() { Shutdown(); }

Status MpiBackend::GetComm(const std::vector<int>& members, MPI_Comm* comm, bool* cached) {
  auto it = cache_.find(members);
  if (it != cache_.end()) {
    ++hits_;
    *comm = it->second;
    *cached = true;
    return Status::OK();
  }
  ++misses_;
  MPI_Group group;
  int err = MPI_Group_incl(parent_group_, static_cast<int>(members.size()), members.data(), &group);
  if (err != MPI_SUCCESS) return Status::Error(Code::kInternal, "MPI_Group_incl failed: " + MpiErrorString(err));
  // Collective over `members` only (not the whole world), which is what lets disjoint groups proceed
  // independently. Blocking, but every member is known to be in this same P-Reduce by now.
  MPI_Comm newcomm = MPI_COMM_NULL;
  err = MPI_Comm_create_group(parent_, group, kCreateTag, &newcomm);
  MPI_Group_free(&group);
  if (err != MPI_SUCCESS) {
    return Status::Error(Code::kInternal, "MPI_Comm_create_group failed: " + MpiErrorString(err));
  }
  // The caching decision must be the same on every member, or a later P-Reduce would find the communicator on
  // some members and create a new one on others (mismatched collectives). Cache sizes differ per rank (each rank
  // sees different groups), so agree: cache only if every member still has room (Ripples §6.1 "consistent
  // presence of communicators").
  int room = static_cast<int>(cache_.size()) < cache_limit_ ? 1 : 0;
  int all_room = 0;
  err = MPI_Allreduce(&room, &all_room, 1, MPI_INT, MPI_LAND, newcomm);
  if (err != MPI_SUCCESS) {
    MPI_Comm_free(&newcomm);
    return Status::Error(Code::kInternal, "cache agreement allreduce failed: " + MpiErrorString(err));
  }
  *comm = newcomm;
  *cached = all_room != 0;
  if (*cached) {
    cache_.emplace(members, newcomm);
    size_ = static_cast<int64_t>(cache_.size());
  } else {
    ++uncached_;
  }
  return Status::OK();
}

Status MpiBackend::StartAllreduceSum(const std::vector<int>& members, void* buf, int64_t count, DataType dtype,
                                     std::unique_ptr<PendingCollective>* out) {
  MPI_Comm comm;
  bool cached = false;
  Status s = GetComm(members, &comm, &cached);
  if (!s.ok) return s;
  auto pending = std::make_unique<MpiPending>(comm, !cached);
  // MPI counts are int: split larger buffers into chunks; several outstanding non-blocking collectives on one
  // communicator are allowed and are matched in posting order on every member.
  const int64_t kChunk = INT_MAX / 2;
  char* p = static_cast<char*>(buf);
  const size_t esize = DataTypeSize(dtype);
  for (int64_t off = 0; off < count || (count == 0 && off == 0); off += kChunk) {
    int n = static_cast<int>(std::min<int64_t>(kChunk, count - off));
    MPI_Request req;
    MPI_Op op = dtype == DataType::kFloat16 ? HalfSumOp() : MPI_SUM;
    int err = MPI_Iallreduce(MPI_IN_PLACE, p + off * esize, n, ToMpi(dtype), op, comm, &req);
    if (err != MPI_SUCCESS) {
      return Status::Error(Code::kInternal, "MPI_Iallreduce failed: " + MpiErrorString(err));
    }
    pending->reqs_.push_back(req);
    if (count == 0) break;
  }
  *out = std::move(pending);
  return Status::OK();
}

BackendStats MpiBackend::Stats() const {
  BackendStats s;
  s.cache_hits = hits_;
  s.cache_misses = misses_;
  s.cache_size = size_;
  s.uncached_creations = uncached_;
  return s;
}

void MpiBackend::Shutdown() {
  for (auto& kv : cache_) MPI_Comm_free(&kv.second);
  cache_.clear();
  if (parent_group_ != MPI_GROUP_NULL) MPI_Group_free(&parent_group_);
}

}  // namespace hetsync
