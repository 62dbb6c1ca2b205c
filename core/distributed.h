// core/distributed.h: several processes training one model. A process group knows this process's
// rank among world_size() processes and runs collectives over tensors: the sums of all_reduce and
// reduce_scatter, all_gather, broadcast, barrier. CUDA tensors go through NCCL (one GPU per
// process), cpu tensors through MPI. Data parallelism and the sharded optimizer state built on
// these are in nn/parallel/data_parallel.h.
//
// Note [Starting a process group]
// ProcessGroup() reads the launcher's environment:
// - torchrun (TORCHELASTIC_RUN_ID; or RANK and WORLD_SIZE without an MPI launcher's variables; with
//   LOCAL_RANK, MASTER_ADDR, MASTER_PORT): no MPI. Rank 0 hands NCCL's unique id to the others over
//   TCP at MASTER_ADDR, port MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT;
//   NORMTAPE_RENDEZVOUS_PORT sets another; core/rendezvous.h). Only CUDA tensors have collectives
//   then (cpu tensors need MPI).
// - mpirun / mpiexec (OpenMPI's OMPI_COMM_WORLD_SIZE, MPICH's PMI_SIZE, PMIx's PMIX_RANK) or srun
//   (SLURM_STEP_NUM_TASKS): MPI is started (MPI_Init_thread, funneled) and gives the rank and the
//   world size; NCCL's unique id is broadcast through MPI. The local rank (the GPU a process takes)
//   is OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID.
// - neither: one process, rank 0 of 1. Collectives over cpu tensors are then local (a sum over one
//   rank is the tensor itself); over CUDA tensors they still go through NCCL, with one rank.
// A launcher that asks for more than one process in a build without MPI (NORMTAPE_WITH_MPI) or
// without NCCL for CUDA tensors (NORMTAPE_WITH_NCCL) is refused with DistributedError.
//
// Note [Collective timeouts]
// Every collective has a number, counted on each rank in the order it is called; every rank must
// call the same collectives in the same order with the same sizes (as with MPI and NCCL). When a
// collective is called, the rank also tells the others (a one-integer MPI message) that it reached
// number k. A wait that lasts longer than the group's timeout throws DistributedError naming the
// collective and the ranks that had not reached it (or, when all had, that their sizes or order
// must differ), and the group is then broken: every later collective throws at once, and the
// process should end (mpirun then ends the others). Without MPI (torchrun) the ranks cannot be
// named: the message says which collective did not finish. NCCL runs its communicator
// non-blocking, so that a timed-out collective can be aborted (ncclCommAbort) rather than hang.
//
// Threads: one thread calls the group, as everywhere in normtape.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace normtape {

namespace detail {
struct ProcessGroupState;  // core/distributed_internal.h
struct WorkState;
}  // namespace detail

// True when this build runs several processes through MPI (NORMTAPE_WITH_MPI: found by CMake),
// and CUDA tensors' collectives through NCCL (NORMTAPE_WITH_NCCL).
bool mpi_is_built();
bool nccl_is_built();

struct ProcessGroupOptions {
    // Seconds a collective (or the start of NCCL's communicator) may wait for the other ranks
    // before it throws DistributedError (Note [Collective timeouts]); > 0.
    double timeout_s = 600;
};

// A collective in flight: returned by the *_async functions, which queue the collective and return.
// It holds its tensors until it is done, so their bytes are not reused meanwhile; the caller must
// not read or write them until wait() returns.
// wait() blocks the calling thread until it is done (cpu: MPI_Wait, polled against the timeout; CUDA:
// until NCCL's kernel has finished on the GPU) and throws what the collective failed with. A Work
// destroyed before wait() waits, and reports a failure on stderr (a destructor cannot throw): call
// wait(). Movable, not copyable.
class [[nodiscard]] Work {
public:
    Work();
    explicit Work(std::unique_ptr<detail::WorkState> state);
    Work(Work&&) noexcept;
    Work& operator=(Work&&) noexcept;
    ~Work();
    // Throws DistributedError when the collective failed or timed out (Note [Collective
    // timeouts]). A second wait() returns at once.
    void wait();
    bool pending() const { return state_ != nullptr; }

private:
    std::unique_ptr<detail::WorkState> state_;
};

