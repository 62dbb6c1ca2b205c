// core/distributed.cpp: the process group of core/distributed.h: how it starts from the
// launcher's environment (Note [Starting a process group]), how it ends, and how it is aborted.
// Not here: the collectives and their timeouts (core/collectives.cpp).
#include "core/distributed.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/distributed_internal.h"

namespace normtape {

namespace {

std::atomic<bool> group_alive{false};

// The value of environment variable `name` as an int, `fallback` when unset.
int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    NT_CHECK_AS(DistributedError, *end == '\0' && x >= 0 && x < (1 << 24), "ProcessGroup: expected environment variable ",
                name, " to be a rank or a count, got \"", v, "\"");
    return static_cast<int>(x);
}
bool env_set(const char* name) { return std::getenv(name) != nullptr; }

}  // namespace

namespace detail {

#if NORMTAPE_WITH_MPI
namespace {
// MPI has no bf16: the sum of two bf16 vectors, added in f32 and rounded once per addition.
void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
    const bf16* a = static_cast<const bf16*>(in);
    bf16* b = static_cast<bf16*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = bf16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}
}  // namespace
#endif

int rendezvous_port() {
    const int port = env_int("NORMTAPE_RENDEZVOUS_PORT", 0);
    return port > 0 ? port : env_int("MASTER_PORT", 0) + 1;
}

}  // namespace detail

bool mpi_is_built() {
#if NORMTAPE_WITH_MPI
    return true;
#else
    return false;
#endif
}
bool nccl_is_built() {
#if NORMTAPE_WITH_NCCL
    return true;
#else
    return false;
#endif
}

// ---------------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(ProcessGroupOptions options) : state_(std::make_unique<detail::ProcessGroupState>()) {
    NT_CHECK(std::isfinite(options.timeout_s) && options.timeout_s > 0,
             "ProcessGroup: expected timeout_s > 0 seconds, got ", options.timeout_s);
    NT_CHECK(!group_alive.exchange(true), "ProcessGroup: expected one process group per process, but one exists");
    detail::ProcessGroupState& s = *state_;
    s.options = options;
    try {
        // Note [Starting a process group]
        // torchrun's own variable first: torchrun may itself run under srun or mpirun.
        const bool by_torchrun = env_set("TORCHELASTIC_RUN_ID") ||
                                 (env_set("WORLD_SIZE") && env_set("RANK") && !env_set("OMPI_COMM_WORLD_SIZE") &&
                                  !env_set("PMI_SIZE") && !env_set("PMIX_RANK") && !env_set("SLURM_STEP_NUM_TASKS"));
        const bool by_mpi = !by_torchrun && (env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMI_SIZE") ||
                                             env_set("PMIX_RANK") || env_set("SLURM_STEP_NUM_TASKS"));
        if (by_mpi) {
            const int asked = std::max({env_int("OMPI_COMM_WORLD_SIZE", 1), env_int("PMI_SIZE", 1),
                                        env_int("SLURM_STEP_NUM_TASKS", 1)});
#if NORMTAPE_WITH_MPI
            int initialized = 0, finalized = 0;
            MPI_Initialized(&initialized);
            MPI_Finalized(&finalized);
            NT_CHECK_AS(DistributedError, !finalized,
                        "ProcessGroup: MPI was finalized by an earlier group; MPI starts once per process");
            if (!initialized) {
                int provided = 0;
                MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
                s.mpi = true;
            }
            MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm));
            MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.monitor));
            MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
            MPI_Comm_set_errhandler(s.monitor, MPI_ERRORS_RETURN);
            MPI_CHECK(MPI_Comm_rank(s.comm, &s.rank));
            MPI_CHECK(MPI_Comm_size(s.comm, &s.world));
            NT_CHECK_AS(DistributedError, !env_set("WORLD_SIZE") || env_int("WORLD_SIZE", 0) == s.world,
                        "ProcessGroup: MPI runs ", s.world, " processes but WORLD_SIZE says ", env_int("WORLD_SIZE", 0),
                        ": start the job with one launcher");
            // MPI must run at least the innermost launcher's count of processes (mpirun's own
            // variable first: mpirun may run inside an srun step, whose stale count is smaller). An
            // MPI that cannot reach the launcher (one built without its PMI, under srun) starts
            // each process as a singleton "rank 0 of 1": N jobs that would all write the same files.
            for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
                if (!env_set(var)) continue;
                NT_CHECK_AS(DistributedError, env_int(var, 0) <= s.world, "ProcessGroup: the launcher started ",
                            env_int(var, 0), " processes (", var, "), but MPI runs ", s.world,
                            ": this MPI does not belong to the launcher (under srun, an MPI built without Slurm's "
                            "PMI starts every process alone); launch with the MPI's own mpirun, or srun --mpi= "
                            "the PMI this MPI was built with");
                break;
            }
            MPI_CHECK(MPI_Op_create(&detail::bf16_sum_op, 1, &s.bf16_sum));
            s.reached.assign(s.world, -1);
            s.heard.assign(s.world, 0);
            s.launcher = "mpi";
            s.local_rank = std::max({env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0), env_int("MPI_LOCALRANKID", 0),
                                     env_int("SLURM_LOCALID", 0)});
