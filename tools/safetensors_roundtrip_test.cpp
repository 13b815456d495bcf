// tools/safetensors_roundtrip_test.cpp: the safetensors writer and reader of the `comet` CLI.
//
//   ./build/tools/safetensors_roundtrip_test                                   (round trips)
//   COMET_SAVED_RUN=layer.safetensors ./build/tools/safetensors_roundtrip_test --gtest_filter=SavedRun.*
//
// Round trips check bytes, shapes, dtypes, metadata and the on-disk layout (8-byte length,
// header padded to 8, contiguous data). SavedRun reads a file written by `comet run --save`
// (ctest runs that first) and recomputes every rank's output in fp64 from the file alone:
// if that matches the saved oracle output, the file is a complete description of the layer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "comet/dtype.h"
#include "comet/error.h"
#include "safetensors.h"
#include "support/file_size_limit.h"

namespace comet::tools {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("comet_st_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A file with one hand-written header, for the malformed cases.
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> bytes(8 + header.size() + data_bytes, 0xab);
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = uint8_t(uint64_t(header.size()) >> (8 * i));
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  return bytes;
}

TEST(Safetensors, RoundTripEveryDtypeAndEmptyTensors) {
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal;
  SafetensorsWriter w;
  std::vector<float> f32(3 * 5);
  for (auto& v : f32) v = normal(gen);
  std::vector<double> f64(7);
  for (auto& v : f64) v = normal(gen);
  std::vector<int32_t> i32 = {0, -1, 7, 2147483647, -2147483647 - 1, 3};
  std::vector<uint16_t> bf16, f16;
  for (float v : f32) {
    bf16.push_back(float_to_bf16_bits(v));
    f16.push_back(float_to_f16_bits(v));
  }
  w.add_f32("a.f32", {3, 5}, f32);
  w.add_u16("b.bf16", StDType::kBF16, {3, 5}, bf16);
  w.add_f64("c.f64", {7}, f64);
  w.add_i32("d.i32", {3, 2}, i32);
  w.add_u16("e.empty", StDType::kBF16, {0, 5}, {});
  w.add_u16("f.f16", StDType::kF16, {5, 3}, f16);
  w.add_f32("g.scalar", {}, {42.0f});
  w.add_i32("h.empty_last", {2, 0}, {});
  w.set_metadata("model", "mixtral-8x7b");
  w.set_metadata("quote\"and\\slash", "line\nbreak \xc3\xa9");
  const std::string path = temp_path("roundtrip.safetensors");
  w.write(path);

  // On-disk layout.
  const auto raw = file_bytes(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(raw[size_t(i)]) << (8 * i);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(n, w.header().size());
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw.size(), 8 + n + uint64_t(w.data_bytes()));
  EXPECT_EQ(w.data_bytes(), int64_t(15 * 4 + 15 * 2 + 7 * 8 + 6 * 4 + 0 + 15 * 2 + 4 + 0));

  const SafetensorsFile file = read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 8u);
  // Read back in data order, which is the order of writing.
  const char* names[] = {"a.f32", "b.bf16", "c.f64", "d.i32", "e.empty", "f.f16", "g.scalar", "h.empty_last"};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(file.tensors[i].name, names[i]);

  auto check = [&](const std::string& name, StDType dtype, std::vector<int64_t> shape,
                   const void* data, size_t bytes) {
    const StTensor& t = file.at(name);
    EXPECT_EQ(t.dtype, dtype) << name;
    EXPECT_EQ(t.shape, shape) << name;
    ASSERT_EQ(t.data.size(), bytes) << name;
    if (bytes) {
      EXPECT_EQ(std::memcmp(t.data.data(), data, bytes), 0) << name;
    }
  };
  check("a.f32", StDType::kF32, {3, 5}, f32.data(), f32.size() * 4);
  check("b.bf16", StDType::kBF16, {3, 5}, bf16.data(), bf16.size() * 2);
  check("c.f64", StDType::kF64, {7}, f64.data(), f64.size() * 8);
  check("d.i32", StDType::kI32, {3, 2}, i32.data(), i32.size() * 4);
  check("e.empty", StDType::kBF16, {0, 5}, nullptr, 0);
  check("f.f16", StDType::kF16, {5, 3}, f16.data(), f16.size() * 2);
  const float scalar = 42.0f;
  check("g.scalar", StDType::kF32, {}, &scalar, 4);
  check("h.empty_last", StDType::kI32, {2, 0}, nullptr, 0);
  EXPECT_EQ(file.metadata.at("model"), "mixtral-8x7b");
  EXPECT_EQ(file.metadata.at("quote\"and\\slash"), "line\nbreak \xc3\xa9");
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_THROW(file.at("missing"), Error);
  std::filesystem::remove(path);
}

