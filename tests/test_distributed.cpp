// tests/test_distributed.cpp: the process group (core/distributed.h) and data parallelism
// (nn/parallel/data_parallel.h). In one process: a group of one rank, its checks, the bucket plan, and
// DataParallel against plain training. Under mpirun -np 2 (the "worker" cases, which skip
// themselves outside mpirun, run by the cases that start them): the collectives' values, a
// collective timing out and naming the rank that never came, data parallel against one process
// with the doubled batch in f64, and ZeRO-1 against plain data parallel.
#include <doctest/doctest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "normtape.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

bool under_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

// The shell words that start what follows on `ranks` processes under mpirun, killed after
// `timeout_s`. As root (CI) OpenMPI asks for its consent; under AddressSanitizer, its own
// allocations that outlive MPI_Finalize are not ours to report.
std::string mpirun(int ranks, int timeout_s) {
    return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
           "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" timeout " + std::to_string(timeout_s) +
           " mpirun -np " + std::to_string(ranks) + " ";
}

// Runs the worker test case `name` of this binary under `mpirun -np 2`; returns its exit code and
// output (stdout and stderr together).
RunResult run_worker(const TempDir& dir, const std::string& name) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string out = dir / "stdout";
    const std::string cmd = mpirun(2, 120) + self + " --no-colors '-tc=" + name + "' > " + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    return RunResult{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), ""};
}

bool mpirun_available() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

// train_gpt on `ranks` processes (mpirun -np ranks; 1: without mpirun) with `args`, in `dir`.
RunResult run_train_gpt_on(const TempDir& dir, int ranks, const std::string& args) {
    const std::string out = dir / "stdout", err = dir / "stderr";
    const std::string cmd = "cd " + dir.path.string() + " && " + (ranks == 1 ? "" : mpirun(ranks, 300)) +
                            NORMTAPE_TRAIN_GPT + " " + args + " > " + out + " 2> " + err;
    const int status = std::system(cmd.c_str());
    return RunResult{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

std::vector<double> losses_of(const std::string& json_path) {
    std::ifstream f(json_path);
    return nlohmann::json::parse(f)["runs"][0]["losses"].get<std::vector<double>>();
}

// The largest |a - b| / |b| over two lists of losses of one length.
double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
    return worst;
}

// The demo model of the train_gpt cases: two layers on random tokens, f32 on the cpu.
const std::string kDemo = "--data random --device cpu --steps 6 --layers 2 --embd 32 --heads 2 --seq 16 --log-every 1 "
                          "--policy input --threads 1 --chart run.svg ";

#define REQUIRE_MPIRUN_OR_SKIP()                                                         \
    do {                                                                                 \
        if (!mpi_is_built()) SKIP_TEST("this build has no MPI (NORMTAPE_WITH_MPI)");         \
        if (!mpirun_available()) SKIP_TEST("mpirun is not installed (Debian: openmpi-bin)"); \
    } while (0)

// A small f64 GPT (no dropout) and a batch of B rows drawn from `seed`.
GPTConfig tiny_config() {
    GPTConfig c = gpt_config("gpt2");
    c.vocab_size = 64;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.dtype = DType::F64;
    return c;
}

}  // namespace

