// unit/tuning_test.cpp: tuning table lookup (exact workload class, nearest tokens, distance
// limit, ties), the analytic n_comm fallback, the forward path choice, and the JSON format.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comet/tuning.h"
#include "io/json_text.h"
#include "io/tuning_json.h"
#include "support/file_size_limit.h"
#include "support/preset_config.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::FileSizeLimit;
using test::throws_with;

LayerConfig mixtral_ep8() { return test::preset_config("mixtral-8x7b", 8, 1, 4096); }

// `json` with its first `from` replaced by `to`, parsed as t.json, is refused with a message
// naming the file, entry 0 and each of `words` (a failure, not a crash, when `from` is missing).
::testing::AssertionResult edit_is_refused(std::string json, const std::string& from, const std::string& to,
                                           std::vector<std::string> words) {
  const size_t at = json.find(from);
  if (at == std::string::npos) return ::testing::AssertionFailure() << "\"" << from << "\" is not in: " << json;
  json.replace(at, from.size(), to);
  words.insert(words.begin(), {"t.json", "entry 0"});
  return throws_with<Error>([&] { io::parse_tuning_table(json, "t.json"); }, words);
}

TuningTable table_with(std::initializer_list<std::tuple<int, int, int>> tokens_n0_n1) {
  TuningTable t;
  for (auto [tokens, n0, n1] : tokens_n0_n1)
    t.add({tuning_key(mixtral_ep8(), "NVIDIA H200", 132, tokens), n0, n1, 100.0});
  return t;
}

TEST(Tuning, NearestEntryByTokensWithinTheSameClass) {
  const TuningTable t = table_with({{1024, 10, 11}, {4096, 20, 21}, {16384, 30, 31}});
  const auto m = t.nearest(tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 5000));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->entry->n_comm0, 20);
  EXPECT_NEAR(m->distance, std::log2(5000.0 / 4096), 1e-12);
  // Exactly between 4096 and 16384 (8192): the entry with fewer tokens wins.
  const auto tie = t.nearest(tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 8192));
  ASSERT_TRUE(tie);
  EXPECT_EQ(tie->entry->key.tokens_per_rank, 4096);
}

TEST(Tuning, OtherGpuShapeOrLayoutNeverMatches) {
  const TuningTable t = table_with({{4096, 20, 21}});
  EXPECT_FALSE(t.nearest(tuning_key(mixtral_ep8(), "NVIDIA H100", 132, 4096)));
  EXPECT_FALSE(t.nearest(tuning_key(mixtral_ep8(), "NVIDIA H200", 114, 4096)));
  LayerConfig other = mixtral_ep8();
  other.layout = {8, 4, 2};
  EXPECT_FALSE(t.nearest(tuning_key(other, "NVIDIA H200", 132, 4096)));
  other = mixtral_ep8();
  other.model.topk = 1;
  EXPECT_FALSE(t.nearest(tuning_key(other, "NVIDIA H200", 132, 4096)));
}

// Virtual ranks on one GPU, one rank per GPU and several ranks per GPU are different workloads
// for n_comm: the same layout's entries never stand in for each other, and a GPU count that does
// not divide W is refused.
TEST(Tuning, VirtualRanksAndOneRankPerGpuNeverMatch) {
  const TuningTable one_gpu = table_with({{4096, 20, 21}});
  EXPECT_FALSE(one_gpu.nearest(tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 8)));
  TuningTable eight_gpus;
  eight_gpus.add({tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 8), 32, 2, 50.0});
  EXPECT_FALSE(eight_gpus.nearest(tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096)));
  const auto m = eight_gpus.nearest(tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 8));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->entry->n_comm0, 32);
  EXPECT_NE(m->entry->key.describe().find("on 8 GPUs"), std::string::npos) << m->entry->key.describe();
  const TuningKey four_per_gpu = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 2);
  EXPECT_FALSE(eight_gpus.nearest(four_per_gpu));
  EXPECT_FALSE(one_gpu.nearest(four_per_gpu));
  EXPECT_NE(four_per_gpu.describe().find("on 2 GPUs"), std::string::npos) << four_per_gpu.describe();
  EXPECT_TRUE(throws_with<Error>([] { tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 3); },
                                 {"3 GPUs", "W = 8", "a divisor of W"}));
  EXPECT_TRUE(throws_with<Error>([] { tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 0); }, {"0 GPUs"}));
}

TEST(Tuning, AddReplacesAnEqualKey) {
  TuningTable t = table_with({{4096, 20, 21}});
  t.add({tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096), 24, 25, 90.0});
  ASSERT_EQ(t.entries().size(), 1u);
  EXPECT_EQ(t.entries()[0].n_comm0, 24);
  EXPECT_THROW(t.add({tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 0), 1, 1, 0}), Error);
}

