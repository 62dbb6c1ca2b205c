// core/distributed_internal.h: what core/distributed.cpp (the group's start and end) and
// core/collectives.cpp (the collectives and their timeouts) share: the state behind ProcessGroup
// and Work, MPI_CHECK, the tag of the arrivals, rendezvous_port. Internal: not installed, not
// included by include/normtape.h. Both files must see the same NORMTAPE_WITH_MPI and
// NORMTAPE_WITH_NCCL (CMakeLists.txt sets them on both), since the structs' members depend on them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/distributed.h"

#if NORMTAPE_WITH_MPI
#include <mpi.h>
#endif
#if NORMTAPE_WITH_NCCL
#include <nccl.h>
#endif
#if NORMTAPE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace normtape::detail {

struct ProcessGroupState {
    ProcessGroupOptions options;
    std::string launcher = "single";
    int rank = 0, world = 1, local_rank = 0, device_index = 0;
    int64_t next = 0;     // the number of the next collective
    bool broken = false;  // a collective timed out or failed: nothing more runs
    std::string broken_why;
#if NORMTAPE_WITH_MPI
    bool mpi = false;                  // MPI was started by this group
    MPI_Comm comm = MPI_COMM_NULL;     // the collectives
    MPI_Comm monitor = MPI_COMM_NULL;  // the arrivals (Note [Collective timeouts])
    MPI_Op bf16_sum = MPI_OP_NULL;
    std::vector<int64_t> reached;      // per rank: the highest collective number it announced
    std::vector<int64_t> heard;        // per rank: the announcements received from it
    std::deque<std::pair<std::unique_ptr<int64_t>, MPI_Request>> sent;  // announcements in flight
#endif
#if NORMTAPE_WITH_NCCL
    ncclComm_t nccl = nullptr;
    cudaStream_t nccl_stream = nullptr;
#endif

    void check_usable(const char* op) const {
        NT_CHECK_AS(DistributedError, !broken, "ProcessGroup::", op, ": the group is broken (", broken_why,
                    "): end the process");
    }
    // Starts collective number `next`, telling the other ranks it was reached; returns its number.
    int64_t begin();
    // The ranks that had not announced collective `number`, after reading what arrived.
    std::vector<int> missing(int64_t number);
    // Marks the group broken and throws DistributedError for collective `number` (`what`).
    [[noreturn]] void timed_out(int64_t number, const std::string& what);
    double timeout_s() const { return options.timeout_s; }
#if NORMTAPE_WITH_NCCL
    // A non-blocking communicator's call returns ncclInProgress until its work is queued; the next
    // call must wait for that (polled against the timeout, as collective `number`).
    void nccl_settle(int64_t number, const std::string& what);
#endif
};

struct WorkState {
    ProcessGroupState* group = nullptr;
    int64_t number = 0;
    std::string what;  // "all_reduce of 1,024 f32", for messages
#if NORMTAPE_WITH_MPI
    MPI_Request request = MPI_REQUEST_NULL;
#endif
#if NORMTAPE_WITH_NCCL
    cudaEvent_t done = nullptr;
    int device = 0;
#endif
    bool local = false;             // world size 1 on the cpu: nothing to wait for
    std::function<void()> finish;   // run once the collective is done
    Tensor input, output;           // held until the collective is done: their bytes stay theirs
};

#if NORMTAPE_WITH_MPI
// Throws DistributedError naming `call` and MPI's message, unless `code` is MPI_SUCCESS.
inline void mpi_check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    detail::throw_error<DistributedError>("MPI error in ", call, ": ", std::string(msg, len));
}
// The tag of the announcements on ProcessGroupState::monitor (Note [Collective timeouts]).
inline constexpr int kArrivalTag = 7;
#define MPI_CHECK(call) ::normtape::detail::mpi_check((call), #call)
#endif

// Where rank 0 hands out NCCL's id under torchrun: NORMTAPE_RENDEZVOUS_PORT, else MASTER_PORT + 1
// (torchrun's own store listens on MASTER_PORT). Defined in core/distributed.cpp.
int rendezvous_port();

}  // namespace normtape::detail