TEST_SUITE("distributed") {

TEST_CASE("distributed: a group of one process runs every collective as a copy") {
    if (under_mpirun()) SKIP_TEST("runs in one process");
    ProcessGroup group;
    CHECK(group.rank() == 0);
    CHECK(group.world_size() == 1);
    CHECK(group.launcher() == "single");
    Tensor t = from_vector<float>({1, 2, 3, 4}, {4});
    group.all_reduce(t);
    CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    Tensor out = zeros({4});
    group.reduce_scatter(t, out);
    CHECK(out.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    Tensor gathered = zeros({4});
    group.all_gather(t, gathered);
    CHECK(gathered.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    group.broadcast(t, 0);
    group.barrier();
    CHECK(group.collectives() == 5);

    // Bad input, each naming the collective and what it expected.
    Tensor strided = zeros({4, 4}).transpose(0, 1);
    CHECK_THROWS_KIND_WITH(group.all_reduce(strided), Error, "all_reduce", "contiguous");
    Tensor ints = zeros({4}, TensorOptions().dtype(DType::I64));
    CHECK_THROWS_KIND_WITH(group.reduce_scatter(t, ints), DTypeError, "reduce_scatter", "one dtype");
    Tensor three = zeros({3});
    CHECK_THROWS_KIND_WITH(group.all_gather(t, three), ShapeError, "all_gather", "world_size");
    CHECK_THROWS_KIND_WITH(group.broadcast(t, 1), Error, "broadcast", "root");
    Tensor undefined;
    CHECK_THROWS_KIND_WITH(group.all_reduce(undefined), Error, "all_reduce", "defined");
    // In place is one layout exactly; any other overlap is refused.
    Tensor buffer = zeros({4});
    Tensor own = buffer.narrow(0, 0, 2), shifted = buffer.narrow(0, 1, 2);
    group.all_gather(own, own);  // this rank's part of the output: rank 0 of 1, the whole of it
    CHECK_THROWS_KIND_WITH(group.all_gather(shifted, own), Error, "all_gather", "overlap");
    CHECK_THROWS_KIND_WITH(group.reduce_scatter(own, shifted), Error, "reduce_scatter", "overlap");
    CHECK(group.collectives() == 6);  // a refused collective is not counted
    CHECK_THROWS_KIND_WITH(ProcessGroup(), Error, "one process group per process");
    group.abort(1);  // one process: nothing to end
    group.barrier();
}

TEST_CASE("distributed: a group of one process runs NCCL's collectives on its GPU") {
    if (under_mpirun()) SKIP_TEST("runs in one process");
    REQUIRE_CUDA_OR_SKIP();
    ProcessGroup group;
    const Device device = Device::cuda(group.device_index());
    const TensorOptions gpu = TensorOptions().device(device);
    for (DType dtype : {DType::F32, DType::BF16}) {
        Tensor t = from_vector<float>({1, 2, 3, 4}, {4}).to(dtype).to(device);
        group.all_reduce(t);
        CHECK(t.to(DType::F32).to(Device::CPU).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
        Tensor gathered = zeros({4}, TensorOptions(gpu).dtype(dtype));
        group.all_gather(t, gathered);
        CHECK(gathered.to(DType::F32).to(Device::CPU).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
        Tensor part = zeros({4}, TensorOptions(gpu).dtype(dtype));
        group.reduce_scatter(t, part);
        CHECK(part.to(DType::F32).to(Device::CPU).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    }
    Tensor ids = full({3}, 7.0, TensorOptions(gpu).dtype(DType::I64));
    group.broadcast(ids, 0);
    CHECK(ids.to(Device::CPU).to_vector<int64_t>() == std::vector<int64_t>{7, 7, 7});
    Tensor cpu = zeros({4}), on_gpu = zeros({4}, gpu);
    CHECK_THROWS_KIND_WITH(group.all_gather(cpu, on_gpu), DeviceError, "one device");
}

TEST_CASE("distributed: a group refuses a timeout that is not positive") {
    if (under_mpirun()) SKIP_TEST("runs in one process");
    ProcessGroupOptions options;
    options.timeout_s = 0;
    CHECK_THROWS_KIND_WITH(ProcessGroup{options}, Error, "timeout_s > 0");
    options.timeout_s = std::nan("");
    CHECK_THROWS_KIND_WITH(ProcessGroup{options}, Error, "timeout_s > 0");
}

TEST_CASE("distributed: plan_buckets cuts AdamW's parameters at the cap and Muon's matrices by world_size") {
    // The model's order: two vectors, four matrices of one shape, a vector; walked in reverse.
    std::vector<BucketParam> params = {{10, false}, {6, false}, {12, true, 3, 4}, {12, true, 3, 4},
                                       {12, true, 3, 4}, {12, true, 3, 4}, {5, false}};
    const std::vector<BucketPlan> b = plan_buckets(params, 4, 2, 40);
    REQUIRE(b.size() == 4);
    // Matrices 5, 4 close a bucket first (two of one shape); then 3, 2.
    CHECK(b[0].matrices);
    CHECK(b[0].params == std::vector<size_t>{5, 4});
    CHECK(b[0].offsets == std::vector<int64_t>{0, 12});
    CHECK(b[0].part == 12);
    CHECK(b[1].params == std::vector<size_t>{3, 2});
    // AdamW's: 5 + 6 elements (44 bytes >= 40) close, then 10 alone at the end.
    CHECK_FALSE(b[2].matrices);
    CHECK(b[2].params == std::vector<size_t>{6, 1});
    CHECK(b[2].offsets == std::vector<int64_t>{0, 5});
    CHECK(b[2].part == 6);  // ceil(11 / 2)
    CHECK(b[3].params == std::vector<size_t>{0});
    CHECK(b[3].part == 5);
    // Rank 1's shards: the second matrix of each Muon bucket, elements [6, 11) of bucket 2 (all
    // parameter 1's), [5, 10) of bucket 3.
    const std::vector<ShardPlan> s = plan_shards(b, params, 1);
    REQUIRE(s.size() == 4);
    CHECK(s[0].param == 4);
    CHECK(s[1].param == 2);
    CHECK((s[2].param == 1 && s[2].param_offset == 1 && s[2].part_offset == 0 && s[2].numel == 5));
    CHECK((s[3].param == 0 && s[3].param_offset == 5 && s[3].numel == 5));
    // Three ranks: a Muon bucket of three, then one short of world_size.
    const std::vector<BucketPlan> three = plan_buckets(params, 4, 3, 1 << 20);
    CHECK(three[0].params == std::vector<size_t>{5, 4, 3});
    CHECK(three[2].params == std::vector<size_t>{2});
    CHECK_THROWS_KIND_WITH(plan_buckets(params, 4, 0, 40), Error, "world_size >= 1");
}

TEST_CASE("distributed: DataParallel on one process trains as without it (ZeRO-1: to the rounding of the norm)") {
    if (under_mpirun()) SKIP_TEST("runs in one process");
    ProcessGroup group;
    for (bool shard : {false, true}) {
        CAPTURE(shard);
        const GPTConfig c = tiny_config();
        manual_seed(5);
        GPT plain(c);
        manual_seed(5);
        GPT model(c);
        AdamW reference(plain.parameters(), AdamWOptions{});
        DataParallelOptions options;
        options.shard_optimizer_state = shard;
        options.bucket_cap_bytes = 4096;  // several buckets
        DataParallel dp(group, model.parameters(), {{model.parameters(), 0.01}}, {}, options);
        CHECK(dp.buckets() > 1);
        AdamW optimizer(dp.adamw_groups(), AdamWOptions{});
        TokenBatch batch = token_batch(c, 3, 8);
        for (int step = 0; step < 3; ++step) {
            plain.loss(batch.idx, batch.targets).backward();
            clip_grad_norm_tensor_(plain.parameters(), 1.0);
            reference.step();
            reference.zero_grad();
            model.loss(batch.idx, batch.targets).backward();
            dp.finish_gradients();
            dp.clip_grad_norm_(1.0);
            optimizer.step();
            dp.after_step();
            optimizer.zero_grad();
        }
        // ZeRO-1's gradient norm adds its shards' squares in another order: the clipping factor,
        // and so the parameters, agree to rounding.
        // Two backwards with sync on would reduce the first one's gradients only: refused.
        model.loss(batch.idx, batch.targets).backward();
        CHECK_THROWS_KIND_WITH(model.loss(batch.idx, batch.targets).backward(), Error, "second gradient", "set_sync(false)");
        const std::vector<Tensor> a = plain.parameters(), b = model.parameters();
        for (size_t k = 0; k < a.size(); ++k) {
            if (!shard) CHECK(a[k].to_vector<double>() == b[k].to_vector<double>());
            else CHECK_CLOSE(b[k], a[k], (Tolerance{1e-13, 1e-13}));
        }
    }
}

TEST_CASE("distributed: predict_peak refuses a rank outside the world and ZeRO-1 on one rank") {
    GPTConfig c = tiny_config();
    MemorySettings s;
    s.world_size = 0;
    CHECK_THROWS_KIND_WITH(predict_peak(c, s, 2, 8), Error, "predict_peak", "world_size >= 1");
    s.world_size = 2;
    s.rank = 2;
    CHECK_THROWS_KIND_WITH(predict_peak(c, s, 2, 8), Error, "predict_peak", "rank 2");
    s.world_size = 1;
    s.rank = 0;
    s.shard_optimizer_state = true;
    CHECK_THROWS_KIND_WITH(predict_peak(c, s, 2, 8), Error, "predict_peak", "shard_optimizer_state");
}

TEST_CASE("distributed: DataParallel refuses parameters it cannot bucket") {
    if (under_mpirun()) SKIP_TEST("runs in one process");
    ProcessGroup group;
    Tensor a = zeros({4}).requires_grad_(), b = zeros({4}).requires_grad_();
    CHECK_THROWS_KIND_WITH(DataParallel(group, {}, {}, {}), Error, "DataParallel", "parameters");
    CHECK_THROWS_KIND_WITH(DataParallel(group, {a, b}, {{{a}, 0.0}}, {}), Error, "DataParallel", "no optimizer group");
    CHECK_THROWS_KIND_WITH(DataParallel(group, {a}, {{{a}, 0.0}, {{a}, 0.0}}, {}), Error, "in two groups");
    Tensor f64 = zeros({4}, TensorOptions().dtype(DType::F64)).requires_grad_();
    CHECK_THROWS_KIND_WITH(DataParallel(group, {a, f64}, {{{a, f64}, 0.0}}, {}), DTypeError, "one dtype");
    Tensor c = zeros({4});
    CHECK_THROWS_KIND_WITH(DataParallel(group, {c}, {{{c}, 0.0}}, {}), Error, "requires grad");
}

// ---------------------------------------------------------------- under mpirun -np 2

TEST_CASE("distributed worker: collectives") {
    if (!under_mpirun()) SKIP_TEST("runs under mpirun (started by 'distributed: mpirun ...')");
    ProcessGroup group;
    REQUIRE(group.world_size() == 2);
    const int r = group.rank();
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
        CAPTURE(dtype_name(dtype));
        Tensor t = full({5}, r + 1.5, TensorOptions().dtype(dtype));
        group.all_reduce(t);
        CHECK(t.to(DType::F64).to_vector<double>() == std::vector<double>(5, 4.0));  // 1.5 + 2.5
        Tensor in = from_vector<double>({1.0 + r, 2.0 + r, 3.0 + r, 4.0 + r}, {4}).to(dtype);
        Tensor out = zeros({2}, TensorOptions().dtype(dtype));
        group.reduce_scatter(in, out);  // sums 3 5 7 9; rank 0 gets 3 5, rank 1 gets 7 9
        CHECK(out.to(DType::F64).to_vector<double>() == (r == 0 ? std::vector<double>{3, 5} : std::vector<double>{7, 9}));
        Tensor all = zeros({4}, TensorOptions().dtype(dtype));
        Tensor mine = full({2}, 10.0 * r, TensorOptions().dtype(dtype));
        group.all_gather(mine, all);
        CHECK(all.to(DType::F64).to_vector<double>() == std::vector<double>{0, 0, 10, 10});
        // In place: the rank's own part of the buffer.
        Tensor buffer = from_vector<double>({1.0 + r, 2.0 + r, 3.0 + r, 4.0 + r}, {4}).to(dtype);
        Tensor part = buffer.narrow(0, 2 * r, 2);
        group.reduce_scatter(buffer, part);
        CHECK(part.to(DType::F64).to_vector<double>() == (r == 0 ? std::vector<double>{3, 5} : std::vector<double>{7, 9}));
        group.all_gather(part, buffer);
        CHECK(buffer.to(DType::F64).to_vector<double>() == std::vector<double>{3, 5, 7, 9});
    }
    Tensor ids = full({3}, 7.0 * r, TensorOptions().dtype(DType::I64));
    group.broadcast(ids, 1);
    CHECK(ids.to_vector<int64_t>() == std::vector<int64_t>{7, 7, 7});
    group.barrier();
}

TEST_CASE("distributed worker: timeout") {
    if (!under_mpirun()) SKIP_TEST("runs under mpirun (started by 'distributed: mpirun ...')");
    ProcessGroupOptions options;
    options.timeout_s = 2;
    ProcessGroup group(options);
    Tensor t = ones({4});
    if (group.rank() == 1) {  // never reaches the collective; the launcher ends it when rank 0 exits
        sleep(30);
        return;
    }
    try {
        group.all_reduce(t);
        FAIL("expected a timeout");
    } catch (const DistributedError& e) {
        std::printf("timed out: %s\n", e.what());
        std::fflush(stdout);
        std::_Exit(0);  // a broken group: the job ends here
    }
}

// Data parallel on 2 ranks of 2 rows each against one process with the 4 rows, in f64; ZeRO-1
// against plain data parallel, AdamW and Muon.
TEST_CASE("distributed worker: data parallel") {
    if (!under_mpirun()) SKIP_TEST("runs under mpirun (started by 'distributed: mpirun ...')");
    ProcessGroup group;
    const int r = group.rank();
    const GPTConfig c = tiny_config();
    manual_seed(3);
    TokenBatch batch = token_batch(c, 4, 8);
    Tensor my_idx = batch.idx.narrow(0, 2 * r, 2).clone(), my_targets = batch.targets.narrow(0, 2 * r, 2).clone();
    for (const char* opt : {"adamw", "muon"}) {
        CAPTURE(opt);
        const bool use_muon = std::string(opt) == "muon";
        std::vector<double> losses[3], params[3];
        for (int mode = 0; mode < 3; ++mode) {  // one process with 4 rows; data parallel; ZeRO-1
            manual_seed(11);
            GPT model(c);
            const MuonParamSplit split = param_groups_for_muon(model);
            std::vector<ParamGroup> adamw_groups = {{model.parameters(), 0.1}}, muon_groups;
            if (use_muon) {
                adamw_groups = {{split.embeddings, 0.0}, {split.head, 0.0}, {split.vectors, 0.0}};
                muon_groups = {{split.matrices, 0.0}};
            }
            std::unique_ptr<DataParallel> dp;
            if (mode > 0) {
                DataParallelOptions options;
                options.bucket_cap_bytes = 8192;  // several buckets
                options.shard_optimizer_state = mode == 2;
                options.check_replicas = true;
                dp = std::make_unique<DataParallel>(group, model.parameters(), adamw_groups, muon_groups, options);
                adamw_groups = dp->adamw_groups();
                muon_groups = dp->muon_groups();
            }
            AdamW adamw(adamw_groups, AdamWOptions{});
            std::unique_ptr<Muon> muon = use_muon ? std::make_unique<Muon>(muon_groups, MuonOptions{}) : nullptr;
            for (int step = 0; step < 3; ++step) {
                Tensor loss = mode == 0 ? model.loss(batch.idx, batch.targets) : model.loss(my_idx, my_targets);
                loss.backward();
                double value = loss.item<double>();
                if (dp) {
                    dp->finish_gradients();
                    Tensor sum = full({1}, value, TensorOptions().dtype(DType::F64));
                    group.all_reduce(sum);
                    value = sum.item<double>() / 2;
                }
                Tensor norm = dp ? dp->clip_grad_norm_(1.0) : clip_grad_norm_tensor_(model.parameters(), 1.0);
                adamw.step_if_finite(norm);
                if (muon) muon->step_if_finite(norm);
                if (dp) dp->after_step();  // and the replicas checked
                adamw.zero_grad();
                if (muon) muon->zero_grad();
                losses[mode].push_back(value);
            }
            for (const Tensor& p : model.parameters())
                for (double v : p.to_vector<double>()) params[mode].push_back(v);
        }
        // The same to 1e-12: the gradients' sums differ in order (ranks, and with ZeRO-1 the norm's).
        // Losses elementwise (relative); parameters normwise, since AdamW's first steps divide each
        // gradient element by its own magnitude (an element summed to nearly 0 moves by lr either way).
        auto normwise = [](const std::vector<double>& a, const std::vector<double>& b) {
            double diff = 0, norm = 0;
            for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
            return std::sqrt(diff / norm);
        };
        for (size_t s = 0; s < losses[0].size(); ++s) {
            CHECK(std::abs(losses[1][s] - losses[0][s]) <= 1e-12 * std::abs(losses[0][s]));
            CHECK(std::abs(losses[2][s] - losses[1][s]) <= 1e-12 * std::abs(losses[1][s]));
        }
        CHECK(normwise(params[1], params[0]) <= 1e-12);
        CHECK(normwise(params[2], params[1]) <= 1e-12);
    }
}

TEST_CASE("distributed: mpirun -np 2 runs the collectives on cpu tensors") {
    if (under_mpirun()) SKIP_TEST("starts mpirun itself");
    REQUIRE_MPIRUN_OR_SKIP();
    TempDir dir("mpi_collectives");
    const RunResult r = run_worker(dir, "distributed worker: collectives");
    CAPTURE(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("Status: SUCCESS") != std::string::npos);
}

TEST_CASE("distributed: a collective that a rank never reaches times out naming that rank") {
    if (under_mpirun()) SKIP_TEST("starts mpirun itself");
    REQUIRE_MPIRUN_OR_SKIP();
    TempDir dir("mpi_timeout");
    const RunResult r = run_worker(dir, "distributed worker: timeout");
    CAPTURE(r.out);
    CHECK(r.out.find("timed out: ProcessGroup: collective #0 (all_reduce of 4 f32 elements) on rank 0 of 2 did not "
                     "finish within 2 s: rank 1 has not reached it") != std::string::npos);
}

TEST_CASE("distributed: mpirun -np 2 trains as one process with the doubled batch, and ZeRO-1 as plain data parallel") {
    if (under_mpirun()) SKIP_TEST("starts mpirun itself");
    REQUIRE_MPIRUN_OR_SKIP();
    TempDir dir("mpi_data_parallel");
    const RunResult r = run_worker(dir, "distributed worker: data parallel");
    CAPTURE(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("Status: SUCCESS") != std::string::npos);
}

// Whether train_gpt's line "peak allocated in a step X bytes, predicted Y" has X == Y: the step's
// measured peak is predict_peak's, the dry run of the same step (on a stand-in group of the ranks).
bool peak_as_predicted(const std::string& out) {
    const std::string before = "peak allocated in a step ", between = " bytes, predicted ";
    const size_t at = out.find(before), mid = out.find(between, at);
    if (at == std::string::npos || mid == std::string::npos) return false;
    const size_t from = mid + between.size();
    return out.substr(at + before.size(), mid - at - before.size()) == out.substr(from, out.find(' ', from) - from);
}

TEST_CASE("distributed: train_gpt on 2 ranks trains as one process with the doubled batch, and ZeRO-1 as plain") {
    if (under_mpirun()) SKIP_TEST("starts mpirun itself");
    REQUIRE_MPIRUN_OR_SKIP();
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("mpi_train_gpt");
    for (const char* optimizer : {"adamw", "muon"}) {
        CAPTURE(optimizer);
        const std::string args = kDemo + "--optimizer " + optimizer + " ";
        RunResult one = run_train_gpt_on(dir, 1, args + "--batch 4 --json one.json --save one.safetensors");
        REQUIRE(one.code == 0);
        RunResult plain = run_train_gpt_on(dir, 2, args + "--batch 2 --check-replicas --json plain.json --save plain.safetensors");
        CAPTURE(plain.err);
        REQUIRE(plain.code == 0);
        CHECK(plain.out.find("data parallel: 2 processes (mpi), 2 rows each, 4 a step") != std::string::npos);
        CHECK(lines(plain.out) == lines(one.out) + 1);  // rank 0 alone prints: that line more
        RunResult sharded = run_train_gpt_on(
            dir, 2, args + "--batch 2 --check-replicas --shard-optimizer on --json sharded.json --save sharded.safetensors");
        CAPTURE(sharded.err);
        REQUIRE(sharded.code == 0);
        // The step's gradient sums its rows in another order: f32 rounding, no more.
        CHECK(worst_relative(losses_of(dir / "plain.json"), losses_of(dir / "one.json")) <= 2e-6);
        CHECK(worst_relative(losses_of(dir / "sharded.json"), losses_of(dir / "plain.json")) <= 1e-6);
        // The checkpoints: the same model and (ZeRO-1's gathered from both ranks) optimizer state, to
        // the rounding that six f32 steps of a differently rounded clipping factor leave.
        const NamedTensors a = load_safetensors(dir / "plain.safetensors"), b = load_safetensors(dir / "sharded.safetensors");
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); ++i) {
            CAPTURE(a[i].first);
            REQUIRE(b[i].first == a[i].first);
            CHECK(normwise_error(b[i].second, a[i].second) <= 1e-5);
        }
        // Each rank's half of the state, measured = predicted; and rank 0's step peak, to the byte.
        CHECK(sharded.out.find("(predicted") != std::string::npos);
        CHECK(sharded.out.find("= measured)") != std::string::npos);
        CHECK(peak_as_predicted(one.out));
        CHECK(peak_as_predicted(plain.out));
        CHECK(peak_as_predicted(sharded.out));
    }
}

TEST_CASE("distributed: a checkpoint of 2 ranks resumes on 1 and on 2") {
    if (under_mpirun()) SKIP_TEST("starts mpirun itself");
    REQUIRE_MPIRUN_OR_SKIP();
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("mpi_resume");
    const std::string args = kDemo + "--optimizer muon --batch 2 --shard-optimizer on ";
    REQUIRE(run_train_gpt_on(dir, 2, args + "--json whole.json").code == 0);
    REQUIRE(run_train_gpt_on(dir, 2, args + "--stop-at 3 --save ck.safetensors").code == 0);
    const std::vector<double> whole = losses_of(dir / "whole.json"), last(whole.begin() + 3, whole.end());
    // On 2 ranks, sharded or not: bit for bit the run that never stopped.
    for (const char* shard : {"on", "off"}) {
        RunResult r = run_train_gpt_on(dir, 2, "--resume ck.safetensors --device cpu --threads 1 --chart run.svg "
                                               "--json two.json --shard-optimizer " + std::string(shard));
        CAPTURE(r.err);
        REQUIRE(r.code == 0);
        CHECK(r.out.find("2 rows each, 4 a step") != std::string::npos);
        CHECK(losses_of(dir / "two.json") == last);
    }
    // On 1 process, the checkpoint's 4 rows a step: the same to f32 rounding.
    RunResult r = run_train_gpt_on(dir, 1, "--resume ck.safetensors --device cpu --threads 1 --chart run.svg --json one.json");
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("B=4 ") != std::string::npos);
    CHECK(worst_relative(losses_of(dir / "one.json"), last) <= 2e-6);
    // 3 ranks cannot split the 4 rows.
    r = run_train_gpt_on(dir, 3, "--resume ck.safetensors --device cpu --threads 1 --chart run.svg");
    CHECK(r.code == 2);
    CHECK(r.err.find("does not divide among 3 processes") != std::string::npos);
}

TEST_CASE("distributed: a launcher's count of processes that MPI does not run is refused: singletons train nothing") {
    // An MPI that cannot reach its launcher (one without Slurm's PMI, under srun) starts each
    // process as "rank 0 of 1": N jobs writing the same files, which trained and exited 0.
    if (under_mpirun()) SKIP_TEST("sets the launcher's variables itself");
    if (!mpi_is_built()) SKIP_TEST("this build has no MPI (NORMTAPE_WITH_MPI)");
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("mpi_singleton");
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"}) {
        CAPTURE(var);
        const std::string out = dir / "stdout", err = dir / "stderr";
        const std::string cmd = "cd " + dir.path.string() + " && OMPI_ALLOW_RUN_AS_ROOT=1 "
                                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}"
                                "detect_leaks=0\" " + std::string(var) + "=2 " + NORMTAPE_TRAIN_GPT + " " + kDemo +
                                "--batch 2 > " + out + " 2> " + err;
        const int status = std::system(cmd.c_str());
        const RunResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
        check_refused(r, {"ProcessGroup: the launcher started 2 processes (" + std::string(var) + "), but MPI runs 1",
                          "does not belong to the launcher"});
    }
}

TEST_CASE("distributed: train_gpt refuses --shard-optimizer in one process and the memory planner in several") {
    if (under_mpirun()) SKIP_TEST("starts mpirun itself");
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("mpi_refused");
    check_refused(run_train_gpt_on(dir, 1, kDemo + "--batch 2 --shard-optimizer on"), {"--shard-optimizer on", "mpirun"});
    check_refused(run_train_gpt_on(dir, 1, kDemo + "--batch 2 --shard-optimizer maybe"), {"shard-optimizer", "maybe"});
    if (!mpi_is_built() || !mpirun_available()) return;
    RunResult r = run_train_gpt_on(dir, 2, "--data random --device cpu --steps 2 --layers 1 --embd 32 --heads 2 "
                                           "--seq 16 --batch 2 --chart run.svg --memory-sweep");
    CHECK(r.code == 2);
    CHECK(r.err.find("--memory-sweep plans one process's memory") != std::string::npos);
}

}  // TEST_SUITE