// The processes of one training job (Note [Starting a process group]). One per process at a time:
// MPI starts with the first one, NCCL's communicator with its first CUDA collective, and both end
// with it (MPI_Finalize, unless a collective timed out: the launcher then ends the job).
//
// Collectives take contiguous tensors of f32, f64, bf16 (sums in f32 arithmetic, rounded once per
// addition, as NCCL adds bf16) or i64; every rank passes tensors of the same dtype, device type and
// size. Input and output are apart, or exactly in place as each function says. A CUDA tensor must
// be on this process's GPU (device_index()). The collective runs in tensor order: the work queued
// on normtape's stream before it is done before it reads, and the work queued after its wait()
// waits for it (NCCL runs on a stream of its own, so that the queue can go on with other work
// meanwhile). Each throws Error naming it for an undefined or non-contiguous tensor, or input and
// output that overlap other than in place; DTypeError for a dtype it does not take or two tensors
// of different dtypes; DeviceError for two devices or a GPU other than this process's; ShapeError
// for sizes that do not fit; DistributedError when the group is broken, has no backend for the
// tensor's device (a cpu tensor without MPI at world_size() > 1) or NCCL / MPI report an error
// (its string quoted).
class ProcessGroup {
public:
    // Throws DistributedError when the environment names a launch this build cannot run, when MPI
    // runs fewer processes than the launcher started (OMPI_COMM_WORLD_SIZE, else PMI_SIZE, else
    // SLURM_STEP_NUM_TASKS: an MPI that falls back to singletons under srun) or other than
    // WORLD_SIZE says, or when MPI or the TCP rendezvous fails; Error for a timeout <= 0, or a
    // second group while one lives.
    explicit ProcessGroup(ProcessGroupOptions options = {});
    // A group of world_size ranks of which this process is `rank`, for a dry run (core/dry_run.h):
    // it starts nothing (no MPI, no NCCL; any number of them may live beside a real group), its
    // collectives check their tensors as a real group's do and send nothing, and outside a dry run
    // they throw Error. launcher() is "stand-in"; CUDA tensors are expected on GPU `device_index`.
    // Throws Error for world_size < 1 or a rank outside [0, world_size), DeviceError for a negative
    // device_index.
    static std::unique_ptr<ProcessGroup> stand_in(int rank, int world_size, int device_index = 0);
    ~ProcessGroup();
    ProcessGroup(const ProcessGroup&) = delete;
    ProcessGroup& operator=(const ProcessGroup&) = delete;

    int rank() const;
    int world_size() const;
    // The rank among this node's processes, the GPU this process uses: Device::cuda(device_index()).
    // It is local_rank modulo the GPUs visible (0 without a GPU).
    int local_rank() const;
    int device_index() const;
    // "mpi", "torchrun", "single" or "stand-in": how the group was started.
    const std::string& launcher() const;

    // t = the sum of every rank's t, on every rank, in place. [n] any shape; each element
    // summed in rank order within what NCCL's or MPI's algorithm chooses: every rank gets the same
    // bits from NCCL, and from MPI with 2 ranks (a + b = b + a); MPI does not promise it for more.
    void all_reduce(Tensor& t);
    Work all_reduce_async(Tensor& t);
    // output = the sum over ranks of input's rank()-th of world_size() equal parts: input [W * n]
    // (any shape, contiguous, numel divisible by W), output n elements (any shape). output may be
    // that very part of input (in place).
    void reduce_scatter(const Tensor& input, Tensor& output);
    Work reduce_scatter_async(const Tensor& input, Tensor& output);
    // output's r-th of W equal parts = rank r's input: input n elements, output W * n. input may
    // be output's rank()-th part (in place).
    void all_gather(const Tensor& input, Tensor& output);
    Work all_gather_async(const Tensor& input, Tensor& output);
    // t = root's t on every rank, in place. Throws Error for root outside [0, world_size()).
    void broadcast(Tensor& t, int root = 0);
    // Returns once every rank has called it (on the cpu side; with MPI, MPI_Ibarrier polled against the
    // timeout; with torchrun, an all_reduce of one element on this process's GPU).
    void barrier();

    // Collectives called so far (the number of the next one, Note [Collective timeouts]).
    int64_t collectives() const;

    // After an error on this rank only, ends the job rather than let the others wait for it until
    // their timeout: under MPI, MPI_Abort(code) (every process ends; this call does not return);
    // otherwise NCCL's communicator is aborted and the group broken, and the caller exits (torchrun
    // then ends the others). Nothing to do for one process.
    void abort(int code);

private:
    explicit ProcessGroup(std::unique_ptr<detail::ProcessGroupState> state);
    std::unique_ptr<detail::ProcessGroupState> state_;
};

}  // namespace normtape
