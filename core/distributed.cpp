// core/distributed.cpp: the process group of core/distributed.h: how it starts (Note [Starting a
// process group]), its collectives over MPI (cpu tensors) and NCCL (CUDA tensors), and their
// timeouts (Note [Collective timeouts]).
#include "core/distributed.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <deque>
#include <sstream>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/device_ptr.h"
#include "core/dry_run.h"
#include "core/rendezvous.h"

#if NORMTAPE_WITH_MPI
#include <mpi.h>
#endif
#if NORMTAPE_WITH_NCCL
#include <nccl.h>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#endif
#if NORMTAPE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace normtape {

namespace {

using clock = std::chrono::steady_clock;

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

// Where rank 0 hands out NCCL's id under torchrun: NORMTAPE_RENDEZVOUS_PORT, else MASTER_PORT + 1
// (torchrun's own store listens on MASTER_PORT).
[[maybe_unused]] int rendezvous_port() {
    const int port = env_int("NORMTAPE_RENDEZVOUS_PORT", 0);
    return port > 0 ? port : env_int("MASTER_PORT", 0) + 1;
}

[[maybe_unused]] std::string ranks_str(const std::vector<int>& ranks) {
    std::ostringstream s;
    for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
    return s.str();
}

}  // namespace

namespace detail {

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
namespace {
void mpi_check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    detail::throw_error<DistributedError>("MPI error in ", call, ": ", std::string(msg, len));
}
constexpr int kArrivalTag = 7;

// MPI has no bf16: the sum of two bf16 vectors, added in f32 and rounded once per addition.
void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
    const bf16* a = static_cast<const bf16*>(in);
    bf16* b = static_cast<bf16*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = bf16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}
}  // namespace
#define MPI_CHECK(call) ::normtape::detail::mpi_check((call), #call)
#endif

#if NORMTAPE_WITH_NCCL
namespace {
void nccl_check(ncclResult_t r, const char* call, ncclComm_t comm) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    detail::throw_error<DistributedError>("NCCL error in ", call, ": ", ncclGetErrorString(r),
                                          last && *last ? std::string(" (") + last + ")" : std::string());
}
}  // namespace
#define NCCL_CHECK(call, comm) ::normtape::detail::nccl_check((call), #call, (comm))
#endif

#if NORMTAPE_WITH_NCCL
void ProcessGroupState::nccl_settle(int64_t number, const std::string& what) {
    const auto deadline = clock::now() + std::chrono::duration<double>(options.timeout_s);
    for (;;) {
        ncclResult_t r = ncclInProgress;
        nccl_check(ncclCommGetAsyncError(nccl, &r), "ncclCommGetAsyncError", nccl);
        if (r == ncclSuccess) return;
        nccl_check(r, what.c_str(), nccl);
        if (clock::now() > deadline) timed_out(number, what);
        std::this_thread::yield();
    }
}
#endif

int64_t ProcessGroupState::begin() {
    const int64_t number = next++;
#if NORMTAPE_WITH_MPI
    if (comm != MPI_COMM_NULL && world > 1) {
        while (!sent.empty()) {  // let go of the announcements that have left
            int done = 0;
            MPI_CHECK(MPI_Test(&sent.front().second, &done, MPI_STATUS_IGNORE));
            if (!done) break;
            sent.pop_front();
        }
        for (int r = 0; r < world; ++r) {
            if (r == rank) continue;
            auto value = std::make_unique<int64_t>(number);
            MPI_Request req;
            MPI_CHECK(MPI_Isend(value.get(), 1, MPI_INT64_T, r, kArrivalTag, monitor, &req));
            sent.emplace_back(std::move(value), req);
        }
        reached[rank] = number;
    }
#endif
    return number;
}

std::vector<int> ProcessGroupState::missing(int64_t number) {
    std::vector<int> out;
#if NORMTAPE_WITH_MPI
    if (comm != MPI_COMM_NULL && world > 1) {
        for (;;) {
            int flag = 0;
            MPI_Status st;
            MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, monitor, &flag, &st);
            if (!flag) break;
            int64_t n = 0;
            MPI_Recv(&n, 1, MPI_INT64_T, st.MPI_SOURCE, kArrivalTag, monitor, MPI_STATUS_IGNORE);
            reached[st.MPI_SOURCE] = std::max(reached[st.MPI_SOURCE], n);
            ++heard[st.MPI_SOURCE];
        }
        for (int r = 0; r < world; ++r)
            if (reached[r] < number) out.push_back(r);
    }