TEST(Tuning, ChooseUsesTheTableWhenNearAndTheCostModelOtherwise) {
  const TuningTable t = table_with({{4096, 20, 21}});
  const LayerConfig c = mixtral_ep8();
  LayerCost cost;
  cost.flops_max_rank = 2e12;
  cost.link_bytes_max_rank = 4e8;
  const GpuSpec& h200 = gpu_spec("H200");
  NCommChoice near = choose_n_comm(&t, tuning_key(c, "NVIDIA H200", 132, 6000), c, cost, h200);
  EXPECT_EQ(near.n_comm0, 20);
  EXPECT_EQ(near.n_comm1, 21);
  EXPECT_NE(near.source.find("tuning table"), std::string::npos) << near.source;
  // 9000 tokens is more than a factor of 2 from 4096: fallback, and the source says why.
  NCommChoice far = choose_n_comm(&t, tuning_key(c, "NVIDIA H200", 132, 9000), c, cost, h200);
  EXPECT_NE(far.source.find("cost model"), std::string::npos) << far.source;
  EXPECT_GE(far.n_comm0, 1);
  EXPECT_LE(far.n_comm0, 66);
  NCommChoice none = choose_n_comm(nullptr, tuning_key(c, "NVIDIA H200", 132, 4096), c, cost, h200);
  EXPECT_EQ(none.n_comm0, far.n_comm0);
  EXPECT_NE(none.source.find("cost model"), std::string::npos);
  // The fallback's floors: 32 layer0 blocks at least, 2 layer1 blocks (what W = 8 measured).
  cost.link_bytes_max_rank = 0;
  const NCommChoice idle = choose_n_comm(nullptr, tuning_key(c, "NVIDIA H200", 132, 4096), c, cost, h200);
  EXPECT_EQ(idle.n_comm0, 32);
  EXPECT_EQ(idle.n_comm1, 2);
}

TEST(Tuning, AnalyticNCommBalancesGemmAndCopies) {
  // More bytes per FLOP needs more communication blocks; the answer stays in [1, SMs/2].
  const int few = analytic_n_comm(1e12, 1e7, 132, 785, 450, 14);
  const int many = analytic_n_comm(1e12, 1e9, 132, 785, 450, 14);
  EXPECT_GE(few, 1);
  EXPECT_LT(few, many);
  EXPECT_LE(many, 66);
  // No communication at all: one block (the smallest n of the ties).
  EXPECT_EQ(analytic_n_comm(1e12, 0, 132, 785, 450, 14), 1);
  // Saturating the link needs 450 / 14 = 33 blocks; more never helps.
  EXPECT_LE(analytic_n_comm(1e6, 1e12, 132, 785, 450, 14), 33);
  EXPECT_THROW(analytic_n_comm(1, 1, 1, 785, 450, 14), Error);
}

TEST(TuningJson, RoundTripAndClearErrors) {
  const TuningTable t = table_with({{1024, 10, 11}, {4096, 20, 21}});
  const TuningTable back = io::parse_tuning_table(io::tuning_table_json(t));
  ASSERT_EQ(back.entries().size(), 2u);
  EXPECT_EQ(back.entries()[1].key.describe(), t.entries()[1].key.describe());
  EXPECT_EQ(back.entries()[1].n_comm1, 21);
  EXPECT_TRUE(throws_with<Error>([] { io::parse_tuning_table("{", "x.json"); }, {"x.json", "not JSON"}));
  EXPECT_TRUE(throws_with<Error>([] { io::parse_tuning_table(R"({"format":"v0","entries":[]})", "x.json"); },
                                 {"format"}));
  EXPECT_TRUE(edit_is_refused(io::tuning_table_json(t), "\"n_comm0\"", "\"n_comm_0\"", {"n_comm_0"}));
  EXPECT_TRUE(throws_with<Error>([] { io::load_tuning_table("/nonexistent/t.json"); }, {"cannot be read"}));
  // An endless file is refused by name once past the bound, not read until memory runs out.
  if (std::ifstream("/dev/zero").good())
    EXPECT_TRUE(throws_with<Error>([] { io::load_tuning_table("/dev/zero"); }, {"/dev/zero", "larger than"}));
}

