// Chrome trace JSON and SVG timeline of a Trace.
#include "io/trace_writers.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "comet/error.h"
#include "core/replace_file.h"
#include "io/json_text.h"

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

constexpr TraceKind kKinds[] = {TraceKind::kCommChunk, TraceKind::kGemmTile, TraceKind::kReduce, TraceKind::kWait};

// Colour of each kind in the SVG, and chrome://tracing's reserved colour name for it (Perfetto
// colours slices by name).
struct KindStyle {
  const char* svg;
  const char* chrome;
};
constexpr KindStyle kStyles[] = {{"#1f77b4", "rail_response"},        // kCommChunk
                                 {"#ff7f0e", "thread_state_iowait"},  // kGemmTile
                                 {"#8c8c8c", "grey"},                 // kWait
                                 {"#2ca02c", "good"}};                // kReduce
const char* color(TraceKind kind) { return kStyles[int(kind)].svg; }
const char* chrome_color(TraceKind kind) { return kStyles[int(kind)].chrome; }

const char* layer_name(int layer) {
  return layer == 0 ? "layer0" : layer == 1 ? "layer1" : "owner reduce";
}

std::string event_name(const TraceEvent& e) {
  switch (e.kind) {
    case TraceKind::kCommChunk: return (e.layer == 0 ? "dispatch " : "combine ") + std::to_string(e.id);
    case TraceKind::kGemmTile: return "gemm" + std::to_string(e.layer) + " tile " + std::to_string(e.id);
    case TraceKind::kWait: return "wait " + std::to_string(e.id);
    case TraceKind::kReduce: return "reduce";
  }
  return "?";
}

// Thread ids: per layer, the layer's marker track first, then lanes in order, each lane's
// sublanes (warps) together.
int64_t tid_of(int layer, int lane, int sublane) { return int64_t(layer) * 1000000 + int64_t(lane + 1) * 100 + sublane; }

std::string thread_name(const Trace& t, const TraceEvent& e) {
  if (e.layer == 2) return "owner reduce";
  const int comm_lanes = t.comm_lanes_of(e.layer);
  const bool comm = e.lane < comm_lanes;
  std::ostringstream os;
  os << "L" << e.layer << (comm ? " comm " : " gemm ");
  if (t.layer_panels) os << "block " << e.lane << " warp " << e.sublane;
  else os << (comm ? e.lane : e.lane - comm_lanes);
  return os.str();
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

// A step of 1, 2 or 5 x 10^k with about `ticks` steps in `span`.
double nice_step(double span, int ticks) {
  const double raw = std::max(span / ticks, 1e-9), base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * base >= raw) return m * base;
  return 10 * base;
}

// Microseconds with three decimals, exact for integer nanoseconds.
std::string us(int64_t ns) {
  const int64_t a = ns < 0 ? -ns : ns;
  std::string frac = std::to_string(a % 1000);
  return (ns < 0 ? "-" : "") + std::to_string(a / 1000) + "." + std::string(3 - frac.size(), '0') + frac;
}

// "500 us", "2.5 us": no trailing zeros.
std::string format_us(double ns) {
  std::ostringstream os;
  os << ns / 1e3 << " us";
  return os.str();
}

std::string format_ms(double ns) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(ns < 1e6 ? 3 : 2);
  os << ns / 1e6 << " ms";
  return os.str();
}

// Bars of one lane and kind. Spans are pixel intervals. Overlapping spans (warps of one block
// at work together) become one bar; so does a run of touching spans narrower than kMinPx; a
// bar narrower than kCullPx is left out. Bars of 3 px and more end kGapPx early, so that
// back-to-back tiles stay visible as tiles.
constexpr double kMinPx = 1.0, kJoinPx = 0.5, kCullPx = 0.5, kGapPx = 0.4;

void draw_bars(std::vector<std::pair<double, double>>& spans, double y, int height, std::ostream& os,
               TimelineStats& stats) {
  std::sort(spans.begin(), spans.end());
  for (size_t i = 0; i < spans.size();) {
    double x0 = spans[i].first, x1 = spans[i].second;
    int64_t count = 1;
    for (++i; i < spans.size(); ++i) {
      const auto [a, b] = spans[i];
      const bool tiny = b - a < kMinPx || x1 - x0 < kMinPx;
      if (!(a < x1 || (tiny && a <= x1 + kJoinPx))) break;
      x1 = std::max(x1, b);
      ++count;
    }
    if (x1 - x0 < kCullPx) {
      stats.culled += count;
      continue;
    }
    ++stats.bars;
    stats.merged += count - 1;
    const double w = x1 - x0 >= 3 ? x1 - x0 - kGapPx : x1 - x0;
    os << "<rect x=\"" << x0 << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << height << "\"/>\n";
  }
}

