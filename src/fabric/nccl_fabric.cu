// The Nccl fabric (fabric/fabric.h, docs/fabric.md): one process per GPU, one rank each; the
// symmetric heap is an NCCL >= 2.28 symmetric window, and peers' heaps are reached through
// NCCL's LSA (load/store accessible) mappings of that window.
//
// Life cycle of one rank:
//   construct  version check -> GPU LOCAL_RANK -> bootstrap file (rank 0 writes the unique id,
//              the others wait for it) -> ncclCommInitRankConfig (non-blocking, polled with the
//              fabric timeout) -> rank 0 removes the file -> LSA team must span all ranks
//   allocate   sizes agreed (one allreduce) -> ncclMemAlloc + zero -> every rank's success
//              agreed (one allreduce; a failure on any rank fails every rank, naming it) ->
//              ncclCommWindowRegister
//              (NCCL_WIN_COLL_SYMMETRIC; collective, ends in NCCL's own barrier) -> peer table
//              filled on the device with ncclGetPeerPointer -> barrier
//   destroy    device sync + barrier -> table, window, memory -> ncclCommFinalize + Destroy;
//              during an exception unwind, or after a timeout, ncclCommAbort instead (a
//              collective teardown could wait forever for a rank that is gone)
//
// No device communicator (ncclDevCommCreate) is made: the window's LSA pointers need none, so
// no GIN, barrier or multimem resources are requested. Single node only (the LSA team must be
// the whole world); inter-node GIN is later work.
//
// NOTES: the communicator is non-blocking (config.blocking = 0) so that every host-side wait
// for other ranks is a poll with a timeout; after each NCCL call that may return
// ncclInProgress, finish() polls ncclCommGetAsyncError before the next call, as NCCL requires.
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "core/bootstrap_file.h"
#include "core/process_env.h"
#include "fabric/fabric.h"
#include "fabric/fabric_util.h"
#include "fabric/nccl_fabric.h"

namespace comet::fabric {

using detail::DeviceGuard;
using detail::kHeapAlign;
using detail::round_up;

int nccl_compiled_version() { return NCCL_VERSION_CODE; }

int nccl_runtime_version() {
  int version = 0;
  const ncclResult_t r = ncclGetVersion(&version);
  COMET_CHECK(r == ncclSuccess, "ncclGetVersion failed: " << ncclGetErrorString(r));
  return version;
}

std::string nccl_version_name(int code) {
  // NCCL_VERSION(): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after.
  std::ostringstream os;
  if (code >= 10000) os << code / 10000 << "." << (code / 100) % 100 << "." << code % 100;
  else os << code / 1000 << "." << (code / 100) % 10 << "." << code % 100;
  return os.str();
}

void check_nccl_version(int compiled, int runtime) {
  COMET_CHECK(compiled == runtime,
              "NCCL version mismatch: built with the headers of NCCL "
                  << nccl_version_name(compiled) << " (NCCL_VERSION_CODE " << compiled << "), but the loaded libnccl is "
                  << nccl_version_name(runtime) << " (ncclGetVersion " << runtime
                  << "); put the matching libnccl.so.2 first on LD_LIBRARY_PATH, or rebuild against the loaded one "
                     "(COMET_NCCL_ROOT)");
}

bool nccl_fabric_available() { return true; }

namespace {

// Entry p: rank p's window base as this GPU addresses it (NCCL's LSA mapping). The window
// handle is a device pointer, and ncclGetPeerPointer exists only on the device.
__global__ void fill_peer_table_kernel(ncclWindow_t window, void** table, int world) {
  for (int p = threadIdx.x; p < world; p += blockDim.x) table[p] = ncclGetPeerPointer(window, 0, p);
}

// NCCL_WIN_REQUIRED_ALIGNMENT: window sizes are kept multiples of it too.
constexpr int64_t kWindowAlign = NCCL_WIN_REQUIRED_ALIGNMENT;

class NcclFabric final : public Fabric {
 public:
  explicit NcclFabric(const ProcessEnv& env)
      : env_(env), bootstrap_path_(nccl_bootstrap_path(env.bootstrap_file, next_serial_++)) {
    try {
      init();
    } catch (...) {
      teardown(/*collective=*/false);
      throw;
    }
  }
  ~NcclFabric() override {
    // A destructor run by an exception may be the only rank tearing down: no collectives then.
    teardown(/*collective=*/std::uncaught_exceptions() == 0 && !aborted_);
  }