// nlohmann keeps the last of repeated keys, and TuningTable::add the last of two entries of one
// workload: each would drop a setting without a word, so each is refused by name.
TEST(TuningJson, RefusesRepeatedKeysAndRepeatedWorkloads) {
  const std::string one = io::tuning_table_json(table_with({{4096, 20, 21}}));
  EXPECT_TRUE(edit_is_refused(one, "\"n_comm0\": 20", "\"n_comm0\": 8, \"n_comm0\": 20",
                              {"key \"n_comm0\" appears twice"}));
  const std::string two = io::tuning_table_json(table_with({{1024, 10, 11}, {4096, 20, 21}}));
  EXPECT_TRUE(throws_with<Error>(
      [&] {
        std::string text = two;
        const std::string from = "\"n_comm1\": 21";
        text.replace(text.find(from), from.size(), from + ", \"n_comm1\": 2");
        io::parse_tuning_table(text, "t.json");
      },
      {"t.json entry 1", "key \"n_comm1\" appears twice"}));
  EXPECT_TRUE(throws_with<Error>(
      [&] {
        std::string text = two;
        const std::string from = "\"format\"";
        text.replace(text.find(from), from.size(), "\"format\": \"x\", " + from);
        io::parse_tuning_table(text, "t.json");
      },
      {"t.json: key \"format\" appears twice"}));
  // Two entries of one workload: the second names the first.
  std::string same = two;
  const std::string tokens = "\"tokens_per_rank\": 1024";
  same.replace(same.find(tokens), tokens.size(), "\"tokens_per_rank\": 4096");
  EXPECT_TRUE(throws_with<Error>([&] { io::parse_tuning_table(same, "t.json"); },
                                 {"t.json entry 1", "the same workload as entry 0", "4096 tokens/rank"}));
  // The same key in different entries is no repeat.
  EXPECT_EQ(io::parse_tuning_table(two, "t.json").entries().size(), 2u);
}

// The repeated key's entry is its index in "entries", every element counted: a non-object
// before it (refused later, as "not an object") once shifted the number to the wrong entry.
TEST(TuningJson, RepeatedKeyNamesItsEntryCountingEveryElement) {
  const std::string one = io::tuning_table_json(table_with({{4096, 20, 21}}));
  const size_t open = one.find('[');
  const size_t close = one.rfind(']');
  const std::string entry = one.substr(open + 1, close - open - 1);
  std::string repeated = entry;
  const std::string from = "\"n_comm0\": 20";
  repeated.replace(repeated.find(from), from.size(), from + ", \"n_comm0\": 8");
  const std::string text = one.substr(0, open + 1) + "5, [1, {}], " + entry + ", " + repeated + one.substr(close);
  EXPECT_TRUE(throws_with<Error>([&] { io::parse_tuning_table(text, "t.json"); },
                                 {"t.json entry 3: key \"n_comm0\" appears twice"}));
}

// The header's promise, at the top level too: only "format" and "entries", what
// tuning_table_json writes; another key (a misspelt one, a setting this reader does not know)
// is refused by name rather than dropped.
TEST(TuningJson, RefusesUnknownTopLevelKeys) {
  const std::string text = io::tuning_table_json(table_with({{4096, 20, 21}}));
  EXPECT_EQ(text.find("{\n  \"entries\""), 0u) << text;
  for (const std::string key : {"entires", "note", "n_comm0"}) {
    const std::string quoted = "\"" + key + "\"";
    const std::string edited = "{" + quoted + ": 1, " + text.substr(1);
    EXPECT_TRUE(throws_with<Error>([&] { io::parse_tuning_table(edited, "t.json"); },
                                   {"t.json: unknown key " + quoted}))
        << key;
  }
  EXPECT_EQ(io::parse_tuning_table(text, "t.json").entries().size(), 1u);
}

// A table with a NUL byte (whatever follows it was never read: nlohmann stops there) or nested
// past the readers' depth limit is not JSON, by name.
TEST(TuningJson, RefusesNulBytesAndDeepNesting) {
  const std::string text = io::tuning_table_json(table_with({{4096, 20, 21}}));
  const std::string with_nul = text + std::string("\0{\"entries\": 5}", 15);
  EXPECT_TRUE(throws_with<Error>([&] { io::parse_tuning_table(with_nul, "t.json"); },
                                 {"t.json: not JSON (a NUL byte at offset " + std::to_string(text.size()) + ", which JSON text never holds)"}));
  const std::string deep = "{\"format\": " + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_TRUE(throws_with<Error>([&] { io::parse_tuning_table(deep, "t.json"); },
                                 {"t.json: not JSON (objects and arrays nested deeper than 64 levels)"}));
}

// A GPU name that is not UTF-8 (the driver's bytes) is written with U+FFFD, not refused after the
// whole sweep ran.
TEST(TuningJson, NonUtf8GpuNameIsReplacedNotRefused) {
  TuningTable t;
  t.add({tuning_key(mixtral_ep8(), "GPU \xff", 132, 4096), 20, 21, 100.0});
  std::string text;
  ASSERT_NO_THROW(text = io::tuning_table_json(t));
  EXPECT_EQ(io::parse_tuning_table(text).entries().at(0).key.gpu, "GPU \xef\xbf\xbd");
}

