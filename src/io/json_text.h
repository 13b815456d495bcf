// io/json_text.h: JSON as the project writes and reads it (reports, tuning tables, traces,
// safetensors headers).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "comet/error.h"

namespace comet::io {

// `j` as text (`indent` as nlohmann's dump: -1 is one line). Bytes that are not UTF-8 (a device
// name, a path as the user typed it) are replaced by U+FFFD: nlohmann would throw for them, and
// only after the work whose result is being written.
std::string json_text(const nlohmann::json& j, int indent = -1);

// A key that appears twice in one object. nlohmann keeps the last of them and drops the others
// without a word, so a reader whose file must not lose a setting refuses it.
struct RepeatedJsonKey {
  std::string key;
  int depth = 0;        // of the object that holds it: 1 is the outermost
  std::string top_key;  // the outermost object's key whose value holds it (depth > 1)
  int top_index = -1;   // where in that value: 0 for an object, for an array the index of
                        // the element that holds it (every element counted, whatever its type)
};

// Text the readers refuse before nlohmann sees all of it (parse_json_unique_keys): a NUL byte
// (nlohmann takes it for the end of the input, so what follows was never read) and objects or
// arrays nested deeper than kMaxJsonDepth (a message that printed such a value recursed to a
// stack overflow). The message names the problem and its byte offset or depth.
class JsonTextError : public Error {
 public:
  using Error::Error;
};
inline constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse(text) (its exceptions included), and the first repeated key, if any.
// Throws JsonTextError as above.
nlohmann::json parse_json_unique_keys(const std::string& text, std::optional<RepeatedJsonKey>& repeated);

}  // namespace comet::io