  std::string name() const override { return "nccl"; }
  int world() const override { return env_.world; }
  int gpus() const override { return env_.world; }  // one process, one GPU, per rank
  int first_local_rank() const override { return env_.rank; }
  int num_local_ranks() const override { return 1; }
  int device_of(int rank) const override {
    check_local(rank, "device_of");
    return env_.local_rank;
  }
  int64_t bytes_per_rank() const override { return bytes_; }
  void* base(int rank) const override {
    check_local(rank, "base");
    return heap_;
  }
  void* const* peer_table(int rank) const override {
    check_local(rank, "peer_table");
    return table_;
  }
  std::vector<void*> peer_table_host(int rank) const override {
    check_local(rank, "peer_table_host");
    return table_host_;
  }

  void run_allocate(int64_t bytes) override {
    check_usable();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(env_.local_rank));
    // A size this rank cannot take still goes into the agreement (as -1), so that every rank
    // refuses it instead of the others waiting in the collectives below.
    const int64_t want = detail::valid_heap_size(bytes) ? round_up(bytes, kHeapAlign) : -1;

    // 1. Every rank must ask for the same size: NCCL's registration would fail less clearly.
    //    One allreduce(max) over {size, -size} gives the largest and the smallest request;
    //    every rank sees the same pair, so all of them throw or none does.
    int64_t sizes[2] = {want, -want};
    COMET_CUDA_CHECK(cudaMemcpyAsync(scratch_, sizes, sizeof sizes, cudaMemcpyHostToDevice, stream_));
    finish(ncclAllReduce(scratch_, scratch_, 2, ncclInt64, ncclMax, comm_, stream_), "agreeing on the heap size");
    // The bounded wait comes before the copy: a copy into pageable memory blocks until done,
    // and would wait without limit for a rank that never arrives.
    wait_stream(stream_, "agreeing on the heap size");
    COMET_CUDA_CHECK(cudaMemcpy(sizes, scratch_, sizeof sizes, cudaMemcpyDeviceToHost));
    if (want < 0) detail::check_heap_size(bytes);  // this rank's own reason
    COMET_CHECK(-sizes[1] >= 0, context() << "allocate(): a rank asked for a heap size outside [0, "
                                          << kMaxHeapBytesPerRank << "] bytes (this rank " << bytes << ")");
    COMET_CHECK(sizes[0] == -sizes[1], context() << "allocate(): the ranks asked for different heap sizes (smallest "
                                                 << -sizes[1] << ", largest " << sizes[0] << " bytes, this rank "
                                                 << want << "); every rank must allocate the same layout");
    // Only now the old heap goes: a refused size leaves it (and the layers on it) as they were.
    // A rank whose release fails half way (a broken context) would keep a heap the others freed
    // and meet their next collectives with its own: it aborts.
    aborting_on_failure([&] { release(); });

    // 2. Memory NCCL can map for its peers (CUDA VMM), zeroed before anyone can see it. A
    //    rank that fails here still meets the others (2b) before it throws.
    window_bytes_ = round_up(std::max<int64_t>(want, 1), kWindowAlign);
    std::string local_failure;
    try {
      // Into a local first: a failed call may have written the pointer of a range it reserved
      // and did not map, which must not be freed as a heap.
      void* heap = nullptr;
      check_nccl(ncclMemAlloc(&heap, size_t(window_bytes_)), "ncclMemAlloc");
      heap_ = heap;
      COMET_CUDA_CHECK(cudaMemsetAsync(heap_, 0, window_bytes_, stream_));
      wait_stream(stream_, "zeroing the heap");
    } catch (const Error& e) {
      if (aborted_) throw;  // a timeout or NCCL error aborted the communicator: nothing to meet on
      local_failure = e.what();
    }
    // 2b. Registration is collective: without this agreement the ranks that have their memory
    //     would wait in it for one that failed until the timeout, not knowing why.
    agree_every_heap_allocated(local_failure);

