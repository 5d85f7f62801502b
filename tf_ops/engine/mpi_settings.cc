#include "engine/mpi_settings.h"

#include <mpi.h>

#include <cstdlib>
#include <mutex>

namespace hetsync {

namespace {

std::mutex applied_mu;
std::vector<std::string> applied;

// Writes one int control variable through the MPI tool interface; an empty string on success, else the reason.
std::string WriteCvar(const char* name, int value) {
#if defined(OPEN_MPI) && OPEN_MPI
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return "MPI_T_init_thread failed";
  std::string why;
  int index = -1;
  if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS) {
    why = "this MPI has no such parameter";
  } else {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) {
      why = "MPI_T_cvar_handle_alloc failed";
    } else {
      int now = -1;
      if (MPI_T_cvar_write(handle, &value) != MPI_SUCCESS) {
        why = "not writable at run time in this MPI";
      } else if (MPI_T_cvar_read(handle, &now) != MPI_SUCCESS || now != value) {
        why = "written but reads back " + std::to_string(now);
      }
      MPI_T_cvar_handle_free(&handle);
    }
  }
  // No MPI_T_finalize: in Open MPI 4.1 the last one tears down its parameter system under the running MPI (a later
  // MPI_Comm_dup hung on every rank).  The tool interface stays initialised, which costs nothing.
  return why;
#else
  (void)name;
  (void)value;
  return "not Open MPI";
#endif
}

}  // namespace

const std::vector<MpiSetting>& MpiSettings() {
  static const std::vector<MpiSetting> settings = {
      {"coll_libnbc_iallreduce_algorithm", 1,
       "ring for the engine's MPI_Iallreduce (OD-SGD's transfer, P-Reduce groups)"},
  };
  return settings;
}

std::vector<std::string> ApplyMpiSettings() {
  std::vector<std::string> lines;
  for (const auto& s : MpiSettings()) {
    const std::string env = std::string("OMPI_MCA_") + s.name;
    const char* user = std::getenv(env.c_str());
    if (user != nullptr) {
      lines.push_back(std::string(s.name) + "=" + user + " (user)");
      continue;
    }
    const std::string why = WriteCvar(s.name, s.value);
    lines.push_back(why.empty() ? std::string(s.name) + "=" + std::to_string(s.value) + " (hetsync)"
                                : std::string(s.name) + ": not applied (" + why + ")");
  }
  std::lock_guard<std::mutex> lock(applied_mu);
  applied = lines;
  return lines;
}

std::vector<std::string> AppliedMpiSettings() {
  std::lock_guard<std::mutex> lock(applied_mu);
  return applied;
}

}  // namespace hetsync