// A file that cannot be written completely (a file size limit, as a full disk) is reported, and
// the file it was to replace stays whole, with no temporary left beside it; a target that is not
// a regular file (/dev/null) is written in place, not renamed over.
TEST(Safetensors, AFailedWriteKeepsTheOldFile) {
  SafetensorsWriter small, big;
  small.add_f32("x", {2}, {1.0f, 2.0f});
  big.add_f32("x", {4096}, std::vector<float>(4096, 3.0f));
  const std::string path = temp_path("replace.safetensors");
  small.write(path);
  const std::vector<uint8_t> before = file_bytes(path);
  std::string message;
  {
    const test::FileSizeLimit limit(before.size() + 64);  // far less than the big tensor
    try {
      big.write(path);
    } catch (const Error& e) {
      message = e.what();
    }
  }
  EXPECT_NE(message.find("safetensors file " + path + ": write failed"), std::string::npos) << message;
  EXPECT_EQ(file_bytes(path), before);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  big.write(path);
  EXPECT_EQ(read_safetensors(path).at("x").shape, std::vector<int64_t>{4096});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove(path);

  small.write("/dev/null");
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  EXPECT_FALSE(std::filesystem::exists("/dev/null.tmp"));
}

TEST(Safetensors, WriterRejectsBadTensors) {
  SafetensorsWriter w;
  std::vector<float> v(6);
  EXPECT_THROW(w.add_f32("x", {2, 2}, v), Error);  // 4 elements declared, 6 given
  w.add_f32("x", {2, 3}, v);
  EXPECT_THROW(w.add_f32("x", {6}, v), Error);     // duplicate name
  EXPECT_THROW(w.add_f32("__metadata__", {6}, v), Error);
  EXPECT_THROW(w.add_u16("y", StDType::kF32, {1}, {1}), Error);
  EXPECT_THROW(w.write("/nonexistent-dir/x.safetensors"), Error);
  // 2^62 F32 elements are 2^64 bytes, which wrapped to the 0 bytes given.
  EXPECT_THROW(w.add("huge", StDType::kF32, {int64_t(1) << 62}, nullptr, 0), Error);
}

TEST(Safetensors, ReaderRejectsMalformedFiles) {
  const std::string path = temp_path("bad.safetensors");
  auto expect_rejected = [&](const std::vector<uint8_t>& bytes, const char* why) {
    write_bytes(path, bytes);
    EXPECT_THROW(read_safetensors(path), Error) << why;
  };
  expect_rejected({1, 2, 3}, "shorter than the length field");
  expect_rejected(make_file("[1, 2]", 0), "header is not an object");
  expect_rejected(make_file(R"({"a": 1})", 0), "tensor entry is not an object");
  std::filesystem::remove(path);
  // A device is not read until memory runs out.
  if (std::filesystem::exists("/dev/zero")) {
    try {
      read_safetensors("/dev/zero");
      ADD_FAILURE() << "/dev/zero was read as a safetensors file";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
}

TEST(Safetensors, ReaderChecksLayout) {
  const std::string path = temp_path("layout.safetensors");
  auto rejected = [&](const std::string& header, size_t data) {
    write_bytes(path, make_file(header, data));
    try {
      read_safetensors(path);
    } catch (const Error&) {
      return true;
    }
    return false;
  };
  EXPECT_FALSE(rejected("{}", 0));
  EXPECT_FALSE(rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_TRUE(rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12))
      << "bytes after the last tensor";
  EXPECT_TRUE(rejected(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8))
      << "shape disagrees with the byte range";
  EXPECT_TRUE(rejected(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8))
      << "gap before the first tensor";
  EXPECT_TRUE(rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       12))
      << "overlapping tensors";
  EXPECT_TRUE(rejected(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8))
      << "unknown dtype";
  EXPECT_TRUE(rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8))
      << "offsets past the end";
  EXPECT_TRUE(rejected(R"({"__metadata__":{"k":1}})", 0)) << "metadata values are strings";
  EXPECT_TRUE(rejected("not json", 0));
  // A length field that points past the end of the file.
  auto bytes = make_file("{}", 0);
  bytes[0] = 0xff;
  write_bytes(path, bytes);
  EXPECT_THROW(read_safetensors(path), Error);
  std::filesystem::remove(path);
}

