// MPI settings the engine needs, applied when it starts (not at `import hetsync`, not at MPI_Init).
//
// Why here: MPI is started by Horovod (hvd.init()), before hetsync has a say; an Open MPI MCA parameter that is
// writable at run time (MPI_T control variable, scope ALL) can still be set by the engine, and libnbc reads its
// algorithm choice at each call.  A setting the user made (mpirun --mca NAME VALUE or -x OMPI_MCA_NAME=VALUE, both
// seen by the process as OMPI_MCA_NAME) always wins.
#ifndef HETSYNC_ENGINE_MPI_SETTINGS_H_
#define HETSYNC_ENGINE_MPI_SETTINGS_H_

#include <string>
#include <vector>

namespace hetsync {

// One MCA parameter hetsync sets unless the user did.
struct MpiSetting {
  const char* name;   // MCA name, e.g. "coll_libnbc_iallreduce_algorithm"
  int value;          // what hetsync writes
  const char* why;    // one line for `hetsync check` and the docs
};

// The settings (docs/engine.md, "MPI settings"):
// coll_libnbc_iallreduce_algorithm = 1 (ring): the engine's non-blocking allreduces (OD-SGD's transfer, P-Reduce
// groups) run on libnbc, whose own choice for an in-place MPI_Iallreduce is not its ring; across 2 emulated hosts
// on 100 Mbit/s links the ring made OD-SGD +73% faster than allreduce where libnbc's choice made it +18%.
const std::vector<MpiSetting>& MpiSettings();

// Applies every setting the user has not set; returns one line per setting ("name=value (hetsync)", "name=value
// (user)", or "name: not applied (reason)").  Needs MPI initialised.
std::vector<std::string> ApplyMpiSettings();

// The lines of the last ApplyMpiSettings() (empty before the first).
std::vector<std::string> AppliedMpiSettings();

}  // namespace hetsync

#endif  // HETSYNC_ENGINE_MPI_SETTINGS_H_