#else
            NT_CHECK_AS(DistributedError, asked <= 1, "ProcessGroup: the job was started by mpirun or srun with ", asked,
                        " processes, but this build of normtape has no MPI (install libopenmpi-dev and rebuild)");
#endif
            (void)asked;
        } else if (by_torchrun) {
            s.world = env_int("WORLD_SIZE", 1);
            s.rank = env_int("RANK", 0);
            s.local_rank = env_int("LOCAL_RANK", 0);
            NT_CHECK_AS(DistributedError, s.world >= 1 && s.rank < s.world, "ProcessGroup: expected RANK < WORLD_SIZE, got ",
                        s.rank, " and ", s.world);
            if (s.world > 1) {
#if !NORMTAPE_WITH_NCCL
                detail::throw_error<DistributedError>(
                    "ProcessGroup: a torchrun-style launch (WORLD_SIZE ", s.world,
                    ") runs its collectives through NCCL, which this build of normtape lacks; launch with mpirun");
#endif
                NT_CHECK_AS(DistributedError, env_set("MASTER_ADDR") && env_set("MASTER_PORT"),
                            "ProcessGroup: a torchrun-style launch needs MASTER_ADDR and MASTER_PORT beside RANK and "
                            "WORLD_SIZE");
                s.launcher = "torchrun";
            }
        }
#if NORMTAPE_WITH_CUDA
        int gpus = 0;
        if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
            cudaGetLastError();
            gpus = 0;
        }
        s.device_index = gpus > 0 ? s.local_rank % gpus : 0;
#endif
    } catch (...) {
        group_alive = false;
        throw;
    }
}

ProcessGroup::ProcessGroup(std::unique_ptr<detail::ProcessGroupState> state) : state_(std::move(state)) {}

std::unique_ptr<ProcessGroup> ProcessGroup::stand_in(int rank, int world_size, int device_index) {
    NT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "ProcessGroup::stand_in: expected world_size >= 1 and "
             "a rank in [0, world_size), got world_size ", world_size, " and rank ", rank);
    NT_CHECK_AS(DeviceError, device_index >= 0, "ProcessGroup::stand_in: expected a GPU index >= 0, got ", device_index);
    auto s = std::make_unique<detail::ProcessGroupState>();
    s->launcher = "stand-in";
    s->rank = rank;
    s->world = world_size;
    s->local_rank = rank;
    s->device_index = device_index;
    return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(s)));
}

ProcessGroup::~ProcessGroup() {
    [[maybe_unused]] detail::ProcessGroupState& s = *state_;
    if (s.launcher == "stand-in") return;
#if NORMTAPE_WITH_NCCL
    if (s.nccl) {
        if (s.broken) ncclCommAbort(s.nccl);
        else ncclCommDestroy(s.nccl);
    }
    if (s.nccl_stream) cudaStreamDestroy(s.nccl_stream);
#endif
#if NORMTAPE_WITH_MPI
    if (s.comm != MPI_COMM_NULL && !s.broken) {
        // Every announcement sent, and every one sent here received, before MPI lets go of them.
        for (auto& [value, req] : s.sent) MPI_Wait(&req, MPI_STATUS_IGNORE);
        s.sent.clear();
        std::vector<int64_t> counts(s.world);
        MPI_Allgather(&s.next, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, s.monitor);
        for (int r = 0; r < s.world; ++r)
            for (int64_t n = 0; r != s.rank && s.heard[r] < counts[r]; ++s.heard[r])
                MPI_Recv(&n, 1, MPI_INT64_T, r, detail::kArrivalTag, s.monitor, MPI_STATUS_IGNORE);
        MPI_Op_free(&s.bf16_sum);
        MPI_Comm_free(&s.monitor);
        MPI_Comm_free(&s.comm);
        if (s.mpi) MPI_Finalize();
    }
#endif
    group_alive = false;
}

int ProcessGroup::rank() const { return state_->rank; }
int ProcessGroup::world_size() const { return state_->world; }
int ProcessGroup::local_rank() const { return state_->local_rank; }
int ProcessGroup::device_index() const { return state_->device_index; }
const std::string& ProcessGroup::launcher() const { return state_->launcher; }
int64_t ProcessGroup::collectives() const { return state_->next; }

void ProcessGroup::abort(int code) {
    detail::ProcessGroupState& s = *state_;
    if (s.world == 1 || s.launcher == "stand-in") return;
#if NORMTAPE_WITH_MPI
    if (s.comm != MPI_COMM_NULL) MPI_Abort(MPI_COMM_WORLD, code);
#endif
#if NORMTAPE_WITH_NCCL
    if (s.nccl) ncclCommAbort(s.nccl), s.nccl = nullptr;
#endif
    (void)code;
    s.broken = true;
    s.broken_why = "aborted after an error on this rank";
}

}  // namespace normtape
