// Chrome trace JSON and SVG timeline of a Trace.
#include "io/trace_writers.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "comet/error.h"

namespace comet {

const char* trace_kind_name(TraceKind kind) {
  switch (kind) {
    case TraceKind::kCommChunk: return "comm";
    case TraceKind::kGemmTile: return "gemm";
    case TraceKind::kWait: return "wait";
    case TraceKind::kReduce: return "reduce";
  }
  return "?";
}

namespace io {

namespace {
std::string lane_name(const Trace& t, int layer, int lane) {
  if (layer == 2) return "owner reduce";
  const bool comm = lane < t.comm_lanes;
  std::ostringstream os;
  os << "L" << layer << (comm ? " comm " : " gemm ") << (comm ? lane : lane - t.comm_lanes);
  return os.str();
}
const char* color(TraceKind kind) {
  switch (kind) {
    case TraceKind::kCommChunk: return "#1f77b4";
    case TraceKind::kGemmTile: return "#ff7f0e";
    case TraceKind::kWait: return "#bbbbbb";
    case TraceKind::kReduce: return "#2ca02c";
  }
  return "#000000";
}
}  // namespace

std::string chrome_trace_json(const Trace& t) {
  nlohmann::json events = nlohmann::json::array();
  std::map<std::pair<int, int>, std::string> threads;  // (pid, tid) -> name
  for (const TraceEvent& e : t.events) {
    const int tid = e.layer * 1000 + e.lane;
    threads[{e.rank, tid}] = lane_name(t, e.layer, e.lane);
    events.push_back({{"name", std::string(trace_kind_name(e.kind)) + " " + std::to_string(e.id)},
                      {"cat", trace_kind_name(e.kind)},
                      {"ph", "X"},
                      {"ts", double(e.begin_ns) / 1e3},
                      {"dur", double(std::max<int64_t>(e.end_ns - e.begin_ns, 0)) / 1e3},
                      {"pid", e.rank},
                      {"tid", tid},
                      {"args", {{"layer", e.layer}, {"id", e.id}}}});
  }
  for (const auto& [key, name] : threads)
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", key.first}, {"tid", key.second},
                      {"args", {{"name", name}}}});
  for (int r = 0; r < t.world; ++r)
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}, {"otherData", {{"title", t.title}}}}.dump() +
         "\n";
}

std::string timeline_svg(const Trace& t) {
  constexpr int kLeft = 130, kWidth = 1100, kLaneH = 7, kRankGap = 10, kTop = 46;
  const int lanes = t.comm_lanes + t.compute_lanes + 1;  // + the owner reduce lane
  int64_t end = 1;
  for (const TraceEvent& e : t.events) end = std::max(end, e.end_ns);
  const int height = kTop + t.world * (lanes * kLaneH + kRankGap) + 30;
  auto x_of = [&](int64_t ns) { return kLeft + double(ns) / double(end) * kWidth; };
  auto row_of = [&](const TraceEvent& e) { return e.layer == 2 ? lanes - 1 : e.lane; };
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kLeft + kWidth + 20 << "\" height=\"" << height
     << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"10\" y=\"16\" font-size=\"14\">" << t.title << "</text>\n";
  int lx = kLeft;
  for (TraceKind k : {TraceKind::kCommChunk, TraceKind::kGemmTile, TraceKind::kWait, TraceKind::kReduce}) {
    os << "<rect x=\"" << lx << "\" y=\"26\" width=\"12\" height=\"10\" fill=\"" << color(k) << "\"/><text x=\""
       << lx + 16 << "\" y=\"35\">" << trace_kind_name(k) << "</text>\n";
    lx += 90;
  }
  os << "<text x=\"" << lx + 20 << "\" y=\"35\">0 .. " << double(end) / 1e6 << " ms; dashed: layer0 | layer1</text>\n";
  for (int r = 0; r < t.world; ++r) {
    const int y0 = kTop + r * (lanes * kLaneH + kRankGap);
    os << "<text x=\"10\" y=\"" << y0 + 10 << "\">rank " << r << "</text>\n";
    os << "<text x=\"10\" y=\"" << y0 + 22 << "\" fill=\"#555\">" << t.comm_lanes << " comm, " << t.compute_lanes
       << " gemm</text>\n";
    os << "<rect x=\"" << kLeft << "\" y=\"" << y0 << "\" width=\"" << kWidth << "\" height=\"" << lanes * kLaneH
       << "\" fill=\"#f7f7f7\"/>\n";
    int64_t layer1_start = -1;
    for (const TraceEvent& e : t.events)
      if (e.rank == r && e.layer == 1 && (layer1_start < 0 || e.begin_ns < layer1_start)) layer1_start = e.begin_ns;
    for (const TraceEvent& e : t.events) {
      if (e.rank != r) continue;
      const double x = x_of(e.begin_ns), w = std::max(0.5, x_of(e.end_ns) - x);
      os << "<rect x=\"" << x << "\" y=\"" << y0 + row_of(e) * kLaneH << "\" width=\"" << w << "\" height=\""
         << kLaneH - 1 << "\" fill=\"" << color(e.kind) << "\"/>\n";
    }
    if (layer1_start >= 0)
      os << "<line x1=\"" << x_of(layer1_start) << "\" x2=\"" << x_of(layer1_start) << "\" y1=\"" << y0 << "\" y2=\""
         << y0 + lanes * kLaneH << "\" stroke=\"black\" stroke-dasharray=\"3,2\"/>\n";
  }
  os << "</svg>\n";
  return os.str();
}

void write_trace_files(const Trace& trace, const std::string& json_path) {
  std::string svg_path = json_path;
  const std::string suffix = ".json";
  if (svg_path.size() > suffix.size() && svg_path.compare(svg_path.size() - suffix.size(), suffix.size(), suffix) == 0)
    svg_path.resize(svg_path.size() - suffix.size());
  svg_path += ".svg";
  for (const auto& [path, text] : {std::pair{json_path, chrome_trace_json(trace)}, {svg_path, timeline_svg(trace)}}) {
    std::ofstream out(path);
    COMET_CHECK(out.good(), "trace: cannot write " << path);
    out << text;
    COMET_CHECK(out.good(), "trace: write to " << path << " failed");
  }
}

}  // namespace io
}  // namespace comet
