// Link emulation settings: validation, parsing, descriptions (comet/link_emulation.h).
#include "comet/link_emulation.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace comet {

namespace {

std::string number(double v) {
  std::ostringstream os;
  os << v;  // shortest form: 450, 2.5, 0.001
  return os.str();
}

// The whole of `text` as a finite number, or throws naming `what`.
double parse_number(const std::string& text, const char* what, const std::string& whole) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (text.empty() || end == begin || *end != '\0' || !std::isfinite(v))
    throw Error(std::string("link emulation \"") + whole + "\": " + what + " \"" + text +
                "\" is not a number (expected GBPS or GBPS,LATENCY_US, e.g. 450 or 450,2)");
  return v;
}

}  // namespace

Status LinkEmulation::validate() const {
  if (!std::isfinite(gbps) || gbps < 0)
    return Status::failure("link emulation: the rate must be a positive number of GB/s, got " + number(gbps));
  if (!std::isfinite(latency_us) || latency_us < 0 || latency_us > kMaxLatencyUs)
    return Status::failure("link emulation: the latency must be within [0, " + number(kMaxLatencyUs) + "] us, got " +
                           number(latency_us));
  if (gbps > 0 && gbps < kMinGbps)
    return Status::failure("link emulation: the rate must be at least " + number(kMinGbps) + " GB/s, got " +
                           number(gbps));
  if (gbps == 0 && latency_us > 0)
    return Status::failure("link emulation: a latency of " + number(latency_us) + " us needs a rate (GB/s > 0)");
  return Status::success();
}

std::string LinkEmulation::describe() const {
  if (!on()) return "no link emulation";
  return "emulated link " + number(gbps) + " GB/s, " + number(latency_us) + " us";
}

std::string LinkEmulation::short_name() const {
  if (!on()) return "off";
  return number(gbps) + "GB/s," + number(latency_us) + "us";
}

LinkEmulation parse_link_emulation(const std::string& text) {
  const size_t comma = text.find(',');
  LinkEmulation link;
  link.gbps = parse_number(text.substr(0, comma), "the rate", text);
  if (comma != std::string::npos) link.latency_us = parse_number(text.substr(comma + 1), "the latency", text);
  if (link.gbps <= 0)
    throw Error("link emulation \"" + text + "\": the rate must be a positive number of GB/s, got " + number(link.gbps));
  const Status ok = link.validate();
  if (!ok) throw Error(ok.reason);
  return link;
}

}  // namespace comet