// Spans of one section (a rank, or a rank's kernel), by (row, kind).
using Spans = std::map<std::pair<int, TraceKind>, std::vector<std::pair<double, double>>>;

// Draws every kind of a section in a group of its colour; waits last. `wait_half`: waits use
// the lower half of a lane (GPU: a block's waits overlap its tiles).
void draw_section(Spans& spans, double y0, int lane_h, bool wait_half, std::ostream& os, TimelineStats& stats) {
  for (TraceKind k : kKinds) {
    std::ostringstream bars;
    bars.setf(std::ios::fixed);
    bars.precision(2);
    for (auto& [key, list] : spans) {
      if (key.second != k) continue;
      const int h = k == TraceKind::kWait && wait_half ? std::max(1, lane_h / 2) : lane_h - 1;
      draw_bars(list, y0 + key.first * lane_h + (lane_h - 1 - h), h, bars, stats);
    }
    if (!bars.str().empty())
      os << "<g class=\"" << trace_kind_name(k) << "\" fill=\"" << color(k) << "\">\n" << bars.str() << "</g>\n";
  }
}

void draw_legend(std::ostream& os, const std::string& note) {
  int lx = 130;
  for (TraceKind k : {TraceKind::kCommChunk, TraceKind::kGemmTile, TraceKind::kWait, TraceKind::kReduce}) {
    os << "<rect x=\"" << lx << "\" y=\"26\" width=\"12\" height=\"10\" fill=\"" << color(k) << "\"/><text x=\""
       << lx + 16 << "\" y=\"35\">" << trace_kind_name(k) << "</text>\n";
    lx += 80;
  }
  os << "<text x=\"" << lx + 10 << "\" y=\"35\">" << note << "</text>\n";
}

std::vector<int> drawn_ranks(const Trace& t, const TimelineOptions& o) {
  std::vector<int> ranks;
  for (int r = 0; r < t.world; ++r)
    if (o.ranks.empty() || std::find(o.ranks.begin(), o.ranks.end(), r) != o.ranks.end()) ranks.push_back(r);
  return ranks;
}

// CPU traces: one section per rank, the lanes of its workers (both layers) and the owner
// reduce, on one time axis; a dashed line where layer1 starts.
void rank_sections(const Trace& t, const TimelineOptions& o, std::ostream& os, int& height, TimelineStats& stats) {
  constexpr int kLeft = 130, kLaneH = 7, kRankGap = 10, kTop = 46;
  const int lanes = t.comm_lanes + t.compute_lanes + 1;  // + the owner reduce lane
  const std::vector<int> ranks = drawn_ranks(t, o);
  int64_t end = 1;
  for (const TraceEvent& e : t.events) end = std::max(end, e.end_ns);
  auto x_of = [&](int64_t ns) { return kLeft + double(ns) / double(end) * o.width_px; };
  draw_legend(os, "0 .. " + format_ms(double(end)) + "; dashed: layer0 | layer1");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i], y0 = kTop + int(i) * (lanes * kLaneH + kRankGap);
    os << "<text x=\"10\" y=\"" << y0 + 10 << "\">rank " << r << "</text>\n";
    os << "<text x=\"10\" y=\"" << y0 + 22 << "\" fill=\"#555\">" << t.comm_lanes << " comm, " << t.compute_lanes
       << " gemm</text>\n";
    os << "<rect x=\"" << kLeft << "\" y=\"" << y0 << "\" width=\"" << o.width_px << "\" height=\"" << lanes * kLaneH
       << "\" fill=\"#f7f7f7\"/>\n";
    int64_t layer1_start = -1;
    Spans spans;
    for (const TraceEvent& e : t.events) {
      if (e.rank != r) continue;
      if (e.layer == 1 && (layer1_start < 0 || e.begin_ns < layer1_start)) layer1_start = e.begin_ns;
      spans[{e.layer == 2 ? lanes - 1 : e.lane, e.kind}].push_back({x_of(e.begin_ns), x_of(e.end_ns)});
    }
    draw_section(spans, y0, kLaneH, false, os, stats);
    if (layer1_start >= 0)
      os << "<line x1=\"" << x_of(layer1_start) << "\" x2=\"" << x_of(layer1_start) << "\" y1=\"" << y0 << "\" y2=\""
         << y0 + lanes * kLaneH << "\" stroke=\"black\" stroke-dasharray=\"3,2\"/>\n";
  }
  height = kTop + int(ranks.size()) * (lanes * kLaneH + kRankGap);
}

