// io/trace_writers.h: a Trace (comet/trace.h) as Chrome/Perfetto trace JSON (open it in
// ui.perfetto.dev or chrome://tracing) and as an SVG picture: one lane per (rank, worker) or,
// for GPU traces, one panel per (rank, layer) kernel with one lane per thread block;
// communication blue, GEMM tiles orange, waits grey, owner reduce green; layer0 and layer1
// marked (a dashed line per rank, or the panels' titles and tints).
//
// The SVG stays small however many events there are: per lane and kind, events that overlap
// (several warps of one block) are drawn as one bar, runs of events narrower than a pixel are
// merged into one bar, and bars narrower than half a pixel are left out (TimelineStats counts
// all three).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/trace.h"

namespace comet::io {

struct TimelineOptions {
  std::vector<int> ranks;  // ranks drawn in the SVG; empty: every rank
  int width_px = 1100;     // of the time axis
};

// What timeline_svg did with the events of the drawn ranks: each one is the first event of a
// drawn bar, merged into another event's bar, or culled.
struct TimelineStats {
  int64_t bars = 0;
  int64_t merged = 0;
  int64_t culled = 0;
};

std::string chrome_trace_json(const Trace& trace);
std::string timeline_svg(const Trace& trace, const TimelineOptions& options = {}, TimelineStats* stats = nullptr);
// Writes json_path (JSON) and json_path with ".svg" replacing a ".json" suffix (or appended),
// each replacing its old file whole (core/replace_file.h); throws "trace PATH: ..." when one
// cannot be written.
void write_trace_files(const Trace& trace, const std::string& json_path, const TimelineOptions& svg = {});
// The SVG path write_trace_files uses for json_path.
std::string trace_svg_path(const std::string& json_path);
// json_path with `suffix` before its ".json" ("t.json", "-rank1" -> "t-rank1.json"; a path
// without ".json" gets suffix + ".json"; an empty suffix leaves it as it is): the names of the
// traces of several rows (`comet bench layer`) or of one process per rank (`--fabric nccl`),
// which would otherwise all write json_path.
std::string trace_path_with_suffix(const std::string& json_path, const std::string& suffix);
// The suffix of rank `rank`'s own trace in a run of one process per rank: "-rank<rank>".
std::string trace_rank_suffix(int rank);

}  // namespace comet::io