// The key keeps the name as the table's file will hold it, so a second sweep on that GPU
// replaces the entry it loaded (it added a second one of the same workload, and the next load
// refused the file) and the lookup finds it.
TEST(TuningJson, NonUtf8GpuNameKeysMatchAfterARoundTrip) {
  const TuningKey live = tuning_key(mixtral_ep8(), "GPU \xff", 132, 4096);
  EXPECT_EQ(live.gpu, "GPU \xef\xbf\xbd");
  TuningTable t;
  t.add({live, 20, 21, 100.0});
  TuningTable loaded = io::parse_tuning_table(io::tuning_table_json(t));
  loaded.add({tuning_key(mixtral_ep8(), "GPU \xff", 132, 4096), 30, 31, 90.0});
  ASSERT_EQ(loaded.entries().size(), 1u);
  EXPECT_EQ(loaded.entries()[0].n_comm0, 30);
  ASSERT_NO_THROW(io::parse_tuning_table(io::tuning_table_json(loaded)));
  EXPECT_TRUE(loaded.nearest(live).has_value());
}

TEST(Tuning, ValidUtf8KeepsWellFormedTextAndReplacesEachBadSubpart) {
  EXPECT_EQ(valid_utf8("NVIDIA H200"), "NVIDIA H200");
  EXPECT_EQ(valid_utf8("\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");  // 2-4 bytes
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(valid_utf8("a\xff" "b"), "a" + r + "b");
  EXPECT_EQ(valid_utf8("\xc0\xaf"), r + r);                  // overlong '/'
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), r + r + r);         // a surrogate
  EXPECT_EQ(valid_utf8("\xf4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
  EXPECT_EQ(valid_utf8("\xe2\x82"), r);                      // cut short: one subpart
  EXPECT_EQ(valid_utf8("\xe2\x82" "A"), r + "A");
  EXPECT_EQ(valid_utf8("\xf0\x9f\x98" "x"), r + "x");
  EXPECT_EQ(valid_utf8(""), "");
  // As the table's writer replaces them: the same text as nlohmann's, for each of these (it
  // made one U+FFFD of "\xe2\x82" where valid_utf8 made two, so a key built from such a name
  // differed from the one read back).
  for (const std::string bad : {"H200\xe2\x82", "\xe2\x82" "A", "\xf0\x9f\x98" "x", "a\xff" "b", "\xc0\xaf",
                                "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf0\x9f", "\xe0\x80\x80", "x\x80\x80y",
                                "\xc3", "\xf1\x80\x80\xc3\xa9"}) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    EXPECT_EQ(io::json_text(nlohmann::json(bad)), io::json_text(nlohmann::json(valid_utf8(bad))));
  }
}

// Types and ranges are checked before a value is used, each refusal naming the file, the entry
// and the key: a "format" that is not a string, integers that an int would wrap (4294967320 was
// read as 24, 2^64 - 1 as -1), sizes that are not positive, and layouts that no run can have.
TEST(TuningJson, RefusesWrongTypesWrappedIntegersAndImpossibleEntries) {
  EXPECT_TRUE(throws_with<Error>([] { io::parse_tuning_table(R"({"format":5,"entries":[]})", "x.json"); },
                                 {"x.json", "\"format\" must be"}));
  const std::string text = io::tuning_table_json(table_with({{4096, 20, 21}}));
  EXPECT_TRUE(edit_is_refused(text, "\"n_comm0\": 20", "\"n_comm0\": 4294967320", {"\"n_comm0\" is 4294967320"}));
  EXPECT_TRUE(edit_is_refused(text, "\"tokens_per_rank\": 4096", "\"tokens_per_rank\": 18446744073709551615",
                              {"\"tokens_per_rank\" is 18446744073709551615"}));
  EXPECT_TRUE(edit_is_refused(text, "\"tokens_per_rank\": 4096", "\"tokens_per_rank\": 4096.0",
                              {"\"tokens_per_rank\" must be an integer"}));
  EXPECT_TRUE(edit_is_refused(text, "\"num_sms\": 132", "\"num_sms\": -5", {"\"num_sms\" is -5"}));
  // No SM left for the GEMM: no `comet tune` run writes that.
  EXPECT_TRUE(edit_is_refused(text, "\"n_comm0\": 20", "\"n_comm0\": 500", {"\"n_comm0\" is 500", "below \"num_sms\" 132"}));
  EXPECT_TRUE(edit_is_refused(text, "\"n_comm1\": 21", "\"n_comm1\": 132", {"\"n_comm1\" is 132"}));
  EXPECT_TRUE(edit_is_refused(text, "\"hidden\": 4096", "\"hidden\": 0", {"\"hidden\" is 0"}));
  EXPECT_TRUE(edit_is_refused(text, "\"hidden\": 4096", "\"hidden\": 2097152", {"\"hidden\" is 2097152"}));
  EXPECT_TRUE(edit_is_refused(text, "\"ep\": 8", "\"ep\": 0", {"\"ep\" is 0"}));
  EXPECT_TRUE(edit_is_refused(text, "\"world\": 8", "\"world\": 3", {"\"world\" is 3", "8 x 1"}));
  EXPECT_TRUE(edit_is_refused(text, "\"topk\": 2", "\"topk\": 9", {"\"topk\" is 9"}));
  // W = EP x TP, but EP 3 does not divide 8 experts, TP 3 does not divide F 14336.
  const auto with_world = [&](int world) {
    std::string edited = text;
    edited.replace(edited.find("\"world\": 8"), std::string("\"world\": 8").size(),
                   "\"world\": " + std::to_string(world));
    return edited;
  };
  EXPECT_TRUE(edit_is_refused(with_world(3), "\"ep\": 8", "\"ep\": 3", {"\"experts\" 8", "\"ep\" 3"}));
  EXPECT_TRUE(edit_is_refused(with_world(24), "\"tp\": 1", "\"tp\": 3", {"\"ffn\" 14336", "\"tp\" 3"}));
}