// GPU traces: one panel per (rank, layer) kernel, one lane per thread block, communication
// blocks on top; every panel from its kernel's first event, on one scale.
void kernel_panels(const Trace& t, const TimelineOptions& o, std::ostream& os, int& height, TimelineStats& stats) {
  constexpr int kLeft = 130, kTop = 46, kHeader = 18, kAxis = 16, kGap = 14;
  const int lanes = std::max(1, t.comm_lanes + t.compute_lanes);
  const int lane_h = std::clamp(400 / lanes, 2, 7);
  const std::vector<int> ranks = drawn_ranks(t, o);
  std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> extent;  // (rank, layer) -> first begin, last end
  for (const TraceEvent& e : t.events) {
    if (std::find(ranks.begin(), ranks.end(), e.rank) == ranks.end() || e.layer > 1) continue;
    auto [it, fresh] = extent.try_emplace({e.rank, e.layer}, e.begin_ns, e.end_ns);
    if (!fresh) it->second = {std::min(it->second.first, e.begin_ns), std::max(it->second.second, e.end_ns)};
  }
  int64_t longest = 1;
  for (const auto& [key, span] : extent) longest = std::max(longest, span.second - span.first);
  const double px_per_ns = double(o.width_px) / double(longest);
  const double step = nice_step(double(longest), 8);
  draw_legend(os, "one panel per kernel (rank, layer), one lane per thread block; grey in a lane's lower half: waiting");
  int y = kTop;
  for (const auto& [key, span] : extent) {
    const auto [r, layer] = key;
    const int comm = t.comm_lanes_of(layer);
    const int64_t start = span.first;
    const double panel_w = double(span.second - start) * px_per_ns;
    os << "<text x=\"10\" y=\"" << y + 13 << "\" font-weight=\"bold\">rank " << r << " " << layer_name(layer)
       << "</text><text x=\"" << kLeft << "\" y=\"" << y + 13 << "\">"
       << (layer == 0 ? "dispatch + GEMM0" : "GEMM1 + combine") << ": blocks 0-" << comm - 1
       << " communicate, " << comm << "-" << lanes - 1 << " run GEMM tiles; " << format_ms(double(span.second - start))
       << ", starting " << format_ms(double(start)) << " into the forward</text>\n";
    const int y0 = y + kHeader;
    os << "<rect x=\"" << kLeft << "\" y=\"" << y0 << "\" width=\"" << panel_w << "\" height=\"" << lanes * lane_h
       << "\" fill=\"" << (layer == 0 ? "#eaf0f8" : "#f8efe6") << "\"/>\n";
    os << "<rect x=\"" << kLeft - 8 << "\" y=\"" << y0 << "\" width=\"5\" height=\"" << lanes * lane_h << "\" fill=\""
       << (layer == 0 ? "#4a6fa5" : "#b5651d") << "\"/>\n";
    os << "<text x=\"10\" y=\"" << y0 + 12 << "\" fill=\"#555\">L" << layer << " comm blocks</text>\n";
    os << "<text x=\"10\" y=\"" << std::max(y0 + comm * lane_h + 12, y0 + 26) << "\" fill=\"#555\">L" << layer
       << " GEMM blocks</text>\n";
    Spans spans;
    for (const TraceEvent& e : t.events)
      if (e.rank == r && e.layer == layer)
        spans[{e.lane, e.kind}].push_back(
            {kLeft + double(e.begin_ns - start) * px_per_ns, kLeft + double(e.end_ns - start) * px_per_ns});
    draw_section(spans, y0, lane_h, true, os, stats);
    os << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + panel_w << "\" y1=\"" << y0 + comm * lane_h << "\" y2=\""
       << y0 + comm * lane_h << "\" stroke=\"#333\" stroke-width=\"0.6\"/>\n";
    const int ya = y0 + lanes * lane_h;
    for (double ns = 0; ns <= double(span.second - start) + 1; ns += step) {
      const double x = kLeft + ns * px_per_ns;
      os << "<line x1=\"" << x << "\" x2=\"" << x << "\" y1=\"" << ya << "\" y2=\"" << ya + 4
         << "\" stroke=\"#333\"/><text x=\"" << x + 2 << "\" y=\"" << ya + 13 << "\" font-size=\"9\">"
         << format_us(ns) << "</text>\n";
    }
    y = ya + kAxis + kGap;
  }
  height = y;
}

}  // namespace