#endif
    (void)number;
    return out;
}

void ProcessGroupState::timed_out(int64_t number, const std::string& what) {
    std::ostringstream why;
    why << "collective #" << number << " (" << what << ") on rank " << rank << " of " << world
        << " did not finish within " << options.timeout_s << " s: ";
#if NORMTAPE_WITH_MPI
    if (comm != MPI_COMM_NULL && world > 1) {
        std::vector<int> late = missing(number);
        if (!late.empty())
            why << (late.size() == 1 ? "rank " : "ranks ") << ranks_str(late) << (late.size() == 1 ? " has" : " have")
                << " not reached it";
        else
            why << "every rank reached it, so their collectives differ (order, sizes or dtypes)";
    } else
#endif
        why << "a rank did not reach it (the ranks are named when the job is started by mpirun or srun)";
#if NORMTAPE_WITH_NCCL
    if (nccl) ncclCommAbort(nccl), nccl = nullptr;  // its kernels stop; the communicator is gone
#endif
    broken = true;
    broken_why = why.str();
    throw DistributedError("ProcessGroup: " + broken_why);
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

// ---------------------------------------------------------------- Work

Work::Work() = default;
Work::Work(std::unique_ptr<detail::WorkState> state) : state_(std::move(state)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&& other) noexcept {
    if (this != &other) {
        if (state_) {
            try {
                wait();
            } catch (const std::exception& e) {
                std::fprintf(stderr, "normtape: a collective that was never waited for failed: %s\n", e.what());
            }
        }
        state_ = std::move(other.state_);
    }
    return *this;
}
Work::~Work() {
    if (!state_) return;
    try {
        wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "normtape: a collective that was never waited for failed: %s\n", e.what());
    }
}

void Work::wait() {
    if (!state_) return;
    std::unique_ptr<detail::WorkState> s = std::move(state_);
    if (s->local) return;
    detail::ProcessGroupState& g = *s->group;
    s->group->check_usable("wait");
    [[maybe_unused]] const auto deadline = clock::now() + std::chrono::duration<double>(g.timeout_s());
    [[maybe_unused]] auto idle = [polls = 0]() mutable {  // spin a little, then sleep between polls
        if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    };
#if NORMTAPE_WITH_NCCL
    if (s->done) {
        for (;;) {
            cudaError_t e = cudaEventQuery(s->done);
            if (e == cudaSuccess) break;
            NT_CHECK_AS(DistributedError, e == cudaErrorNotReady, "ProcessGroup: ", s->what, ": CUDA error ",
                        cudaGetErrorString(e));
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(g.nccl, &async);
            if (async != ncclSuccess && async != ncclInProgress) {
                g.broken = true;
                g.broken_why = std::string("NCCL: ") + ncclGetErrorString(async);
                detail::nccl_check(async, s->what.c_str(), g.nccl);
            }
            if (clock::now() > deadline) {
                cudaEventDestroy(s->done);
                g.timed_out(s->number, s->what);
            }
            g.missing(s->number);  // read the announcements as they come
            idle();
        }
        // The work queued after the collective waits for it (Note on ProcessGroup: tensor order).
        CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(s->device), s->done, 0));
        CUDA_CHECK(cudaEventDestroy(s->done));
        return;
    }
#endif
#if NORMTAPE_WITH_MPI
    for (;;) {
        int done = 0;
        MPI_CHECK(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE));
        if (done) break;
        if (clock::now() > deadline) g.timed_out(s->number, s->what);
        g.missing(s->number);
        idle();
    }
    if (s->finish) s->finish();
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

namespace {

enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast };
const char* op_name(Op op) {
    switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllGather: return "all_gather";
    case Op::Broadcast: return "broadcast";
    }
    return "?";
}

