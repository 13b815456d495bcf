#include "io/json_text.h"

#include <set>
#include <vector>

namespace comet::io {

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json parse_json_unique_keys(const std::string& text, std::optional<RepeatedJsonKey>& repeated) {
  repeated.reset();
  std::vector<std::set<std::string>> keys;  // of every object being parsed, outermost first
  std::string top_key;
  int top_index = -1;
  const auto find_repeats = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      if (keys.size() == 1) ++top_index;  // an object in the value of top_key
      keys.emplace_back();
    } else if (event == Event::object_end) {
      keys.pop_back();
    } else if (event == Event::key) {
      const std::string key = parsed.get<std::string>();
      if (keys.size() == 1) {
        top_key = key;
        top_index = -1;
      }
      if (!repeated && !keys.back().insert(key).second)
        repeated = RepeatedJsonKey{key, int(keys.size()), keys.size() > 1 ? top_key : "", keys.size() > 1 ? top_index : -1};
    }
    return true;
  };
  return nlohmann::json::parse(text, find_repeats);
}

}  // namespace comet::io
