#include "io/json_text.h"

#include <set>
#include <string>
#include <vector>

namespace comet::io {

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json parse_json_unique_keys(const std::string& text, std::optional<RepeatedJsonKey>& repeated) {
  repeated.reset();
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw JsonTextError("a NUL byte at offset " + std::to_string(nul) + ", which JSON text never holds");
  // Every object and array being parsed, outermost first; an object keeps the keys it has.
  struct Open {
    bool object = false;
    std::set<std::string> keys;
  };
  std::vector<Open> open;
  int objects = 0;  // of `open`
  std::string top_key;
  int top_index = -1;
  const auto find_repeats = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    // The value of top_key: an object is entry 0; in an array every element counts, whatever
    // its type, as a reader numbers the entries of a list (`[5, {...}]`: the object is entry 1).
    const bool starts_value = event == Event::object_start || event == Event::array_start || event == Event::value;
    if (event == Event::object_start && open.size() == 1 && open[0].object) top_index = 0;
    if (starts_value && open.size() == 2 && open[0].object && !open[1].object) ++top_index;
    if (event == Event::object_start || event == Event::array_start) {
      if (open.size() >= size_t(kMaxJsonDepth))
        throw JsonTextError("objects and arrays nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      open.push_back({event == Event::object_start, {}});
      objects += open.back().object;
    } else if (event == Event::object_end || event == Event::array_end) {
      objects -= open.back().object;
      open.pop_back();
    } else if (event == Event::key) {
      const std::string key = parsed.get<std::string>();
      if (open.size() == 1) {
        top_key = key;
        top_index = -1;
      }
      if (!repeated && !open.back().keys.insert(key).second)
        repeated = RepeatedJsonKey{key, objects, objects > 1 ? top_key : "", objects > 1 ? top_index : -1};
    }
    return true;
  };
  return nlohmann::json::parse(text, find_repeats);
}

}  // namespace comet::io
