// cuda/device_error.h: the record a kernel leaves when a wait times out (host-visible POD).
//
// Protocol: the first waiter that times out wins `claimed` (atomicCAS 0 -> 1) and fills the
// other fields; every later wait sees claimed != 0 and stops waiting, so a dead peer costs one
// timeout. Kernels never trap on a timeout: they finish (with garbage where data was missing)
// and the host turns the record into a comet::TimeoutError naming the stuck signal.
#pragma once

#include <cstdint>
#include <string>

namespace comet::cuda {

enum class WaitRole : int32_t {
  kNone = 0,
  kGemmTileInput = 1,   // GEMM producer waiting for a tile's A rows (layer0)
  kCommColumnBlock = 2, // comm block waiting for a layer1 column block
  kCommArrivals = 3,    // owner waiting for peers' partial rows
  kBarrier = 4,
  // Input errors found on the device (no wait involved): `signal` is the rank whose input is
  // bad, `observed` the bad value (signed, two's complement), `expected` the bound it broke.
  // MoeLayer keeps them in a record of their own, which waits do not watch (the protocol stays
  // in step), apart from the timeouts'.
  kBadTokenCount = 5,  // more tokens than T_max
  kBadExpertId = 6,    // an expert id outside [-1, E)
  kRowOverflow = 7,    // more rows than the buffers hold
  kRepeatedExpert = 8, // a token selects the same expert in two slots (`observed` = the expert)
  // A grouped GEMM with clusters given a tile count that is not whole clusters (`observed` = the
  // count, `expected` = the cluster size): a schedule built for another configuration.
  // Or (`expected` = 0) a split piece whose workspace slots lie past the launch's (a schedule
  // built for a larger grid): `signal` = the entry, `observed` = its GemmSplitRole.
  kBadSchedule = 9,
  // A split tile's finishing entry waiting for one of its other parts (`signal` = the slot).
  kSplitPartial = 10,
  // An input error like those above: an unmasked slot's routing weight is NaN or infinite
  // (`observed` = the float's bits). Found by the rank that holds the slot's expert.
  kBadWeight = 11,
};

struct DeviceError {
  int32_t claimed = 0;  // 0: no error
  int32_t rank = -1;
  int32_t role = 0;     // WaitRole
  int32_t block = -1;   // blockIdx.x of the waiter
  int32_t signal = -1;  // index of the signal in its array
  int32_t layer = -1;   // 0 or 1 (-1: not a layer kernel)
  uint64_t expected = 0;
  uint64_t observed = 0;
};

const char* wait_role_name(WaitRole role);
// "rank 1 layer0 block 37: GEMM tile input signal 5 never reached 128 (observed 64)".
std::string describe(const DeviceError& error);

}  // namespace comet::cuda