std::string with_commas(int64_t n) {
    std::string s = std::to_string(n), out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

// The checks every collective makes on a tensor it reads or writes.
void check_tensor(Op op, const char* arg, const Tensor& t, int device_index) {
    NT_CHECK(t.defined(), "ProcessGroup::", op_name(op), ": expected a defined ", arg, ", got an undefined tensor");
    NT_CHECK(t.is_contiguous(), "ProcessGroup::", op_name(op), ": expected a contiguous ", arg,
             ", got one of strides that are not row-major");
    const DType d = t.dtype();
    NT_CHECK_AS(DTypeError, d == DType::F32 || d == DType::F64 || d == DType::BF16 || d == DType::I64,
                "ProcessGroup::", op_name(op), ": expected ", arg, " of dtype f32, f64, bf16 or i64, got ", dtype_name(d));
    NT_CHECK_AS(DeviceError, t.device().is_cpu() || t.device().index == device_index, "ProcessGroup::", op_name(op),
                ": expected ", arg, " on this process's GPU ", device_name(Device::cuda(device_index)), ", got ",
                device_name(t.device()));
}

}  // namespace

// One function for the four collectives: checks, numbering, then MPI or NCCL.
static Work start_collective(detail::ProcessGroupState& s, Op op, const Tensor& in, const Tensor& out,
                             [[maybe_unused]] int root) {
    const char* name = op_name(op);
    check_tensor(op, "input", in, s.device_index);
    check_tensor(op, "output", out, s.device_index);
    NT_CHECK_AS(DTypeError, in.dtype() == out.dtype(), "ProcessGroup::", name,
                ": expected input and output of one dtype, got ", dtype_name(in.dtype()), " and ",
                dtype_name(out.dtype()));
    NT_CHECK_AS(DeviceError, in.device() == out.device(), "ProcessGroup::", name,
                ": expected input and output on one device, got ", device_name(in.device()), " and ",
                device_name(out.device()));
    const int64_t W = s.world;
    const int64_t n = op == Op::ReduceScatter ? out.numel() : in.numel();  // the elements one rank gives or gets
    if (op == Op::ReduceScatter)
        NT_CHECK_AS(ShapeError, in.numel() == W * n, "ProcessGroup::reduce_scatter: expected input of world_size (", W,
                    ") x output's ", n, " elements, got ", in.numel());
    if (op == Op::AllGather)
        NT_CHECK_AS(ShapeError, out.numel() == W * n, "ProcessGroup::all_gather: expected output of world_size (", W,
                    ") x input's ", n, " elements, got ", out.numel());
    if (op == Op::AllReduce || op == Op::Broadcast)
        NT_CHECK_AS(ShapeError, in.numel() == out.numel(), "ProcessGroup::", name, ": expected one tensor");
    const size_t esize = element_size(in.dtype());
    // Addresses only compared, never read: a dry run's tensors have them too.
    auto address = [esize](const Tensor& t) { return static_cast<char*>(t.storage()->data()) + t.impl().offset * esize; };
    char* inp = address(in);
    char* outp = address(out);
    // In place means exactly: one tensor (all_reduce, broadcast), the output this rank's part of the
    // input (reduce_scatter), the input this rank's part of the output (all_gather). Any other overlap
    // is refused: MPI and NCCL would read what they have already written.
    const int64_t part_bytes = n * static_cast<int64_t>(esize);
    const bool in_place = inp == outp || (op == Op::ReduceScatter && inp + s.rank * part_bytes == outp) ||
                          (op == Op::AllGather && outp + s.rank * part_bytes == inp);
    const bool overlap = inp < outp + out.nbytes() && outp < inp + in.nbytes();
    NT_CHECK(in_place || !overlap, "ProcessGroup::", name, ": expected input and output apart or exactly in place (",
             op == Op::ReduceScatter ? "the output this rank's part of the input"
             : op == Op::AllGather   ? "the input this rank's part of the output"
                                     : "one tensor",
             "), got bytes that overlap otherwise");
    s.check_usable(name);
    auto work = std::make_unique<detail::WorkState>();
    work->group = &s;
    work->what = std::string(name) + " of " + with_commas(n) + " " + dtype_name(in.dtype()) + " elements";
    work->input = in;
    work->output = out;
    if (s.launcher == "stand-in") {  // Note [The dry run]: checked and numbered, nothing sent
        NT_CHECK(is_dry_run(), "ProcessGroup::", name, ": a stand-in group (ProcessGroup::stand_in) serves dry runs "
                 "only (core/dry_run.h), got a collective outside one");
        s.begin();
        work->local = true;
        return Work(std::move(work));
    }

    if (in.device().is_cuda()) {
#if NORMTAPE_WITH_NCCL
        const int dev = s.device_index;
        if (!s.nccl) {  // the communicator starts with the first CUDA collective
            const int64_t number = s.begin();
            ncclUniqueId id;
            if (s.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
            std::string blob(reinterpret_cast<const char*>(&id), sizeof id);
#if NORMTAPE_WITH_MPI
            if (s.launcher == "mpi") {
                auto w = std::make_unique<detail::WorkState>();
                w->group = &s;
                w->number = number;
                w->what = "the broadcast of NCCL's unique id";
                MPI_CHECK(MPI_Ibcast(blob.data(), static_cast<int>(blob.size()), MPI_BYTE, 0, s.comm, &w->request));
                Work(std::move(w)).wait();
            }
#endif
            if (s.launcher == "torchrun")
                blob = detail::tcp_rendezvous(std::getenv("MASTER_ADDR"), rendezvous_port(), s.rank, s.world, blob,
                                              s.timeout_s());
            std::memcpy(&id, blob.data(), sizeof id);
            cuda::stream(dev);  // makes the device current
            CUDA_CHECK(cudaStreamCreateWithFlags(&s.nccl_stream, cudaStreamNonBlocking));
            ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
            config.blocking = 0;  // Note [Collective timeouts]: a start that hangs can be aborted
            NCCL_CHECK(ncclCommInitRankConfig(&s.nccl, s.world, id, s.rank, &config), nullptr);
            s.nccl_settle(number, "the start of NCCL's communicator");
        }
        work->device = dev;
        const ncclDataType_t type = in.dtype() == DType::F32    ? ncclFloat32
                                    : in.dtype() == DType::F64  ? ncclFloat64
                                    : in.dtype() == DType::BF16 ? ncclBfloat16
                                                                : ncclInt64;
        cudaStream_t compute = cuda::stream(dev);
        cudaEvent_t ready;
        CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(ready, compute));  // the collective reads what was queued before it
        CUDA_CHECK(cudaStreamWaitEvent(s.nccl_stream, ready, 0));
        CUDA_CHECK(cudaEventDestroy(ready));
        const size_t count = static_cast<size_t>(n);
        work->number = s.begin();
        ncclResult_t r = ncclSuccess;
        switch (op) {
        case Op::AllReduce: r = ncclAllReduce(inp, outp, count, type, ncclSum, s.nccl, s.nccl_stream); break;
        case Op::ReduceScatter: r = ncclReduceScatter(inp, outp, count, type, ncclSum, s.nccl, s.nccl_stream); break;
        case Op::AllGather: r = ncclAllGather(inp, outp, count, type, s.nccl, s.nccl_stream); break;
        case Op::Broadcast: r = ncclBroadcast(inp, outp, count, type, root, s.nccl, s.nccl_stream); break;
        }
        if (r != ncclSuccess && r != ncclInProgress) {  // the ranks' collectives no longer match
            s.broken = true;
            s.broken_why = std::string(name) + " failed in NCCL";
            detail::nccl_check(r, name, s.nccl);
        }
        if (r == ncclInProgress) s.nccl_settle(work->number, work->what);
        CUDA_CHECK(cudaEventCreateWithFlags(&work->done, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(work->done, s.nccl_stream));
        return Work(std::move(work));
#else
        detail::throw_error<DistributedError>("ProcessGroup::", name,
                                              ": CUDA tensors need NCCL, which this build of normtape lacks");
#endif
    }

    if (s.world == 1) {  // a one-rank group on the cpu: the collective is a copy, or nothing
        work->number = s.begin();
        if (inp != outp) std::memcpy(outp, inp, static_cast<size_t>(n) * esize);
        work->local = true;
        return Work(std::move(work));
    }
#if NORMTAPE_WITH_MPI
    NT_CHECK_AS(DistributedError, s.launcher == "mpi", "ProcessGroup::", name,
                ": cpu tensors need MPI, and this job was started by ", s.launcher, "; start it with mpirun");
    NT_CHECK_AS(ShapeError, n <= INT32_MAX, "ProcessGroup::", name, ": expected at most 2^31 - 1 elements a rank, got ",
                n);
    work->number = s.begin();
    const int count = static_cast<int>(n);
    const DType d = in.dtype();
    const MPI_Datatype type = d == DType::F32    ? MPI_FLOAT
                              : d == DType::F64  ? MPI_DOUBLE
                              : d == DType::BF16 ? MPI_UINT16_T  // summed by bf16_sum_op
                                                 : MPI_INT64_T;
    MPI_Op sum = d == DType::BF16 ? s.bf16_sum : MPI_SUM;
    switch (op) {
    case Op::AllReduce:
        MPI_CHECK(MPI_Iallreduce(in_place ? MPI_IN_PLACE : inp, outp, count, type, sum, s.comm, &work->request));
        break;
    case Op::ReduceScatter:
        // In place, MPI takes the input from the receive buffer and writes the result at its start: moved to
        // this rank's part when done.
        MPI_CHECK(MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : inp, in_place ? inp : outp, count, type, sum,
                                            s.comm, &work->request));
        if (in_place && inp != outp) work->finish = [inp, outp, bytes = static_cast<size_t>(n) * esize] {
            std::memmove(outp, inp, bytes);
        };
        break;
    case Op::AllGather:
        MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : inp, count, type, outp, count, type, s.comm, &work->request));
        break;
    case Op::Broadcast:
        if (inp != outp) std::memcpy(outp, inp, static_cast<size_t>(n) * esize);
        MPI_CHECK(MPI_Ibcast(outp, count, type, root, s.comm, &work->request));
        break;
    }
    return Work(std::move(work));