// What reading a file of this header and `data` bytes says: "accepted", or the refusal.
std::string read_message(const std::string& path, const std::string& header, size_t data) {
  write_bytes(path, make_file(header, data));
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

// Dimensions and offsets are non-negative JSON integers, and a shape's byte count must fit in
// 64 bits: a wrapped product (2^62 x 4 bytes = 2^64, "0") once matched an empty byte range, and
// 2.5 was read as 2. Each refusal names the tensor.
TEST(Safetensors, ReaderRejectsOverflowingAndNonIntegerShapes) {
  const std::string path = temp_path("shapes.safetensors");
  auto message = [&](const std::string& header, size_t data) { return read_message(path, header, data); };
  EXPECT_EQ(message(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "accepted");
  EXPECT_EQ(message(R"({"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})", 0), "accepted");
  const std::string wraps = message(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(wraps.find("tensor \"a\": shape [4611686018427387904] of F32 has more than 2^63 - 1 bytes"),
            std::string::npos) << wraps;
  const std::string square = message(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(square.find("more than 2^63 - 1 bytes"), std::string::npos) << square;
  const std::string fraction = message(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(fraction.find("shape holds 2.5, not a non-negative integer"), std::string::npos) << fraction;
  const std::string negative = message(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(negative.find("shape holds -2"), std::string::npos) << negative;
  const std::string too_big = message(R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(too_big.find("shape holds 18446744073709551615"), std::string::npos) << too_big;
  const std::string offset = message(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", 8);
  EXPECT_NE(offset.find("data_offsets holds 8.0"), std::string::npos) << offset;
  // A 0 anywhere is 0 bytes, in either order: the overflow check once saw 2^62 before the 0.
  EXPECT_EQ(message(R"({"a":{"dtype":"F32","shape":[4611686018427387904,0],"data_offsets":[0,0]}})", 0), "accepted");
  EXPECT_EQ(message(R"({"a":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", 0), "accepted");
  EXPECT_EQ(message(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0),
            "accepted");
  std::filesystem::remove(path);
}

// Hostile headers of a few hundred KB: a shape nested 100000 deep once crashed the reader (its
// error message printed the value recursively, past the stack); any nesting deeper than the
// readers' limit is refused first, and a nested value in a shape is named by its type. A NUL
// byte ended nlohmann's input, so what followed it was never read; it is refused by offset.
TEST(Safetensors, ReaderRefusesDeepNestingAndNulBytes) {
  const std::string path = temp_path("hostile.safetensors");
  const int deep = 100000;
  const std::string nested = std::string(size_t(deep), '[') + std::string(size_t(deep), ']');
  const std::string crash = read_message(path, R"({"a":{"dtype":"F32","shape":[)" + nested + R"(],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(crash.find("header is not valid JSON: objects and arrays nested deeper than 64 levels"), std::string::npos)
      << crash;
  const std::string shallow = read_message(path, R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(shallow.find("shape holds an array, not a non-negative integer"), std::string::npos) << shallow;
  const std::string nul = read_message(path, std::string("{}\0garbage!", 12), 0);
  EXPECT_NE(nul.find("header is not valid JSON: a NUL byte at offset 2"), std::string::npos) << nul;
  std::filesystem::remove(path);
}

// A repeated tensor name would keep only the last entry of that name (nlohmann's last-wins),
// dropping the first without a word; it is refused naming the name, as is any repeated key.
TEST(Safetensors, ReaderRejectsRepeatedNames) {
  const std::string path = temp_path("repeated.safetensors");
  auto message = [&](const std::string& header, size_t data) { return read_message(path, header, data); };
  const std::string twice = message(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                    8);
  EXPECT_NE(twice.find("tensor \"a\" appears twice in the header"), std::string::npos) << twice;
  const std::string key = message(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(key.find("key \"dtype\" appears twice"), std::string::npos) << key;
  const std::string meta = message(R"({"__metadata__":{"k":"1","k":"2"}})", 0);
  EXPECT_NE(meta.find("key \"k\" appears twice"), std::string::npos) << meta;
  // The same name in two different objects is no repeat.
  EXPECT_EQ(message(R"({"__metadata__":{"a":"x"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
            "accepted");
  std::filesystem::remove(path);
}

// ---- A file written by `comet run --save`, recomputed from its own contents. ----

std::vector<double> as_doubles(const StTensor& t) {
  std::vector<double> out(size_t(t.num_elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case StDType::kBF16: {
        uint16_t b;
        std::memcpy(&b, t.data.data() + 2 * i, 2);
        out[i] = bf16_bits_to_float(b);
        break;
      }
      case StDType::kF16: {
        uint16_t b;
        std::memcpy(&b, t.data.data() + 2 * i, 2);
        out[i] = f16_bits_to_float(b);
        break;
      }
      case StDType::kF32: {
        float f;
        std::memcpy(&f, t.data.data() + 4 * i, 4);
        out[i] = f;
        break;
      }
      case StDType::kF64:
        std::memcpy(&out[i], t.data.data() + 8 * i, 8);
        break;
      default:
        ADD_FAILURE() << t.name << " is not a float tensor";
    }
  }
  return out;
}

TEST(SavedRun, ReadsBackAndRecomputes) {
  const char* path = std::getenv("COMET_SAVED_RUN");
  if (!path) GTEST_SKIP() << "COMET_SAVED_RUN is not set (ctest sets it after cli_run_save)";
  const SafetensorsFile file = read_safetensors(path);
  const auto& meta = file.metadata;
  for (const char* key : {"format", "model", "hidden", "ffn", "num_experts", "topk", "activation",
                          "world", "ep", "tp", "dtype", "seed", "routing", "tokens_per_rank"})
    ASSERT_TRUE(meta.count(key)) << "metadata lacks " << key;
  EXPECT_EQ(meta.at("format"), "comet-moe-layer");
  ASSERT_EQ(meta.at("activation"), "swiglu") << "this check recomputes SwiGLU layers only";
  const int64_t H = std::stoll(meta.at("hidden")), F = std::stoll(meta.at("ffn"));
  const int64_t E = std::stoll(meta.at("num_experts")), K = std::stoll(meta.at("topk"));
  const int world = std::stoi(meta.at("world"));
  ASSERT_EQ(world, std::stoi(meta.at("ep")) * std::stoi(meta.at("tp")));
  const StDType storage = meta.at("dtype") == "bf16"  ? StDType::kBF16
                          : meta.at("dtype") == "f16" ? StDType::kF16
                                                      : StDType::kF32;

  const StTensor& wg_t = file.at("weights.w_gate");
  const StTensor& wu_t = file.at("weights.w_up");
  const StTensor& wd_t = file.at("weights.w_down");
  EXPECT_EQ(wg_t.shape, (std::vector<int64_t>{E, H, F}));
  EXPECT_EQ(wu_t.shape, (std::vector<int64_t>{E, H, F}));
  EXPECT_EQ(wd_t.shape, (std::vector<int64_t>{E, F, H}));
  for (const auto* t : {&wg_t, &wu_t, &wd_t}) EXPECT_EQ(t->dtype, storage) << t->name;
  const auto wg = as_doubles(wg_t), wu = as_doubles(wu_t), wd = as_doubles(wd_t);

  // tokens_per_rank: one count for all ranks, or one per rank.
  std::vector<int64_t> tokens;
  {
    std::stringstream ss(meta.at("tokens_per_rank"));
    std::string item;
    while (std::getline(ss, item, ',')) tokens.push_back(std::stoll(item));
    if (tokens.size() == 1) tokens.assign(size_t(world), tokens[0]);
    ASSERT_EQ(tokens.size(), size_t(world));
  }
  int64_t total_tokens = 0;
  double total_norm = 0;
  for (int r = 0; r < world; ++r) {
    const std::string p = "rank" + std::to_string(r) + ".";
    const StTensor& x_t = file.at(p + "x");
    const int64_t T = tokens[size_t(r)];  // 0 is valid: [0, H] tensors with empty byte ranges
    total_tokens += T;
    EXPECT_EQ(x_t.shape, (std::vector<int64_t>{T, H}));
    EXPECT_EQ(x_t.dtype, storage);
    const StTensor& ids_t = file.at(p + "expert_ids");
    const StTensor& w_t = file.at(p + "expert_weights");
    const StTensor& y_t = file.at(p + "y");
    const StTensor& yo_t = file.at(p + "y_oracle");
    EXPECT_EQ(ids_t.dtype, StDType::kI32);
    EXPECT_EQ(ids_t.shape, (std::vector<int64_t>{T, K}));
    EXPECT_EQ(w_t.dtype, StDType::kF32);
    EXPECT_EQ(w_t.shape, (std::vector<int64_t>{T, K}));
    EXPECT_EQ(y_t.dtype, storage);
    EXPECT_EQ(y_t.shape, (std::vector<int64_t>{T, H}));
    EXPECT_EQ(yo_t.dtype, StDType::kF64);
    EXPECT_EQ(yo_t.shape, (std::vector<int64_t>{T, H}));

    const auto x = as_doubles(x_t), w = as_doubles(w_t), y = as_doubles(y_t), yo = as_doubles(yo_t);
    std::vector<int32_t> ids(size_t(T * K));
    if (!ids.empty()) std::memcpy(ids.data(), ids_t.data.data(), ids.size() * 4);
    // y_t = sum_j w_tj * ((silu(x Wg) * (x Wu)) Wd)[e_tj], in double, straight from the file.
    std::vector<double> want(size_t(T * H), 0.0);
    std::vector<double> inter(static_cast<size_t>(F));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[size_t(t * K + j)];
        if (e < 0) continue;
        ASSERT_LT(e, E);
        for (int64_t f = 0; f < F; ++f) {
          double g = 0, u = 0;
          for (int64_t h = 0; h < H; ++h) {
            g += x[size_t(t * H + h)] * wg[size_t((e * H + h) * F + f)];
            u += x[size_t(t * H + h)] * wu[size_t((e * H + h) * F + f)];
          }
          inter[size_t(f)] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (int64_t f = 0; f < F; ++f) acc += inter[size_t(f)] * wd[size_t((e * F + f) * H + h)];
          want[size_t(t * H + h)] += w[size_t(t * K + j)] * acc;
        }
      }
    double err_oracle = 0, err_y = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err_oracle += (yo[i] - want[i]) * (yo[i] - want[i]);
      err_y += (y[i] - want[i]) * (y[i] - want[i]);
      norm += want[i] * want[i];
    }
    total_norm += norm;
    if (norm > 0) {
      EXPECT_LT(std::sqrt(err_oracle / norm), 1e-9) << "rank " << r << ": y_oracle is not the layer";
      EXPECT_LT(std::sqrt(err_y / norm), 1e-2) << "rank " << r << ": y is not the layer";
    } else {  // a rank whose recomputed output is zero: the saved outputs must be zero too
      EXPECT_EQ(err_oracle, 0.0) << "rank " << r << ": y_oracle is not the layer";
      EXPECT_EQ(err_y, 0.0) << "rank " << r << ": y is not the layer";
    }
  }
  EXPECT_GT(total_tokens, 0);
  EXPECT_GT(total_norm, 0.0) << "the recomputed outputs are all zero: the file's weights or inputs are empty";
}

}  // namespace
}  // namespace comet::tools
