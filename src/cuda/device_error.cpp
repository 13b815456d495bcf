// Host-side description of a kernel's timeout record.
#include "cuda/device_error.h"

#include <cstring>
#include <sstream>

namespace comet::cuda {

const char* wait_role_name(WaitRole role) {
  switch (role) {
    case WaitRole::kNone: return "none";
    case WaitRole::kGemmTileInput: return "GEMM tile input (rows of an M tile)";
    case WaitRole::kCommColumnBlock: return "layer1 column block completion";
    case WaitRole::kCommArrivals: return "partial rows from a peer";
    case WaitRole::kBarrier: return "barrier";
    case WaitRole::kBadTokenCount: return "token count within [0, T_max]";
    case WaitRole::kBadExpertId: return "expert id within [-1, E)";
    case WaitRole::kRowOverflow: return "rows within the buffer bound";
    case WaitRole::kRepeatedExpert: return "each expert at most once per token";
    case WaitRole::kBadSchedule: return "GEMM tiles in whole clusters";
    case WaitRole::kSplitPartial: return "the other part of a split GEMM tile";
    case WaitRole::kBadWeight: return "a finite routing weight";
  }
  return "unknown";
}

std::string describe(const DeviceError& e) {
  std::ostringstream os;
  if (!e.claimed) return "no error";
  if (e.role == int32_t(WaitRole::kBadSchedule)) {
    if (e.rank >= 0) os << "rank " << e.rank << " ";
    if (e.layer >= 0) os << "layer" << e.layer << " ";
    if (e.expected == 0)
      os << "grouped GEMM: entry " << e.signal << " is a split piece whose workspace slots lie past this launch's "
         << "(a schedule built for a larger grid); it ran nothing";
    else
      os << "grouped GEMM: " << e.observed << " tiles are not whole clusters of " << e.expected
         << " (a schedule built for another kernel configuration); no tile ran";
    return os.str();
  }
  const bool bad_weight = e.role == int32_t(WaitRole::kBadWeight);
  if (bad_weight || (e.role >= int32_t(WaitRole::kBadTokenCount) && e.role <= int32_t(WaitRole::kRepeatedExpert))) {
    os << "rank " << e.rank << ": bad input from rank " << e.signal << ": expected " << wait_role_name(WaitRole(e.role));
    if (bad_weight) {  // `observed` holds the float's bits; a weight has no bound
      float w = 0;
      const uint32_t bits = uint32_t(e.observed);
      std::memcpy(&w, &bits, sizeof w);
      os << ", got " << w;
    } else if (e.role == int32_t(WaitRole::kRepeatedExpert)) {  // `observed` is the repeated id
      os << ", got expert " << int64_t(e.observed) << " twice in one token's top-k";
    } else {
      os << " (bound " << e.expected << "), got " << int64_t(e.observed);
    }
    return os.str();
  }
  if (e.rank >= 0) os << "rank " << e.rank << " ";
  if (e.layer >= 0) os << "layer" << e.layer << " ";
  os << "block " << e.block << ": timed out waiting for " << wait_role_name(WaitRole(e.role))
     << ", signal " << e.signal << " >= " << e.expected << ", observed " << e.observed;
  if (e.role == int32_t(WaitRole::kBarrier) && e.expected > e.observed)
    os << " (" << e.expected - e.observed << " arrival(s) of other ranks missing: a peer stopped, failed before this "
       << "barrier, or runs another sequence of forwards)";
  return os.str();
}

}  // namespace comet::cuda