// A table that cannot be written completely is reported, and the old file stays whole (the
// stream was checked before its buffer reached the disk, after truncating the old table).
TEST(TuningJson, SaveReportsAFailedWriteAndKeepsTheOldTable) {
  const std::string path = ::testing::TempDir() + "comet_tuning_save_" + std::to_string(::getpid()) + ".json";
  io::save_tuning_table(table_with({{1024, 10, 11}}), path);
  const TuningTable bigger = table_with({{1024, 10, 11}, {4096, 20, 21}, {16384, 30, 31}});
  {
    const FileSizeLimit limit(64);  // far less than one entry
    EXPECT_TRUE(throws_with<Error>([&] { io::save_tuning_table(bigger, path); }, {path, "write failed"}));
  }
  EXPECT_EQ(io::load_tuning_table(path).entries().size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  io::save_tuning_table(bigger, path);
  EXPECT_EQ(io::load_tuning_table(path).entries().size(), 3u);
  std::filesystem::remove(path);
  // A directory where the table should go cannot be replaced: refused, nothing left behind.
  const std::string dir = path + ".d";
  std::filesystem::create_directory(dir);
  EXPECT_TRUE(throws_with<Error>([&] { io::save_tuning_table(bigger, dir); }, {dir, "cannot replace"}));
  EXPECT_FALSE(std::filesystem::exists(dir + ".tmp"));
  std::filesystem::remove(dir);
}

// "gpus" is written and read back; a table without it (written before it existed) means one
// GPU; a count that does not divide the entry's world is refused, naming the entry.
TEST(TuningJson, GpusFieldRoundTripsDefaultsToOneAndIsChecked) {
  TuningTable t;
  t.add({tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096, 8), 32, 2, 50.0});
  const std::string text = io::tuning_table_json(t);
  EXPECT_NE(text.find("\"gpus\": 8"), std::string::npos) << text;
  const TuningTable back = io::parse_tuning_table(text);
  ASSERT_EQ(back.entries().size(), 1u);
  EXPECT_EQ(back.entries()[0].key.gpus, 8);

  std::string old = text;
  old.erase(old.find("\"gpus\": 8,"), std::string("\"gpus\": 8,").size());
  const TuningTable old_back = io::parse_tuning_table(old);
  ASSERT_EQ(old_back.entries().size(), 1u);
  EXPECT_EQ(old_back.entries()[0].key.gpus, 1);

  EXPECT_TRUE(edit_is_refused(text, "\"gpus\": 8", "\"gpus\": 3", {"gpus", "3"}));
  EXPECT_TRUE(edit_is_refused(text, "\"gpus\": 8", "\"gpus\": 0", {"gpus", "0"}));
  std::string two = text;  // four ranks per GPU (the Local fabric on two GPUs)
  two.replace(two.find("\"gpus\": 8"), std::string("\"gpus\": 8").size(), "\"gpus\": 2");
  EXPECT_EQ(io::parse_tuning_table(two).entries().at(0).key.gpus, 2);
}

