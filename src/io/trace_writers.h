// io/trace_writers.h: a Trace (comet/trace.h) as Chrome/Perfetto trace JSON (open it in
// ui.perfetto.dev or chrome://tracing) and as an SVG picture: one lane per (rank, worker),
// communication blue, GEMM tiles orange, waits grey, owner reduce green, layer0 and layer1
// separated by a marker per rank.
#pragma once

#include <string>

#include "comet/trace.h"

namespace comet::io {

std::string chrome_trace_json(const Trace& trace);
std::string timeline_svg(const Trace& trace);
// Writes path (JSON) and path with ".svg" replacing a ".json" suffix (or appended).
void write_trace_files(const Trace& trace, const std::string& json_path);

}  // namespace comet::io
