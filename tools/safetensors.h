// tools/safetensors.h: a minimal writer and reader of the safetensors format, so that a
// `comet run --save layer.safetensors` result can be opened by numpy, PyTorch or the
// `safetensors` package without any of them being needed here.
//
//   comet run --model qwen2-moe-2.7b --tokens 64 --ep 4 --save layer.safetensors
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian u64 N, then N
// bytes of UTF-8 JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]},
// ..., "__metadata__": {"key": "value"}}, then the data. Offsets are relative to the first
// byte after the header; tensors are contiguous and cover the data exactly; values are
// little-endian and row-major. The header is padded with spaces to a multiple of 8 so the
// data starts aligned.
//
// Pitfalls: metadata values must be strings (the format says so); a tensor with a 0 in its
// shape is valid and has begin == end. This code assumes a little-endian host (x86-64,
// aarch64), which it checks at compile time.
#pragma once

#include <bit>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace comet::tools {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this writer copies host bytes as they are");

// The element types the writer accepts; their names are the format's names.
enum class StDType { kBF16, kF16, kF32, kF64, kI32, kI64, kU8 };

const char* st_dtype_name(StDType dtype);            // "BF16", "F16", ...
StDType parse_st_dtype(const std::string& name);     // throws comet::Error
int st_dtype_bytes(StDType dtype);

struct StTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // little-endian, row-major, product(shape) * dtype bytes

  int64_t num_elements() const;
};

// Collects tensors in insertion order and writes them, in that order, to one file.
class SafetensorsWriter {
 public:
  // Copies `bytes` (product(shape) * dtype bytes, checked). Names must be unique.
  void add(const std::string& name, StDType dtype, std::vector<int64_t> shape,
           const void* bytes, size_t num_bytes);
  // Convenience overloads for the element types the CLI stores.
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v);
  void add_f64(const std::string& name, std::vector<int64_t> shape, const std::vector<double>& v);
  void add_i32(const std::string& name, std::vector<int64_t> shape, const std::vector<int32_t>& v);
  void add_u16(const std::string& name, StDType dtype, std::vector<int64_t> shape,
               const std::vector<uint16_t>& v);  // BF16 or F16 bit patterns

  void set_metadata(const std::string& key, const std::string& value);

  // The header JSON exactly as written (without the 8-byte length), padded to 8 bytes.
  std::string header() const;
  int64_t data_bytes() const;
  // Through replace_file: a file that cannot be written completely throws comet::Error naming
  // the path and leaves the old file as it was.
  void write(const std::string& path) const;

 private:
  std::vector<StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsFile {
  std::vector<StTensor> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;

  const StTensor* find(const std::string& name) const;  // nullptr when absent
  const StTensor& at(const std::string& name) const;    // throws comet::Error when absent
};

// Reads and validates a whole file: header length within the file, JSON well-formed without
// repeated keys (a tensor name appears once), known dtypes, data_offsets consistent with
// shape * dtype size (0 bytes for a 0 in any dimension), tensors contiguous and covering the
// data. Throws comet::Error saying what is wrong.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace comet::tools