    // 3-5 are collective or end in a collective. A failure here on one rank aborts its
    //    communicator (a new fabric is needed then); the others fail in the collective they
    //    wait in, at the latest at their own timeout, and abort too.
    aborting_on_failure([&] { register_window(); });
    bytes_ = want;  // last: a failure above leaves 0 bytes, so Fabric::allocate moves the generation
  }

  // allocate()'s steps 3-5, once every rank has its zeroed heap.
  void register_window() {
    // 3. The symmetric window; NCCL maps every rank's memory into this process here.
    finish(ncclCommWindowRegister(comm_, heap_, size_t(window_bytes_), &window_, NCCL_WIN_COLL_SYMMETRIC),
           "registering the symmetric window");
    // NCCL answers success without a window when the communicator has no symmetric memory
    // support (no CUDA VMM, NCCL_CUMEM_ENABLE=0, or ranks without P2P).
    COMET_CHECK(window_ != nullptr, context() << "NCCL registered no symmetric window: this communicator has no "
                                                 "symmetric memory support (CUDA VMM and P2P between all GPUs are "
                                                 "needed; NCCL_CUMEM_ENABLE must not be 0; NCCL_DEBUG=INFO says more)");

    // 4. The peer table, on the device and a host copy.
    COMET_CUDA_CHECK(cudaMalloc(&table_, env_.world * sizeof(void*)));
    fill_peer_table_kernel<<<1, 64, 0, stream_>>>(window_, table_, env_.world);
    COMET_CUDA_CHECK_LAUNCH();
    table_host_.assign(env_.world, nullptr);
    COMET_CUDA_CHECK(
        cudaMemcpyAsync(table_host_.data(), table_, env_.world * sizeof(void*), cudaMemcpyDeviceToHost, stream_));
    wait_stream(stream_, "filling the peer table");

    // 5. Registration ended in NCCL's barrier, after every rank zeroed its heap; this one also
    //    covers the table, so no rank writes to a peer before the peer can be used.
    barrier_on(stream_, "the end of allocate()");
  }

  // One allreduce(max) over {failed ? rank + 1 : 0, failed ? world - rank : 0}: every rank learns
  // the highest and the lowest rank whose heap could not be allocated, or that none failed. On
  // a failure every rank frees its own new heap (no peer has mapped it yet, so no collective is
  // needed) and throws: the failing rank its own error, the others one naming that rank. The
  // communicator stays usable, so a smaller allocate() can follow on every rank.
  void agree_every_heap_allocated(const std::string& local_failure) {
    const bool failed = !local_failure.empty();
    int64_t v[2] = {failed ? env_.rank + 1 : 0, failed ? env_.world - env_.rank : 0};
    COMET_CUDA_CHECK(cudaMemcpyAsync(scratch_, v, sizeof v, cudaMemcpyHostToDevice, stream_));
    finish(ncclAllReduce(scratch_, scratch_, 2, ncclInt64, ncclMax, comm_, stream_),
           "agreeing that every rank allocated its heap");
    wait_stream(stream_, "agreeing that every rank allocated its heap");
    COMET_CUDA_CHECK(cudaMemcpy(v, scratch_, sizeof v, cudaMemcpyDeviceToHost));
    if (v[0] == 0) return;
    if (void* heap = std::exchange(heap_, nullptr)) check_nccl(ncclMemFree(heap), "ncclMemFree");
    const int64_t heap_bytes = std::exchange(window_bytes_, 0);
    if (failed) throw Error(local_failure);
    const int64_t lowest = env_.world - v[1], highest = v[0] - 1;
    std::ostringstream os;
    os << context() << "allocate(): rank " << lowest;
    if (highest != lowest) os << " (and possibly others up to rank " << highest << ")";
    os << " could not allocate its " << heap_bytes << "-byte heap (its own error says why); no rank has a heap now";
    throw Error(os.str());
  }

  std::pair<uint64_t, uint64_t> run_min_max(uint64_t value, const std::string& what) override {
    check_usable();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(env_.local_rank));
    // allreduce(max) over {value, ~value}: the largest value and the complement of the smallest;
    // every rank sees the same pair.
    uint64_t v[2] = {value, ~value};
    COMET_CUDA_CHECK(cudaMemcpyAsync(scratch_, v, sizeof v, cudaMemcpyHostToDevice, stream_));
    finish(ncclAllReduce(scratch_, scratch_, 2, ncclUint64, ncclMax, comm_, stream_), "agreeing on " + what);
    wait_stream(stream_, "agreeing on " + what);
    COMET_CUDA_CHECK(cudaMemcpy(v, scratch_, sizeof v, cudaMemcpyDeviceToHost));
    return {~v[1], v[0]};
  }