TEST(Tuning, SummaryKeepsEachWorkloadsFastestPairAndTheBestFixedPair) {
  const TuningKey small = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024);
  const TuningKey large = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 8192);
  // (8, 2) wins the small workload, (16, 2) the large one; summed, (16, 2) is the best fixed pair.
  const std::vector<TuneSample> samples = {
      {small, 8, 2, 100.0}, {small, 16, 2, 105.0}, {small, 4, 2, 130.0},
      {large, 8, 2, 820.0}, {large, 16, 2, 790.0}, {large, 4, 2, 900.0},
      {large, 2, 2, 10.0},  // measured on one workload only: never the fixed pair
  };
  const TuneSummary s = summarize_tuning(samples);
  ASSERT_EQ(s.table.entries().size(), 2u);
  const auto m_small = s.table.nearest(small), m_large = s.table.nearest(large);
  ASSERT_TRUE(m_small && m_large);
  EXPECT_EQ(m_small->entry->n_comm0, 8);
  EXPECT_EQ(m_large->entry->n_comm0, 2);  // the fastest sample of that workload
  EXPECT_EQ(s.fixed_n_comm0, 16);
  EXPECT_EQ(s.fixed_n_comm1, 2);
  EXPECT_DOUBLE_EQ(s.fixed_total_us, 105.0 + 790.0);
  EXPECT_DOUBLE_EQ(s.tuned_total_us, 100.0 + 10.0);
}

// The path: fused only where the nearest entry measured both forwards and fused was faster;
// unfused for a slower or equal fused forward, an entry without the unfused time, an entry too
// far in tokens, another workload class, and no table. The source names the deciding entry.
TEST(Tuning, PathIsFusedOnlyWhereTheNearestEntryMeasuredItFaster) {
  TuningTable t;
  auto key = [](int tokens) { return tuning_key(mixtral_ep8(), "NVIDIA H200", 132, tokens); };
  t.add({key(1024), 32, 2, 900.0, 950.0});    // fused faster
  t.add({key(4096), 32, 2, 3000.0, 2900.0});  // unfused faster
  t.add({key(16384), 64, 2, 1000.0, 0.0});    // unfused not measured
  t.add({key(65536), 64, 2, 5000.0, 5000.0});  // equal: the unfused pipeline stays
  const PathChoice fast = choose_path(&t, key(1500));
  EXPECT_TRUE(fast.fused);
  EXPECT_EQ(fast.source.rfind("fused: tuning table entry", 0), 0u) << fast.source;  // starts with it
  EXPECT_NE(fast.source.find("entry for 1024 tokens/rank"), std::string::npos) << fast.source;
  EXPECT_NE(fast.source.find("unfused 950"), std::string::npos) << fast.source;
  const PathChoice slower = choose_path(&t, key(4096));
  EXPECT_FALSE(slower.fused);
  EXPECT_EQ(slower.source.rfind("unfused: tuning table entry", 0), 0u) << slower.source;
  const PathChoice unmeasured = choose_path(&t, key(16384));
  EXPECT_FALSE(unmeasured.fused);
  EXPECT_NE(unmeasured.source.find("not measured"), std::string::npos) << unmeasured.source;
  EXPECT_FALSE(choose_path(&t, key(65536)).fused);
  const PathChoice far = choose_path(&t, key(256));  // 1024 is a factor of 4 away
  EXPECT_FALSE(far.fused);
  EXPECT_NE(far.source.find("no tuning entry"), std::string::npos) << far.source;
  EXPECT_FALSE(choose_path(&t, tuning_key(mixtral_ep8(), "NVIDIA H100", 132, 1024)).fused);
  EXPECT_FALSE(choose_path(nullptr, key(1024)).fused);
}

// unfused_us round-trips; a table without it reads as not measured (never fused); a negative or
// non-numeric time is refused, naming the entry and the key.
TEST(TuningJson, UnfusedTimeRoundTripsAndIsOptional) {
  TuningTable t;
  t.add({tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096), 32, 2, 900.0, 950.5});
  const std::string text = io::tuning_table_json(t);
  const TuningTable back = io::parse_tuning_table(text);
  ASSERT_EQ(back.entries().size(), 1u);
  EXPECT_DOUBLE_EQ(back.entries()[0].unfused_us, 950.5);
  EXPECT_TRUE(back.entries()[0].fused_faster());
  std::string old = text;
  const std::string field = ",\n      \"unfused_us\": 950.5";
  ASSERT_NE(old.find(field), std::string::npos) << text;
  old.erase(old.find(field), field.size());
  const TuningTable old_back = io::parse_tuning_table(old);
  EXPECT_DOUBLE_EQ(old_back.entries()[0].unfused_us, 0.0);
  EXPECT_FALSE(old_back.entries()[0].fused_faster());
  EXPECT_TRUE(edit_is_refused(text, "950.5", "-1.0", {"unfused_us"}));
  EXPECT_TRUE(edit_is_refused(text, "950.5", "\"950\"", {"unfused_us"}));
}

