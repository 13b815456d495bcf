// comet/link_emulation.h: pacing every inter-rank copy on one GPU to a given link bandwidth and
// latency, so that W virtual ranks on one GPU (Loopback fabric) approximate W GPUs joined by
// real links (docs/link_emulation.md has the model and what it leaves out).
//
//   comet::LayerOptions o;
//   o.link = comet::parse_link_emulation("450,2");   // NVLink 4: 450 GB/s per direction, 2 us
//   layer.set_options(o);                            // MoeLayer; BaselineOptions::link likewise
//
// Contract: pacing only delays copies, it never changes what is copied, so every output is
// bitwise the same with emulation on or off. gbps == 0 means off.
#pragma once

#include <string>

#include "comet/error.h"

namespace comet {

struct LinkEmulation {
  double gbps = 0;        // per rank and direction, 1e9 bytes/s; 0: off (local copies at HBM speed)
  double latency_us = 0;  // one-way latency of the link

  bool on() const { return gbps > 0; }
  // Off, or a finite rate of at least kMinGbps with a latency in [0, kMaxLatencyUs]; the reason
  // names the bad value.
  Status validate() const;
  // "emulated link 450 GB/s, 2 us" or "no link emulation".
  std::string describe() const;
  // "450GB/s,2us" or "off": a short form for table columns.
  std::string short_name() const;

  static constexpr double kMaxLatencyUs = 1e6;
  // 1 MB/s. Slower links pace nothing useful (their waits end at the layer's timeout cut), and
  // their per-byte cost in picoseconds nears the pacer's 64-bit range (cuda/link_pace.cuh).
  static constexpr double kMinGbps = 1e-3;
};

// "GBPS" or "GBPS,LATENCY_US" (e.g. "450" or "160,2.5"). Throws comet::Error naming the bad
// part: a missing or non-numeric value, a rate <= 0, a negative latency.
LinkEmulation parse_link_emulation(const std::string& text);

}  // namespace comet
