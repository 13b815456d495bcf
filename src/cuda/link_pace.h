// cuda/link_pace.h: what a kernel needs to pace its inter-rank copies to an emulated link
// (comet/link_emulation.h, docs/link_emulation.md). Plain C++: host code fills it, kernels take
// it by value; the device side is cuda/link_pace.cuh.
//
// The model is a fluid link per (rank, direction): a LinkPacer in device memory holds the link's
// virtual clock, the time up to which it is busy with the bytes already reserved. A warp (or
// block) that moves S remote bytes reserves them: busy = max(busy, now) + S / rate, and waits
// until then (plus the latency where the copy is a pull) before its data counts as arrived.
// An idle link earns no credit (the max with now), and bytes are never dropped or reordered.
//
// Buffer (device, zeroed before first use; a pacer must be zero before each paced phase):
//   LinkPacer  u64 origin_ns    %globaltimer at the first reservation, 0: not started
//              u64 busy_ps      the virtual clock, ps after origin_ns
//              u64 blocks_done  blocks of a copy_between_ranks launch that finished (its reset)
//              u64 unused
#pragma once

#include <cstdint>

#include "comet/link_emulation.h"

namespace comet::cuda {

struct LinkPacer {
  uint64_t origin_ns;
  uint64_t busy_ps;
  uint64_t blocks_done;
  uint64_t unused;
};
inline constexpr int kLinkPacerWords = sizeof(LinkPacer) / sizeof(uint64_t);

// By value in kernel arguments. pacer == nullptr: off (every call below returns at once).
struct LinkPace {
  LinkPacer* pacer = nullptr;
  double ps_per_byte = 0;     // 1000 / GB/s
  uint64_t latency_ns = 0;    // added once per pull, once per push phase (docs/link_emulation.md)
  uint64_t max_wait_ns = 0;   // no single wait is longer (a bound even for a corrupt pacer)
};

// The pacing of `link` on `pacer` (off when the link is off). `turns`: how many ranks' transfers
// one launch carries one after another (the baselines' all-to-all moves every rank's bytes in
// one launch, standing for W ranks' turns: W latencies); max_wait_ns bounds every wait.
inline LinkPace make_link_pace(const LinkEmulation& link, LinkPacer* pacer, int turns, uint64_t max_wait_ns) {
  LinkPace p;
  if (!link.on() || pacer == nullptr) return p;
  p.pacer = pacer;
  p.ps_per_byte = 1000.0 / link.gbps;
  p.latency_ns = uint64_t(link.latency_us * 1e3 * turns + 0.5);
  p.max_wait_ns = max_wait_ns;
  return p;
}

}  // namespace comet::cuda