// Each entry's unfused time is the one measured in its winning row (the same timing loop as the
// fused time it is compared with), not another row's; 0 when that row has none.
TEST(Tuning, SummaryRecordsTheWinningRowsUnfusedTime) {
  const TuningKey a = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024);
  const TuningKey b = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096);
  const TuneSummary s = summarize_tuning({{a, 8, 2, 100.0, 120.0}, {a, 16, 2, 101.0, 90.0}, {a, 32, 2, 102.0, 200.0},
                                          {b, 8, 2, 400.0, 0.0}, {b, 16, 2, 410.0, 0.0}, {b, 32, 2, 420.0, 0.0}});
  const auto ma = s.table.nearest(a), mb = s.table.nearest(b);
  ASSERT_TRUE(ma && mb);
  EXPECT_DOUBLE_EQ(ma->entry->unfused_us, 120.0);  // the 100 us row's, not the 90 or 200 of the others
  EXPECT_TRUE(ma->entry->fused_faster());
  EXPECT_DOUBLE_EQ(mb->entry->unfused_us, 0.0);
  // The path totals count only workloads with an unfused time (a): fused 100 against 120.
  EXPECT_EQ(s.path_workloads, 1);
  EXPECT_DOUBLE_EQ(s.path_total_us, 100.0);
  EXPECT_DOUBLE_EQ(s.unfused_total_us, 120.0);
  EXPECT_DOUBLE_EQ(s.fused_total_us, 100.0);
}

TEST(Tuning, SummaryRefusesNoSamplesAndPairsNeverMeasuredEverywhere) {
  EXPECT_THROW(summarize_tuning({}), Error);
  const TuningKey a = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024);
  const TuningKey b = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096);
  EXPECT_THROW(summarize_tuning({{a, 8, 2, 1.0}, {b, 16, 2, 1.0}}), Error);
}

// The layer0 mode round-trips by name; a table written before it existed reads as
// communication blocks in ring order; an unknown name is refused, naming the entry and the key.
TEST(TuningJson, Layer0ModeRoundTripsDefaultsAndIsChecked) {
  TuningTable t;
  TuningEntry e{tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096), 32, 2, 900.0, 950.5};
  e.layer0 = {Layer0Copies::kGemmBlocks, DispatchOrder::kRows};
  t.add(e);
  const std::string text = io::tuning_table_json(t);
  EXPECT_NE(text.find("\"layer0_copies\": \"gemm\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"dispatch_order\": \"rows\""), std::string::npos) << text;
  EXPECT_EQ(io::parse_tuning_table(text).entries()[0].layer0, e.layer0);
  std::string old = text;
  for (const std::string field : {"\n      \"dispatch_order\": \"rows\",", ",\n      \"layer0_copies\": \"gemm\""}) {
    ASSERT_NE(old.find(field), std::string::npos) << old;
    old.erase(old.find(field), field.size());
  }
  EXPECT_EQ(io::parse_tuning_table(old).entries()[0].layer0, Layer0Mode{});
  EXPECT_TRUE(edit_is_refused(text, "\"gemm\"", "\"warp\"", {"layer0_copies"}));
  EXPECT_TRUE(edit_is_refused(text, "\"rows\"", "7", {"dispatch_order"}));
}

// The entry takes its winning sample's layer0 mode; the best fixed candidate is a mode as well
// as an n_comm pair.
TEST(Tuning, SummaryKeepsTheWinningLayer0Mode) {
  const TuningKey a = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024);
  const TuningKey b = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096);
  const Layer0Mode blocks_ring{}, gemm_rows{Layer0Copies::kGemmBlocks, DispatchOrder::kRows};
  const TuneSummary s = summarize_tuning({{a, 32, 2, 100.0, 0.0, blocks_ring},
                                          {a, 32, 2, 90.0, 0.0, gemm_rows},
                                          {b, 32, 2, 400.0, 0.0, blocks_ring},
                                          {b, 32, 2, 410.0, 0.0, gemm_rows}});
  const auto ma = s.table.nearest(a), mb = s.table.nearest(b);
  ASSERT_TRUE(ma && mb);
  EXPECT_EQ(ma->entry->layer0, gemm_rows);
  EXPECT_DOUBLE_EQ(ma->entry->latency_us, 90.0);
  EXPECT_EQ(mb->entry->layer0, blocks_ring);
  EXPECT_EQ(s.fixed_layer0, blocks_ring);  // 500 us summed against 500 us: the first candidate in order
  EXPECT_DOUBLE_EQ(s.tuned_total_us, 490.0);
}