  void run_wait(CUstream_st* stream, const std::string& what) override {
    check_usable();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(env_.local_rank));
    wait_stream(stream, what);
  }

  void barrier(CUstream_st* stream) override {
    check_usable();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(env_.local_rank));
    barrier_on(stream, "barrier()");
  }

 private:
  void init() {
    // 1. The library must be the one the headers describe (the device functions used below
    //    read NCCL's structures directly).
    check_nccl_version(NCCL_VERSION_CODE, nccl_runtime_version());
    COMET_CHECK(env_.world == env_.local_world,
                "the Nccl fabric runs on one node: WORLD_SIZE=" << env_.world << " but LOCAL_WORLD_SIZE="
                                                                << env_.local_world
                                                                << " (several nodes need NCCL's GIN, not supported yet)");

    // 2. This process drives GPU LOCAL_RANK.
    detail::set_local_rank_device(env_.local_rank, context(), env_.local_rank_source);

    // 3. The communicator id travels from rank 0 through the bootstrap file, one per fabric
    //    (suffix .0, .1, ...): a rank that makes its next fabric early must not read the id of
    //    the previous one before rank 0 has removed that file.
    ncclUniqueId id{};
    if (env_.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    try {
      if (env_.rank == 0) {
        publish_bootstrap_file(bootstrap_path_, std::string(id.internal, sizeof id.internal));
      } else {
        const std::string blob = wait_bootstrap_file(bootstrap_path_, sizeof id.internal, env_.timeout_s);
        std::memcpy(id.internal, blob.data(), sizeof id.internal);
      }
    } catch (const TimeoutError& e) {
      throw TimeoutError(context() + e.what() + " (bootstrap file from " + env_.source + ")");
    } catch (const Error& e) {
      throw Error(context() + e.what() + " (bootstrap file from " + env_.source + ")");
    }

    // 4. Join; rank 0 then removes the file, which every rank has read once all have joined.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "comet";
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, env_.world, id, env_.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      // No usable handle to query or abort in every failure case: report and clean up only.
      const std::string why = ncclGetErrorString(r);
      if (comm_) abort_comm();
      if (env_.rank == 0) remove_bootstrap_file(bootstrap_path_);  // as after a failed wait below
      COMET_CHECK(false, context() << "ncclCommInitRankConfig failed: " << why);
    }
    std::ostringstream joining;
    joining << "waiting for all " << env_.world << " ranks to join the communicator (did every rank start, with "
            << "a distinct RANK, the same WORLD_SIZE and bootstrap file " << bootstrap_path_ << "?)";
    try {
      wait_comm(joining.str());
    } catch (...) {
      if (env_.rank == 0) remove_bootstrap_file(bootstrap_path_);  // no later run may read this id
      throw;
    }
    if (env_.rank == 0) remove_bootstrap_file(bootstrap_path_);

    // 5. Load/store access to every rank is what the kernels need (ncclTeamLsa sets up NCCL's
    //    symmetric-memory runtime and answers an empty team when that fails).
    const ncclTeam_t lsa = ncclTeamLsa(comm_);
    COMET_CHECK(lsa.nRanks > 0, context() << "NCCL's symmetric memory runtime did not start (it needs CUDA VMM: "
                                             "NCCL_CUMEM_ENABLE must not be 0; NCCL_DEBUG=WARN says more)");
    COMET_CHECK(lsa.nRanks == env_.world,
                context() << "only " << lsa.nRanks << " of the " << env_.world
                          << " ranks can load/store each other's memory (NVLink or PCIe P2P); the Nccl fabric "
                             "needs all of them in one LSA team");

    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    COMET_CUDA_CHECK(cudaMalloc(&scratch_, 4 * sizeof(int64_t)));
  }

  void run_all_to_all_v(const AllToAllVArgs* ranks, CUstream_st* stream) override {
    check_usable();
    DeviceGuard guard;
    COMET_CUDA_CHECK(cudaSetDevice(env_.local_rank));
    const AllToAllVArgs& a = ranks[0];
    // Bytes as ncclUint8: point-to-point transfers are byte copies whatever the type, both
    // sides must name the same type and count, and counts are size_t (no overflow).
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t first_error = ncclSuccess;
    // ncclInProgress is not an error (the non-blocking communicator may answer it): posting goes on.
    const auto posted = [&] { return first_error == ncclSuccess || first_error == ncclInProgress; };
    for (int p = 0; p < env_.world && posted(); ++p) {
      if (a.send_bytes[p] > 0)
        first_error = ncclSend(static_cast<const char*>(a.send) + a.send_offsets[p], size_t(a.send_bytes[p]),
                               ncclUint8, p, comm_, stream);
      if (posted() && a.recv_bytes[p] > 0)
        first_error = ncclRecv(static_cast<char*>(a.recv) + a.recv_offsets[p], size_t(a.recv_bytes[p]), ncclUint8,
                               p, comm_, stream);
    }
    const ncclResult_t end = ncclGroupEnd();  // always close the group, even after an error
    // Part of the group may have been posted, and the peers' matching halves wait for the rest:
    // the communicator is aborted, so that they fail too instead of waiting.
    if (!posted()) fail(first_error, "posting the ncclSend/ncclRecv of all_to_all_v");
    finish(end, "all_to_all_v");
  }

  // A one-element allreduce on `stream`, then a bounded wait for `stream`.
  void barrier_on(cudaStream_t stream, const char* what) {
    finish(ncclAllReduce(scratch_ + 2, scratch_ + 2, 1, ncclInt64, ncclSum, comm_, stream), what);
    wait_stream(stream, what);
  }

  // Collective teardown when `collective`, else local only (with ncclCommAbort). Never throws.
  void teardown(bool collective) noexcept {
    // The current device is restored by hand: DeviceGuard throws, and this must not.
    int saved_device = -1;
    const bool have_device_work = comm_ || table_ || heap_ || scratch_ || stream_;
    if (have_device_work && cudaGetDevice(&saved_device) == cudaSuccess) cudaSetDevice(env_.local_rank);
    try {
      if (collective && comm_) {
        release();
        finish(ncclCommFinalize(comm_), "ncclCommFinalize");
        ncclCommDestroy(comm_);
        comm_ = nullptr;
      }
    } catch (...) {
      // A rank left, or NCCL failed: fall through to the local teardown.
    }
    // The abort first: it ends NCCL kernels that wait for a peer that is gone, and cudaFree
    // below synchronizes the device (it would wait for them forever).
    abort_comm();  // also drops the window registration
    window_ = nullptr;
    if (table_) cudaFree(table_);
    table_ = nullptr;
    table_host_.clear();
    if (heap_) ncclMemFree(heap_);
    heap_ = nullptr;
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    if (saved_device >= 0) cudaSetDevice(saved_device);
  }

  // Frees the heap collectively: all ranks' work on it must be over first, so every rank
  // synchronizes its device and then meets the others. A first, bounded meeting comes before the
  // synchronization: if a peer is gone, NCCL work of this device that waits for it would keep
  // cudaDeviceSynchronize from returning, while the meeting times out and aborts the
  // communicator, which ends that work.
  void release() {
    if (!heap_ && !window_ && !table_) return;
    barrier_on(stream_, "releasing the heap (are all ranks alive?)");
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    barrier_on(stream_, "releasing the heap");
    // Each pointer is dropped before its free is checked: a free that reports an earlier
    // asynchronous error must not leave it for teardown to free again.
    bytes_ = window_bytes_ = 0;
    table_host_.clear();
    if (void* table = std::exchange(table_, nullptr)) COMET_CUDA_CHECK(cudaFree(table));
    if (ncclWindow_t window = std::exchange(window_, nullptr))
      finish(ncclCommWindowDeregister(comm_, window), "ncclCommWindowDeregister");
    if (void* heap = std::exchange(heap_, nullptr)) check_nccl(ncclMemFree(heap), "ncclMemFree");
  }

  // After a failure or timeout of a call that involves other ranks: the communicator is
  // aborted (peers waiting on this rank then fail too), which unmaps the peers' heaps, so
  // layers on this fabric must refuse to run (invalidate_heap) and bytes_per_rank() is 0.
  void abort_after_error() noexcept {
    aborted_ = true;
    abort_comm();
    if (bytes_ > 0) invalidate_heap();
    bytes_ = 0;
  }

  // Runs `step`; if it throws, the communicator is aborted (unless that happened already) and
  // the exception goes on: for steps whose failure on one rank leaves the ranks out of step.
  template <class Step>
  void aborting_on_failure(Step&& step) {
    try {
      step();
    } catch (...) {
      if (!aborted_) abort_after_error();
      throw;
    }
  }

  void abort_comm() noexcept {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  std::string context() const {
    std::ostringstream os;
    os << "nccl fabric, rank " << env_.rank << " of " << env_.world << ": ";
    return os.str();
  }

  void check_usable() const {
    COMET_CHECK(!aborted_ && comm_, context() << "the communicator was aborted after an earlier error or timeout; "
                                                 "make a new fabric (every rank)");
  }

  // Throws for a failed NCCL call (not for ncclInProgress, which finish() waits out).
  void check_nccl(ncclResult_t r, const char* call) const {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::ostringstream os;
    os << context() << call << " failed: " << ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm_);
    if (last && *last) os << " (" << last << ")";
    throw Error(os.str());
  }

  // After a call on the non-blocking communicator: fails at once on an error, else waits until
  // NCCL has finished the call's host side.
  void finish(ncclResult_t issued, const std::string& what) {
    check_nccl(issued, what.c_str());
    wait_comm(what);
  }

  // Polls the communicator's state until it is no longer in progress, at most timeout_s. On
  // timeout the communicator is aborted (other ranks then fail too instead of waiting).
  void wait_comm(const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(env_.timeout_s);
    for (int spin = 0;; ++spin) {
      ncclResult_t state = ncclInProgress;
      check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(state, what);
      if (Clock::now() >= deadline) timed_out(what);
      pause(spin);
    }
  }

  // Waits for `stream` at most timeout_s, watching the communicator for asynchronous errors
  // (a peer that failed) meanwhile.
  void wait_stream(cudaStream_t stream, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(env_.timeout_s);
    for (int spin = 0;; ++spin) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) COMET_CUDA_CHECK(q);
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) fail(state, what);
      if (Clock::now() >= deadline) timed_out(what);
      pause(spin);
    }
  }

  [[noreturn]] void fail(ncclResult_t state, const std::string& what) {
    std::ostringstream os;
    os << context() << "NCCL reported " << ncclGetErrorString(state) << " while " << what;
    const char* last = ncclGetLastError(comm_);
    if (last && *last) os << " (" << last << ")";
    abort_after_error();
    throw Error(os.str());
  }

  [[noreturn]] void timed_out(const std::string& what) {
    std::ostringstream os;
    os << context() << "timed out after " << env_.timeout_s << " s " << what
       << "; a rank did not arrive (crashed, stuck, or not started?). The communicator is aborted "
          "(COMET_FABRIC_TIMEOUT_S sets the limit)";
    abort_after_error();
    throw TimeoutError(os.str());
  }

  // Spin briefly (barriers in timed loops are short), then sleep between polls.
  static void pause(int spin) {
    if (spin < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  using Clock = std::chrono::steady_clock;
  // Fabrics made by this process so far; every rank makes them in the same order.
  static inline int next_serial_ = 0;
  ProcessEnv env_;
  std::string bootstrap_path_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  cudaStream_t stream_ = nullptr;  // allocate()'s own work
  int64_t* scratch_ = nullptr;     // device [4]: [0..1] the size and success agreements, [2] the barrier
  int64_t bytes_ = 0;              // what callers may use (rounded to 256)
  int64_t window_bytes_ = 0;       // what is allocated and registered (rounded to 4096)
  void* heap_ = nullptr;
  ncclWindow_t window_ = nullptr;
  void** table_ = nullptr;
  std::vector<void*> table_host_;
};

}  // namespace

std::string nccl_bootstrap_path(const std::string& bootstrap_file, int serial) {
  return bootstrap_file + "." + std::to_string(serial);
}

std::unique_ptr<Fabric> make_nccl_fabric(const ProcessEnv& env) { return std::make_unique<NcclFabric>(env); }

}  // namespace comet::fabric
