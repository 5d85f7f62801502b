// Data-plane interface: who moves the (large) tensor bytes of a partial allreduce.
//
// The engine splits every collective into a control plane (small headers, withdrawals; always MPI point-to-point
// on the engine communicator) and a data plane (the in-place sum over the agreed group), which goes through a
// Backend. MpiBackend (mpi_backend.h) is the only implementation. An NCCL backend for GPU tensors -- Ripples §6.1
// runs P-Reduce on NCCL and uses MPI only to set up NCCL communicators -- would implement this same interface
// (ncclCommInitRank keyed by the same member set, ncclAllReduce on a stream, completion via cudaEventQuery);
// it is NOT implemented here, see docs/engine.md.
#ifndef HETSYNC_ENGINE_BACKEND_H_
#define HETSYNC_ENGINE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/common.h"

namespace hetsync {

// One in-flight data-plane collective. Polled from the progress thread only.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Non-blocking. Sets *done when the result is in the buffer. A non-OK status is a transport error.
  virtual Status Test(bool* done) = 0;
};

struct BackendStats {
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  int64_t cache_size = 0;
  int64_t uncached_creations = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* Name() const = 0;

  // Starts an in-place element-wise SUM of `buf` (count elements of dtype) over `members` (sorted world ranks,
  // size >= 2, contains the caller). Collective over exactly `members`: every member calls it for the same
  // collective in the same order (the engine's header exchange guarantees that). May block briefly to set up a
  // communicator for a group it has not seen (all members are known to be present at that point).
  virtual Status StartAllreduceSum(const std::vector<int>& members, void* buf, int64_t count, DataType dtype,
                                   std::unique_ptr<PendingCollective>* out) = 0;

  virtual BackendStats Stats() const = 0;

  // Frees cached communicators. Called from Engine::Shutdown after the progress thread stopped.
  virtual void Shutdown() = 0;
};

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_BACKEND_H_
