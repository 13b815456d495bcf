// tools/safetensors.cpp: the safetensors writer and reader of tools/safetensors.h.
//
//   comet run --model mixtral-8x7b --ep 8 --save layer.safetensors
//
// The reader is strict on purpose (it backs the round-trip test): anything the format forbids
// (overlapping or gapped tensors, a shape that disagrees with its byte range, a header that
// runs past the file) is an error rather than something silently tolerated.
#include "safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "comet/error.h"
#include "core/replace_file.h"
#include "io/json_text.h"

namespace comet::tools {
namespace {

struct DTypeInfo {
  StDType dtype;
  const char* name;
  int bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {StDType::kBF16, "BF16", 2}, {StDType::kF16, "F16", 2}, {StDType::kF32, "F32", 4},
    {StDType::kF64, "F64", 8},   {StDType::kI32, "I32", 4}, {StDType::kI64, "I64", 8},
    {StDType::kU8, "U8", 1},
};

// The reference implementation refuses headers above 100 MB; a larger length here means the
// file is not safetensors at all, so refuse before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A 0 anywhere in a shape makes it empty, whatever the other dimensions are; checked first so
// that a product of the others, which may not fit in int64, is never formed.
bool has_zero(const std::vector<int64_t>& shape) {
  return std::find(shape.begin(), shape.end(), 0) != shape.end();
}

int64_t product(const std::vector<int64_t>& shape) {
  if (has_zero(shape)) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The bytes of a tensor of `shape`, or -1 when they do not fit in int64: a product that wraps
// (2^62 F32 elements are 2^64 bytes, 0 mod 2^64) would match an empty byte range. Dimensions
// are non-negative (checked before). A shape with a 0 is 0 bytes in any dimension order
// ([0, 2^62] and [2^62, 0] alike).
int64_t checked_bytes(const std::vector<int64_t>& shape, int dtype_bytes) {
  if (has_zero(shape)) return 0;
  int64_t n = dtype_bytes;
  for (int64_t d : shape) {
    if (n > INT64_MAX / d) return -1;
    n *= d;
  }
  return n;
}

// A JSON array of non-negative integers, as int64. get<std::vector<int64_t>>() would truncate
// 2.5 to 2 and wrap 2^64 - 1 to -1.
std::vector<int64_t> non_negative_integers(const nlohmann::json& v, const std::string& what) {
  if (!v.is_array()) throw Error(what + " is not an array");
  std::vector<int64_t> out;
  for (const nlohmann::json& x : v) {
    const bool ok = x.is_number_unsigned() ? x.get<uint64_t>() <= uint64_t(INT64_MAX)
                                           : x.is_number_integer() && x.get<int64_t>() >= 0;
    // A nested value is named by its type: printing it could be long (and was recursive).
    if (!ok) throw Error(what + " holds " + (x.is_primitive() ? x.dump() : std::string("an ") + x.type_name()) +
                         ", not a non-negative integer");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace

const char* st_dtype_name(StDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

StDType parse_st_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  throw Error("safetensors: unsupported dtype \"" + name + "\"");
}

int st_dtype_bytes(StDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.bytes;
  return 0;
}

int64_t StTensor::num_elements() const { return product(shape); }

void SafetensorsWriter::add(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                            const void* bytes, size_t num_bytes) {
  COMET_CHECK(!name.empty() && name != "__metadata__",
              "safetensors: tensor name \"" << name << "\" is reserved or empty");
  for (const auto& t : tensors_)
    COMET_CHECK(t.name != name, "safetensors: tensor \"" << name << "\" added twice");
  for (int64_t d : shape) COMET_CHECK(d >= 0, "safetensors: negative dimension in " << name);
  const int64_t expected = checked_bytes(shape, st_dtype_bytes(dtype));
  COMET_CHECK(expected >= 0, "safetensors: tensor " << name << " " << st_dtype_name(dtype) << shape_text(shape)
                                                   << " has more than 2^63 - 1 bytes");
  COMET_CHECK(expected == int64_t(num_bytes),
              "safetensors: tensor " << name << " " << st_dtype_name(dtype) << shape_text(shape)
                                     << " needs " << expected << " bytes, got " << num_bytes);
  StTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(num_bytes);
  if (num_bytes) std::memcpy(t.data.data(), bytes, num_bytes);
  tensors_.push_back(std::move(t));
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                const std::vector<float>& v) {
  add(name, StDType::kF32, std::move(shape), v.data(), v.size() * sizeof(float));
}
void SafetensorsWriter::add_f64(const std::string& name, std::vector<int64_t> shape,
                                const std::vector<double>& v) {
  add(name, StDType::kF64, std::move(shape), v.data(), v.size() * sizeof(double));
}
void SafetensorsWriter::add_i32(const std::string& name, std::vector<int64_t> shape,
                                const std::vector<int32_t>& v) {
  add(name, StDType::kI32, std::move(shape), v.data(), v.size() * sizeof(int32_t));
}
void SafetensorsWriter::add_u16(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                                const std::vector<uint16_t>& v) {
  COMET_CHECK(dtype == StDType::kBF16 || dtype == StDType::kF16,
              "safetensors: 16-bit patterns must be BF16 or F16, not " << st_dtype_name(dtype));
  add(name, dtype, std::move(shape), v.data(), v.size() * sizeof(uint16_t));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::string SafetensorsWriter::header() const {
  // ordered_json keeps insertion order, so the header reads in the order tensors were added.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    h["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    const uint64_t end = offset + t.data.size();
    h[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = h.dump();
  // Spaces are the padding the reference writer uses; JSON parsers skip trailing whitespace.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

int64_t SafetensorsWriter::data_bytes() const {
  int64_t n = 0;
  for (const auto& t : tensors_) n += int64_t(t.data.size());
  return n;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string head = header();
  replace_file(path, "safetensors file", [&](std::ostream& out) {
    const uint64_t n = head.size();
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(head.data(), std::streamsize(head.size()));
    for (const auto& t : tensors_)
      out.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size()));
  });
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const StTensor& SafetensorsFile::at(const std::string& name) const {
  const StTensor* t = find(name);
  if (!t) throw Error("safetensors: no tensor named \"" + name + "\"");
  return *t;
}

SafetensorsFile read_safetensors(const std::string& path) {
  // The whole file is read at once: a device or pipe (/dev/zero) would be read until memory ran out.
  std::error_code status_error;
  if (std::filesystem::exists(path, status_error) && !std::filesystem::is_regular_file(path, status_error))
    throw Error("safetensors file \"" + path + "\": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open \"" + path + "\" for reading");
  std::vector<uint8_t> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string where = "safetensors file \"" + path + "\": ";
  if (raw.size() < 8) throw Error(where + "shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(raw[i]) << (8 * i);
  if (n > kMaxHeaderBytes || n > raw.size() - 8)
    throw Error(where + "header length " + std::to_string(n) + " runs past the end of the file");
  const std::string head(reinterpret_cast<const char*>(raw.data() + 8), n);
  if (head.empty() || head[0] != '{') throw Error(where + "header does not start with '{'");
  // nlohmann keeps the last of repeated keys: a second tensor of one name would silently drop
  // the first (and its bytes would read as a gap). Repeated keys are refused, at any depth.
  std::optional<io::RepeatedJsonKey> repeated;
  nlohmann::json h;
  try {
    h = io::parse_json_unique_keys(head, repeated);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + "header is not valid JSON: " + e.what());
  } catch (const io::JsonTextError& e) {
    throw Error(where + "header is not valid JSON: " + e.what());
  }
  if (repeated)
    throw Error(where + (repeated->depth == 1 ? "tensor \"" + repeated->key + "\" appears twice in the header"
                                              : "key \"" + repeated->key + "\" appears twice in one object of the header"));
  if (!h.is_object()) throw Error(where + "header is not a JSON object");

  const uint8_t* data = raw.data() + 8 + n;
  const uint64_t data_size = raw.size() - 8 - n;
  SafetensorsFile file;
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : h.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(where + "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw Error(where + "metadata value of \"" + k + "\" is not a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      StTensor t;
      t.name = name;
      t.dtype = parse_st_dtype(entry.at("dtype").get<std::string>());
      t.shape = non_negative_integers(entry.at("shape"), "shape");
      const std::vector<int64_t> offsets = non_negative_integers(entry.at("data_offsets"), "data_offsets");
      if (offsets.size() != 2 || offsets[0] > offsets[1] || uint64_t(offsets[1]) > data_size)
        throw Error("data_offsets out of the data section");
      const int64_t want = checked_bytes(t.shape, st_dtype_bytes(t.dtype));
      if (want < 0)
        throw Error("shape " + shape_text(t.shape) + " of " + st_dtype_name(t.dtype) + " has more than 2^63 - 1 bytes");
      if (offsets[1] - offsets[0] != want)
        throw Error("shape " + shape_text(t.shape) + " needs " + std::to_string(want) +
                    " bytes but data_offsets span " + std::to_string(offsets[1] - offsets[0]));
      t.data.assign(data + offsets[0], data + offsets[1]);
      ranges.push_back({uint64_t(offsets[0]), uint64_t(offsets[1]), file.tensors.size()});
      file.tensors.push_back(std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + "tensor \"" + name + "\": " + e.what());
    } catch (const Error& e) {
      throw Error(where + "tensor \"" + name + "\": " + e.what());
    }
  }
  // Contiguity: sorted by offset, each tensor starts where the previous one ended and the last
  // one ends at the end of the file (ties between empty tensors are harmless).
  std::stable_sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (const auto& r : ranges) {
    if (r.begin != expect)
      throw Error(where + "tensor \"" + file.tensors[r.index].name + "\" starts at byte " +
                  std::to_string(r.begin) + ", expected " + std::to_string(expect) +
                  " (tensors must be contiguous)");
    expect = r.end;
  }
  if (expect != data_size)
    throw Error(where + std::to_string(data_size - expect) + " bytes after the last tensor");
  std::vector<StTensor> ordered;
  ordered.reserve(ranges.size());
  for (const auto& r : ranges) ordered.push_back(std::move(file.tensors[r.index]));
  file.tensors = std::move(ordered);
  return file;
}

}  // namespace comet::tools
