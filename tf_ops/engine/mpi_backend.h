// MPI data plane: MPI_Iallreduce on a per-group communicator from a bounded, consistent cache (Ripples §6.1).
#ifndef HETSYNC_ENGINE_MPI_BACKEND_H_
#define HETSYNC_ENGINE_MPI_BACKEND_H_

#include <mpi.h>

#include <atomic>
#include <map>
#include <vector>

#include "engine/backend.h"

namespace hetsync {

// Returns "MPI error <code>: <text>" for a failed MPI call.
std::string MpiErrorString(int err);

class MpiBackend : public Backend {
 public:
  // `parent` is the engine's own communicator (a dup of MPI_COMM_WORLD, so its ranks are world ranks).
  // `cache_limit` bounds the number of cached group communicators; past it, communicators are created, used once
  // and freed -- never evicted (Ripples §6.1: evicting would need another agreement round among members).
  MpiBackend(MPI_Comm parent, int cache_limit);
  ~MpiBackend() override;

  const char* Name() const override { return "mpi"; }
  Status StartAllreduceSum(const std::vector<int>& members, void* buf, int64_t count, DataType dtype,
                           std::unique_ptr<PendingCollective>* out) override;
  BackendStats Stats() const override;
  void Shutdown() override;

 private:
  // Gets the communicator for `members`; *cached is false when the caller must free it after use.
  Status GetComm(const std::vector<int>& members, MPI_Comm* comm, bool* cached);

  MPI_Comm parent_;
  MPI_Group parent_group_ = MPI_GROUP_NULL;
  int cache_limit_;
  std::map<std::vector<int>, MPI_Comm> cache_;  // touched only by the progress thread
  std::atomic<int64_t> hits_{0}, misses_{0}, size_{0}, uncached_{0};
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_MPI_BACKEND_H_