std::string chrome_trace_json(const Trace& t) {
  // Written by hand, one event a line: a GPU trace has hundreds of thousands of events.
  std::ostringstream os;
  nlohmann::json other = {{"title", t.title}, {"world", t.world}, {"dropped_events", t.dropped_events}};
  if (!t.layer_comm_lanes.empty()) other["comm_lanes_per_layer"] = t.layer_comm_lanes;
  // The title and lane names may hold bytes that are not UTF-8 (a device name): json_text.
  os << "{\"displayTimeUnit\":\"ns\",\"otherData\":" << json_text(other) << ",\"traceEvents\":[\n";
  bool first = true;
  auto next = [&]() -> std::ostream& {
    if (!first) os << ",\n";
    first = false;
    return os;
  };
  auto complete = [&](const std::string& name, const char* cat, const char* cname, int64_t begin_ns, int64_t end_ns,
                      int pid, int64_t tid) -> std::ostream& {
    next() << "{\"name\":\"" << name << "\",\"cat\":\"" << cat << "\",";
    if (cname != nullptr) os << "\"cname\":\"" << cname << "\",";
    return os << "\"ph\":\"X\",\"ts\":" << us(begin_ns) << ",\"dur\":" << us(std::max<int64_t>(end_ns - begin_ns, 0))
              << ",\"pid\":" << pid << ",\"tid\":" << tid;
  };
  std::map<std::pair<int, int64_t>, std::string> threads;             // (pid, tid) -> name
  std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> layers;  // (rank, layer) -> extent
  for (const TraceEvent& e : t.events) {
    const int64_t tid = tid_of(e.layer, e.lane, e.sublane);
    threads.try_emplace({e.rank, tid}, thread_name(t, e));
    auto [it, fresh] = layers.try_emplace({e.rank, e.layer}, e.begin_ns, e.end_ns);
    if (!fresh) it->second = {std::min(it->second.first, e.begin_ns), std::max(it->second.second, e.end_ns)};
    complete(event_name(e), trace_kind_name(e.kind), chrome_color(e.kind), e.begin_ns, e.end_ns, e.rank, tid)
        << ",\"args\":{\"layer\":" << e.layer << ",\"id\":" << e.id;
    if (e.items != 1) os << ",\"items\":" << e.items;
    os << "}}";
  }
  // Layer markers: one slice per (rank, layer) over its events, on the layer's first track.
  for (const auto& [key, span] : layers) {
    const int64_t tid = int64_t(key.second) * 1000000;
    threads[{key.first, tid}] = layer_name(key.second);
    complete(layer_name(key.second), "layer", nullptr, span.first, span.second, key.first, tid)
        << ",\"args\":{\"layer\":" << key.second << "}}";
  }
  for (const auto& [key, name] : threads) {
    next() << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << key.first << ",\"tid\":" << key.second
           << ",\"args\":{\"name\":" << json_text(nlohmann::json(name)) << "}}";
    next() << "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" << key.first << ",\"tid\":" << key.second
           << ",\"args\":{\"sort_index\":" << key.second << "}}";
  }
  for (int r = 0; r < t.world; ++r)
    next() << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << r << ",\"args\":{\"name\":\"rank " << r
           << "\"}}";
  os << "\n]}\n";
  return os.str();
}

std::string timeline_svg(const Trace& t, const TimelineOptions& o, TimelineStats* stats_out) {
  TimelineStats stats;
  std::ostringstream body;
  body.setf(std::ios::fixed);
  body.precision(2);
  int height = 0;
  if (t.layer_panels) kernel_panels(t, o, body, height, stats);
  else rank_sections(t, o, body, height, stats);
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 130 + o.width_px + 20 << "\" height=\"" << height + 30
     << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"10\" y=\"16\" font-size=\"14\">" << xml_escape(t.title) << "</text>\n";
  os << body.str();
  std::ostringstream footer;
  if (t.dropped_events > 0)
    footer << t.dropped_events << " communication records dropped (trace buffer full). ";
  if (stats.culled > 0) footer << stats.culled << " events in bars narrower than half a pixel not drawn.";
  if (!footer.str().empty())
    os << "<text x=\"10\" y=\"" << height + 18 << "\" fill=\"" << (t.dropped_events > 0 ? "#c00000" : "#555") << "\">"
       << footer.str() << "</text>\n";
  os << "</svg>\n";
  if (stats_out) *stats_out = stats;
  return os.str();
}

namespace {
// json_path less a trailing ".json" (a path that is only ".json" is kept whole).
std::string json_stem(const std::string& json_path) {
  const std::string json = ".json";
  return json_path.size() > json.size() && json_path.ends_with(json) ? json_path.substr(0, json_path.size() - json.size())
                                                                     : json_path;
}
}  // namespace

std::string trace_svg_path(const std::string& json_path) { return json_stem(json_path) + ".svg"; }

std::string trace_path_with_suffix(const std::string& json_path, const std::string& suffix) {
  return suffix.empty() ? json_path : json_stem(json_path) + suffix + ".json";
}

std::string trace_rank_suffix(int rank) { return "-rank" + std::to_string(rank); }

void write_trace_files(const Trace& trace, const std::string& json_path, const TimelineOptions& svg) {
  // Each file replaces the old one whole: a failed write (disk full, a file size limit) leaves
  // the previous trace, not half of a new one that a viewer would refuse.
  for (const auto& [path, text] :
       {std::pair{json_path, chrome_trace_json(trace)}, {trace_svg_path(json_path), timeline_svg(trace, svg)}})
    replace_file(path, "trace", [&](std::ostream& out) { out << text; });
}

}  // namespace io
}  // namespace comet