#else
    detail::throw_error<DistributedError>("ProcessGroup::", name, ": this build of normtape has no MPI");
#endif
}

Work ProcessGroup::all_reduce_async(Tensor& t) { return start_collective(*state_, Op::AllReduce, t, t, 0); }
Work ProcessGroup::reduce_scatter_async(const Tensor& input, Tensor& output) {
    return start_collective(*state_, Op::ReduceScatter, input, output, 0);
}
Work ProcessGroup::all_gather_async(const Tensor& input, Tensor& output) {
    return start_collective(*state_, Op::AllGather, input, output, 0);
}
void ProcessGroup::all_reduce(Tensor& t) { all_reduce_async(t).wait(); }
void ProcessGroup::reduce_scatter(const Tensor& input, Tensor& output) { reduce_scatter_async(input, output).wait(); }
void ProcessGroup::all_gather(const Tensor& input, Tensor& output) { all_gather_async(input, output).wait(); }
void ProcessGroup::broadcast(Tensor& t, int root) {
    NT_CHECK(root >= 0 && root < state_->world, "ProcessGroup::broadcast: expected a root rank in [0, ",
             state_->world, "), got ", root);
    start_collective(*state_, Op::Broadcast, t, t, root).wait();
}

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

void ProcessGroup::barrier() {
    detail::ProcessGroupState& s = *state_;
    s.check_usable("barrier");
#if NORMTAPE_WITH_MPI
    if (s.launcher == "mpi") {
        auto w = std::make_unique<detail::WorkState>();
        w->group = &s;
        w->number = s.begin();
        w->what = "barrier";
        MPI_CHECK(MPI_Ibarrier(s.comm, &w->request));
        Work(std::move(w)).wait();
        return;
    }
#endif
    if (s.launcher == "stand-in") {
        NT_CHECK(is_dry_run(), "ProcessGroup::barrier: a stand-in group (ProcessGroup::stand_in) serves dry runs only "
                 "(core/dry_run.h), got a barrier outside one");
        s.begin();
        return;
    }
    if (s.launcher == "torchrun") {
        Tensor one = zeros({1}, TensorOptions().dtype(DType::F32).device(Device::cuda(s.device_index)));
        all_reduce(one);
        synchronize(Device::cuda(s.device_index));
        return;
    }
    s.begin();  // one process: nothing to wait for
}

}  // namespace normtape