TEST(Tuning, Layer0ModeFromTheNearestEntryElseCommBlocksInRingOrder) {
  TuningTable t;
  TuningEntry e{tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096), 32, 2, 900.0, 950.5};
  e.layer0 = {Layer0Copies::kGemmBlocks, DispatchOrder::kRows};
  t.add(e);
  const Layer0ModeChoice near = choose_layer0_mode(&t, tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 6000));
  EXPECT_EQ(near.mode, e.layer0);
  EXPECT_EQ(near.source.rfind("gemm/rows: tuning table entry for 4096", 0), 0u) << near.source;
  const Layer0ModeChoice far = choose_layer0_mode(&t, tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024));
  EXPECT_EQ(far.mode, Layer0Mode{});
  EXPECT_EQ(far.source.rfind("blocks/ring: no tuning entry", 0), 0u) << far.source;
  EXPECT_EQ(choose_layer0_mode(nullptr, e.key).mode, Layer0Mode{});
  EXPECT_EQ(parse_layer0_copies("gemm"), Layer0Copies::kGemmBlocks);
  EXPECT_EQ(parse_dispatch_order("rows"), DispatchOrder::kRows);
  EXPECT_FALSE(parse_layer0_copies("warp").has_value());
  EXPECT_FALSE(parse_dispatch_order("").has_value());
}

// The layer1 combine round-trips by name; a table written before it existed reads as
// communication blocks; an unknown name is refused, naming the entry and the key.
TEST(TuningJson, Layer1CombineRoundTripsDefaultsAndIsChecked) {
  TuningTable t;
  TuningEntry e{tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096), 32, 2, 900.0, 950.5};
  e.layer1_combine = Layer1Combine::kGemmBlocks;
  t.add(e);
  const std::string text = io::tuning_table_json(t);
  const std::string field = ",\n      \"layer1_combine\": \"gemm\"";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  EXPECT_EQ(io::parse_tuning_table(text).entries()[0].layer1_combine, Layer1Combine::kGemmBlocks);
  std::string old = text;
  old.erase(old.find(field), field.size());
  EXPECT_EQ(io::parse_tuning_table(old).entries()[0].layer1_combine, Layer1Combine::kCommBlocks);
  EXPECT_TRUE(edit_is_refused(text, "\"layer1_combine\": \"gemm\"", "\"layer1_combine\": \"warps\"",
                              {"layer1_combine", "\"blocks\" or \"gemm\""}));
}

// The entry takes its winning sample's layer1 combine; the best fixed candidate includes one.
TEST(Tuning, SummaryKeepsTheWinningLayer1Combine) {
  const TuningKey a = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024);
  const TuningKey b = tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096);
  const Layer0Mode mode{};
  const TuneSummary s = summarize_tuning({{a, 32, 2, 100.0, 120.0, mode, Layer1Combine::kCommBlocks},
                                          {a, 32, 2, 95.0, 121.0, mode, Layer1Combine::kGemmBlocks},
                                          {b, 32, 2, 400.0, 420.0, mode, Layer1Combine::kCommBlocks},
                                          {b, 32, 2, 390.0, 415.0, mode, Layer1Combine::kGemmBlocks}});
  const auto ma = s.table.nearest(a), mb = s.table.nearest(b);
  ASSERT_TRUE(ma && mb);
  EXPECT_EQ(ma->entry->layer1_combine, Layer1Combine::kGemmBlocks);
  EXPECT_DOUBLE_EQ(ma->entry->unfused_us, 121.0);  // the winning row's own unfused time
  EXPECT_EQ(mb->entry->layer1_combine, Layer1Combine::kGemmBlocks);
  EXPECT_EQ(s.fixed_layer1_combine, Layer1Combine::kGemmBlocks);
  EXPECT_DOUBLE_EQ(s.fixed_total_us, 485.0);
}

TEST(Tuning, Layer1CombineFromTheNearestEntryElseCommBlocks) {
  TuningTable t;
  TuningEntry e{tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 4096), 32, 2, 900.0, 950.5};
  e.layer1_combine = Layer1Combine::kGemmBlocks;
  t.add(e);
  const Layer1CombineChoice near = choose_layer1_combine(&t, tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 6000));
  EXPECT_EQ(near.combine, Layer1Combine::kGemmBlocks);
  EXPECT_EQ(near.source.rfind("gemm: tuning table entry for 4096", 0), 0u) << near.source;
  const Layer1CombineChoice far = choose_layer1_combine(&t, tuning_key(mixtral_ep8(), "NVIDIA H200", 132, 1024));
  EXPECT_EQ(far.combine, Layer1Combine::kCommBlocks);
  EXPECT_EQ(far.source.rfind("blocks: no tuning entry", 0), 0u) << far.source;
  EXPECT_EQ(choose_layer1_combine(nullptr, e.key).combine, Layer1Combine::kCommBlocks);
  EXPECT_EQ(parse_layer1_combine("gemm"), Layer1Combine::kGemmBlocks);
  EXPECT_EQ(parse_layer1_combine("blocks"), Layer1Combine::kCommBlocks);
  EXPECT_FALSE(parse_layer1_combine("GEMM").has_value());
  EXPECT_STREQ(layer1_combine_name(Layer1Combine::kGemmBlocks), "gemm");
}

}  // namespace
}  // namespace comet
