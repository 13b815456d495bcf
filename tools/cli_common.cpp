// tools/cli_common.cpp: workload options shared by `comet run` and `comet plan`, and their
// validation into a LayerConfig with messages that name the option at fault.
//
//   comet run --model mixtral-8x7b --ep 3     ->  comet: error: --ep 3 does not divide the 8
//                                                 experts of mixtral-8x7b ...   (exit 2)
//
// The checks here come before LayerConfig::validate() only to phrase the common mistakes in
// terms of the options a user typed (and to suggest values that work); validate() still runs
// afterwards and has the last word.
#include "cli_common.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <system_error>

#include "comet/error.h"
#include "core/process_env.h"
#include "core/replace_file.h"
#include "io/trace_writers.h"
#include "io/tuning_json.h"

namespace comet::tools {
namespace {

constexpr const char* kActivations[] = {"swiglu", "gelu", "relu", "silu"};
constexpr const char* kDTypes[] = {"bf16", "f16", "f32"};

// `text` without the spaces and tabs around it ("" when it has nothing else).
std::string trim_blanks(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t"), end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? std::string() : text.substr(begin, end - begin + 1);
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out.append(sep);
    out.append(items[i]);
  }
  return out;
}

// Parses "4096" or "64,0,32,16"; every entry a non-negative integer.
std::vector<int> parse_tokens(const std::string& text) {
  std::vector<int> values;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim_blanks(item);  // "64, 32", as for the integer options
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0)
      throw UsageError("--tokens: \"" + item +
                       "\" is not a token count (a non-negative integer, or a comma list with one "
                       "per rank)");
    // The full-size plan of the lower bound keeps about 1 KB per token and rank in memory.
    if (v > kMaxTokensPerRank)
      throw UsageError("--tokens: " + item + " is more than the " + std::to_string(kMaxTokensPerRank) +
                       " tokens per rank this tool plans for");
    values.push_back(int(v));
  }
  if (values.empty() || text.back() == ',')
    throw UsageError("--tokens: \"" + text + "\" is empty or ends with a comma");
  return values;
}

std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string user_message(const std::string& what) {
  std::string msg = what;
  const size_t cut = msg.find(" (check `");
  if (cut != std::string::npos) msg.resize(cut);
  return one_line(msg);
}

CLI::Validator number_range(double min, double max) {
  const std::string range = fmt_double(min) + " to " + fmt_double(max);
  return CLI::Validator(
      [min, max, range](std::string& input) {
        char* end = nullptr;
        const double v = std::strtod(input.c_str(), &end);
        if (input.empty() || *end != '\0' || !(v >= min && v <= max))
          return "Value " + input + " not in range " + range;
        return std::string();
      },
      "NUMBER in [" + range + "]");
}

CLI::Validator non_empty(const std::string& what, const std::string& type_name) {
  return CLI::Validator(
      [what](std::string& input) { return input.empty() ? "an empty value is not " + what : std::string(); },
      type_name);
}

CLI::Validator file_path() { return non_empty("a file path", "FILE"); }

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& input) {
        // Checked here, strictly: CLI11 reads "" as 0, clamps a value past 2^64 - 1 to it and
        // reads "-1" as 2^64 - 1.
        if (input.empty()) return std::string("an empty value is not a non-negative integer");
        const size_t first = input.find_first_not_of(" \t");
        if (first != std::string::npos && input[first] == '-') return "Value " + input + " is negative";
        const size_t start = first == std::string::npos ? 0 : first;  // strtoull skips the same spaces
        const size_t digits = input[start] == '+' ? start + 1 : start;
        if (digits >= input.size() || std::isdigit(static_cast<unsigned char>(input[digits])) == 0)
          return "Value " + input + " is not a non-negative integer";
        char* end = nullptr;
        errno = 0;
        std::strtoull(input.c_str(), &end, 10);
        if (*end != '\0') return "Value " + input + " is not a non-negative integer";
        if (errno == ERANGE)
          return "Value " + input + " is more than " + std::to_string(std::numeric_limits<uint64_t>::max());
        return std::string();
      },
      "");  // the option's type already reads UINT in the help
}

void read_integers_as_decimal(CLI::App& app) {
  const CLI::Validator decimal(
      [](std::string& input) {
        // Spaces around a value are dropped ("--n-comm0 '32, 64'"), as the --tokens parser does
        // around each entry.
        input = trim_blanks(input);
        // CLI11 reads an empty value as 0 ("--ep ''" was refused as "at least 1, not 0").
        if (input.empty()) return std::string("an empty value is not a decimal integer");
        // Leading zeros after an optional sign are dropped ("-007" -> "-7", "000" -> "0").
        const size_t digits = (!input.empty() && (input[0] == '-' || input[0] == '+')) ? 1 : 0;
        // Digits only ("--ep 8.0" and "--ep 8x" were CLI11's "Could not convert").
        if (digits == input.size() ||
            !std::all_of(input.begin() + digits, input.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; }))
          return "Value " + input + " is not a decimal integer";
        size_t zeros = digits;
        while (zeros + 1 < input.size() && input[zeros] == '0') ++zeros;
        if (zeros == digits) return std::string();
        if (std::isdigit(static_cast<unsigned char>(input[zeros])) == 0)
          return "Value " + input + " is not a decimal integer";
        input.erase(digits, zeros - digits);
        return std::string();
      },
      "");
  // CLI11 reads an empty value of a number option as 0 ("--mask-fraction ''" ran unmasked).
  const CLI::Validator not_empty(
      [](std::string& input) {
        // Spaces around the value are dropped, as around an integer ("--warmup-ms '5 '" read
        // as out of range, "--mask-fraction '0.5 '" as not a number).
        input = trim_blanks(input);
        if (input.empty()) return std::string("an empty value is not a number");
        // Decimal, as the integers are: strtod would read "0x10" as 16 and "0x1p-1" as 0.5.
        if (input.find_first_of("xX") != std::string::npos) return "Value " + input + " is not a decimal number";
        // Past a double's range ("1e400", "1e-400") it would silently become inf or 0.
        errno = 0;
        char* end = nullptr;
        const double value = std::strtod(input.c_str(), &end);
        // (A subnormal such as 1e-310 also sets ERANGE, but is kept: it is not 0.)
        if (errno == ERANGE && end != input.c_str() && (value == 0.0 || std::isinf(value)))
          return "Value " + input + " is out of the range of a double";
        return std::string();
      },
      "");
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) option->transform(decimal);
    else if (type.rfind("FLOAT", 0) == 0) option->transform(not_empty);
  }
  for (CLI::App* sub : app.get_subcommands({})) read_integers_as_decimal(*sub);
}

void refuse_empty_list_items(const CLI::App& app, int argc, const char* const* argv) {
  // The subcommand the words name (`bench layer`): only its own list options are checked, so a
  // word that is another command's option, or a launched program's argument, is left alone.
  const CLI::App* command = &app;
  int first = 1;
  for (bool descended = true; descended && first < argc;) {
    descended = false;
    for (const CLI::App* sub : command->get_subcommands({}))
      if (sub->check_name(argv[first])) {
        command = sub;
        ++first;
        descended = true;
        break;
      }
  }
  std::vector<std::string> names;
  for (const CLI::Option* option : command->get_options())
    if (option->get_delimiter() == ',')
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (std::find(names.begin(), names.end(), name) == names.end()) continue;
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      continue;  // no value: CLI11 names that
    }
    if (value.empty()) continue;  // the option's own check refuses an empty value
    if (value.front() == ',' || value.back() == ',' || value.find(",,") != std::string::npos)
      throw UsageError(name + ": \"" + value + "\" has an empty item (a comma list, one value between commas)");
  }
}

void add_fabric_option(CLI::App& app, std::string& fabric) {
  app.add_option("--fabric", fabric,
                 "loopback (W virtual ranks on one GPU), local (the ranks over the visible GPUs) or nccl (one "
                 "process per rank, under `comet launch`; rank 0 prints)")
      ->check(CLI::IsMember({"loopback", "local", "nccl"}))
      ->capture_default_str();
}

bool quiet_rank(const std::string& fabric) {
  if (fabric != "nccl") return false;
  try {
    const std::optional<ProcessEnv> env = read_process_env();
    return env && env->rank != 0;
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    // A malformed RANK or WORLD_SIZE is the caller's input, as `comet run` reports it.
    throw UsageError("the launch environment: " + user_message(e.what()));
  }
}

void add_layer0_mode_options(CLI::App& app, std::vector<std::string>& copies, std::vector<std::string>& orders) {
  app.add_option("--copies0", copies,
                 "who moves the fused layer0's rows, comma separated list swept: auto (the tuning table's, else "
                 "blocks), blocks (n_comm0 communication blocks) or gemm (a warp of every GEMM block, bulk "
                 "asynchronous copies; docs/gpu_layer.md)")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "blocks", "gemm"}));
  app.add_option("--order0", orders,
                 "order of the fused layer0's dispatch (the unfused one is always ring), comma separated list swept: auto (the tuning table's, else ring), "
                 "ring (by received token, own rows first) or rows (by A row, GEMM0's order; docs/gpu_layer.md)")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "ring", "rows"}));
}

void add_layer1_combine_option(CLI::App& app, std::vector<std::string>& combine) {
  app.add_option("--combine1", combine,
                 "who runs layer1's combine (fused and unfused forwards; docs/gpu_layer.md), comma separated list "
                 "swept: auto (the tuning table's, else blocks), blocks (n_comm1 communication blocks beside the "
                 "cooperative GEMM1) or gemm (the producer warps of every GEMM block, beside a ping-pong GEMM1 on "
                 "128-column blocks; n_comm1 unused)")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "blocks", "gemm"}));
}

std::vector<std::optional<Layer1Combine>> layer1_combine_list(const std::vector<std::string>& names) {
  std::vector<std::optional<Layer1Combine>> out;
  for (const std::string& n : names) out.push_back(n == "auto" ? std::nullopt : parse_layer1_combine(n));
  return out;
}

std::vector<std::optional<Layer0Copies>> layer0_copies_list(const std::vector<std::string>& names) {
  std::vector<std::optional<Layer0Copies>> out;
  for (const std::string& n : names) out.push_back(n == "auto" ? std::nullopt : parse_layer0_copies(n));
  return out;
}

std::vector<std::optional<DispatchOrder>> dispatch_orders_list(const std::vector<std::string>& names) {
  std::vector<std::optional<DispatchOrder>> out;
  for (const std::string& n : names) out.push_back(n == "auto" ? std::nullopt : parse_dispatch_order(n));
  return out;
}

void check_comm_blocks(const std::vector<int>& n_comm0, const std::vector<int>& n_comm1, int num_sms,
                       const std::string& gpu) {
  for (const auto& [option, values] : {std::pair{"--n-comm0", &n_comm0}, {"--n-comm1", &n_comm1}})
    for (int n : *values)
      if (n >= num_sms)
        throw UsageError(std::string(option) + " " + std::to_string(n) + ": the fused kernels need an SM for the GEMM, so " +
                         "n_comm must be below the " + std::to_string(num_sms) + " SMs of this " + gpu + " (at most " +
                         std::to_string(num_sms - 1) + ")");
}

void check_output_path(const std::string& path, const std::string& option) {
  if (path.empty()) return;
  // Not found is what a file yet to be written is; any other error of the look-up (a name too
  // long, a loop of symbolic links, a directory that may not be searched) is one the write would
  // meet after the run, so it is refused now, by name. The throwing overloads would end the
  // command as an unexpected failure instead.
  const auto look_up = [&](const std::filesystem::path& p, const std::string& what) {
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(p, error);
    if (error && status.type() != std::filesystem::file_type::not_found)
      throw UsageError(option + ": " + what + "\"" + p.string() + "\": " + error.message());
    return status;
  };
  // A directory cannot be opened as a file: refused now rather than when the run writes. A FIFO
  // would hold the write (and the command) until something reads it, a socket cannot be opened.
  const std::filesystem::file_status status = look_up(path, "");
  if (std::filesystem::is_directory(status))
    throw UsageError(option + ": \"" + path + "\" is a directory, not a file");
  if (std::filesystem::is_fifo(status) || std::filesystem::is_socket(status))
    throw UsageError(option + ": \"" + path + "\" is a " + (std::filesystem::is_fifo(status) ? "FIFO" : "socket") +
                     ", not a file");
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(look_up(dir, "directory ")))
    throw UsageError(option + ": directory \"" + dir.string() + "\" does not exist");
}

void check_replaceable_output(const std::string& path, const std::string& option) {
  if (!replaced_by_rename(path)) return;  // a device: replace_file writes it in place
  const std::string tmp = path + ".tmp";
  // A file already there (a writer that was killed left it) is the writer's to replace, not
  // this check's to remove.
  std::error_code error;
  // A temporary that is a FIFO, socket or device (opening a FIFO for writing waits for a
  // reader) is refused, as the output path itself is.
  if (!replaced_by_rename(tmp))
    throw UsageError(option + ": \"" + tmp + "\", which is written first and renamed over \"" + path +
                     "\", is not a regular file; remove it");
  const bool existed = std::filesystem::exists(std::filesystem::symlink_status(tmp, error));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    const std::string why = std::error_code(errno, std::generic_category()).message();
    throw UsageError(option + ": cannot create \"" + tmp + "\" (" + why + "), which is written first and renamed over \"" +
                     path + "\"");
  }
  ::close(fd);
  if (!existed) std::filesystem::remove(tmp, error);
}

TuningTable load_tuning_option(const std::string& path, const std::string& option) {
  try {
    return io::load_tuning_table(path);
  } catch (const Error& e) {
    throw UsageError(option + ": " + user_message(e.what()));
  }
}

void check_trace_path(const std::string& path, const std::string& written) {
  if (path.empty()) return;
  if (path.ends_with(".svg"))
    throw UsageError("--trace: \"" + path + "\" ends in .svg; give the JSON path, FILE.json (the picture is written " +
                     "beside it as FILE.svg)");
  const std::string& json = written.empty() ? path : written;
  // Both files are written beside themselves and renamed over (io::write_trace_files): a
  // temporary file that cannot be created is refused now, not after the traced run.
  for (const std::string& file : {json, io::trace_svg_path(json)}) {
    check_output_path(file, "--trace");
    check_replaceable_output(file, "--trace");
  }
}

bool same_file(const std::string& a, const std::string& b) {
  // Absolute first: weakly_canonical leaves a relative path whose first part does not exist
  // relative ("t.json"), and resolves "./t.json" to an absolute one.
  const auto resolve = [](const std::string& path) {
    std::error_code error;
    const std::filesystem::path absolute = std::filesystem::absolute(path, error);
    if (error) return std::filesystem::path(path).lexically_normal();
    const std::filesystem::path canonical = std::filesystem::weakly_canonical(absolute, error);
    return error ? absolute.lexically_normal() : canonical;
  };
  return resolve(a) == resolve(b);
}

std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "; ";
    } else if (c != '\r') {
      out += c;
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

std::string divisors_text(int n) {
  std::vector<std::string> ds;
  // Only divisors that are valid rank counts (and d cannot overflow at n = INT_MAX).
  for (int d = 1; d <= std::min(n, kMaxRanks) && ds.size() < 12; ++d)
    if (n % d == 0) ds.push_back(std::to_string(d));
  return join(ds);
}

void add_workload_options(CLI::App& app, WorkloadOptions& o, const TileConfig& default_tiles) {
  std::string presets = join(ModelPresets::names());
  o.model_opt = app.add_option("--model", o.model, "model preset: " + presets)
                    ->capture_default_str()
                    ->group("Model");
  o.shape_opts = {
      app.add_option("--hidden", o.hidden, "custom shape: hidden size H")->group("Model"),
      app.add_option("--ffn", o.ffn, "custom shape: expert intermediate size F")->group("Model"),
      app.add_option("--experts", o.experts,
                     "custom shape: number of experts E (all routed: overrides a preset's padding experts)")
          ->group("Model"),
      app.add_option("--topk", o.topk, "custom shape: experts per token")->group("Model"),
      app.add_option("--activation", o.activation,
                     "custom shape: swiglu (gated), gelu, relu or silu")
          ->capture_default_str()
          ->group("Model"),
  };
  app.add_option("--tokens", o.tokens,
                 "tokens per rank: one count for every rank, or W comma-separated counts")
      ->capture_default_str()
      ->group("Workload");
  app.add_option("--ep", o.ep, "expert-parallel degree")->capture_default_str()->group("Workload");
  app.add_option("--tp", o.tp, "tensor-parallel degree (world W = ep * tp)")
      ->capture_default_str()
      ->group("Workload");
  app.add_option("--routing", o.routing, "uniform, zipf:S (exponent S) or imbalance:STD")
      ->capture_default_str()
      ->group("Workload");
  app.add_option("--mask-fraction", o.mask_fraction, "fraction of routing slots masked (-1)")
      ->capture_default_str()
      ->group("Workload");
  app.add_option("--dtype", o.dtype, "storage type: bf16, f16 or f32")
      ->capture_default_str()
      ->group("Workload");
  app.add_option("--seed", o.seed, "seed of weights, tokens and routing")->check(non_negative_integer())
      ->capture_default_str()
      ->group("Workload");
  o.tile_opts = {
      app.add_option("--block-m", o.block_m,
                     "tile rows, both layers (default " + std::to_string(default_tiles.block_m) + ")")
          ->group("Tiles"),
      app.add_option("--block-n0", o.block_n0,
                     "layer0 tile columns of F/TP (default " + std::to_string(default_tiles.block_n0) + ")")
          ->group("Tiles"),
      app.add_option("--block-n1", o.block_n1,
                     "layer1 tile columns of H = one combine signal (default " +
                         std::to_string(default_tiles.block_n1) + ")")
          ->group("Tiles"),
  };
}

namespace {

Workload build_workload_checked(const WorkloadOptions& o, const TileConfig& default_tiles) {
  Workload w;
  LayerConfig& c = w.config;

  // Model: a preset, a preset with some fields overridden, or a fully custom shape.
  // The four sizes make a custom shape; --activation alone changes the (default) preset's.
  const auto given = [&](size_t i) { return o.shape_opts[i]->count() > 0; };  // shape_opts' order
  const bool any_size = given(0) || given(1) || given(2) || given(3);
  const bool any_shape = any_size || given(4);
  const bool preset_given = o.model_opt->count() > 0;
  if (preset_given || !any_size) {
    const auto names = ModelPresets::names();
    if (std::find(names.begin(), names.end(), o.model) == names.end())
      throw UsageError("--model: unknown preset \"" + o.model + "\" (presets: " + join(names) + ")");
    c.model = ModelPresets::get(o.model);
  } else {
    const char* kNames[] = {"--hidden", "--ffn", "--experts", "--topk"};
    const char* missing = nullptr;
    for (int i = 3; i >= 0; --i)
      if (o.shape_opts[size_t(i)]->count() == 0) missing = kNames[i];
    if (missing)
      throw UsageError(std::string("a custom shape needs --hidden, --ffn, --experts and --topk "
                                   "(or start from a preset with --model); missing ") +
                       missing);
    c.model = ModelShape{};
  }
  if (any_shape) {
    c.model.name = preset_given || !any_size ? c.model.name + "+custom" : "custom";
    if (o.shape_opts[0]->count()) c.model.hidden = o.hidden;
    if (o.shape_opts[1]->count()) c.model.ffn = o.ffn;
    // A preset's padding experts (qwen2-moe: 4 of 64) only round its E up to a divisor of EP;
    // kept with another E they would leave fewer experts routed than asked for (--experts 8: 4),
    // or name padding the user cannot set in an error. A given E is routed in full.
    if (o.shape_opts[2]->count()) {
      c.model.num_experts = o.experts;
      c.model.padding_experts = 0;
    }
    if (o.shape_opts[3]->count()) c.model.topk = o.topk;
    if (o.shape_opts[4]->count()) {
      if (std::find(std::begin(kActivations), std::end(kActivations), o.activation) ==
          std::end(kActivations))
        throw UsageError("--activation must be swiglu, gelu, relu or silu, not \"" +
                         o.activation + "\"");
      c.model.activation = parse_activation(o.activation);
    }
  }
  const ModelShape& m = c.model;
  if (m.hidden <= 0) throw UsageError("--hidden must be positive, not " + std::to_string(m.hidden));
  if (m.ffn <= 0) throw UsageError("--ffn must be positive, not " + std::to_string(m.ffn));
  if (m.num_experts <= 0)
    throw UsageError("--experts must be positive, not " + std::to_string(m.num_experts));
  if (m.topk <= 0 || m.topk > m.routed_experts())
    throw UsageError("--topk " + std::to_string(m.topk) + " must be between 1 and the " +
                     std::to_string(m.routed_experts()) + " routed experts of " + m.name);

  // Layout.
  if (o.ep < 1) throw UsageError("--ep must be at least 1, not " + std::to_string(o.ep));
  if (o.tp < 1) throw UsageError("--tp must be at least 1, not " + std::to_string(o.tp));
  // Every rank is a thread (and each builds the plan) on the CPU backend: beyond this the
  // machine, not the protocol, is what fails.
  if (int64_t(o.ep) * o.tp > kMaxRanks)
    throw UsageError("--ep " + std::to_string(o.ep) + " x --tp " + std::to_string(o.tp) + " is more than " +
                     std::to_string(kMaxRanks) + " ranks");
  if (m.num_experts % o.ep != 0)
    throw UsageError("--ep " + std::to_string(o.ep) + " does not divide the " +
                     std::to_string(m.num_experts) + " experts of " + m.name +
                     " (E % EP must be 0; E is not divisible by " + std::to_string(o.ep) +
                     "; try --ep " + divisors_text(m.num_experts) + ")");
  if (m.ffn % o.tp != 0)
    throw UsageError("--tp " + std::to_string(o.tp) + " does not divide the FFN size F " +
                     std::to_string(m.ffn) + " of " + m.name + " (F % TP must be 0; F is not " +
                     "divisible by " + std::to_string(o.tp) + ")");
  c.layout.ep = o.ep;
  c.layout.tp = o.tp;
  c.layout.world = o.ep * o.tp;
  const int world = c.layout.world;

  // Tokens.
  w.tokens_per_rank = parse_tokens(o.tokens);
  if (w.tokens_per_rank.size() == 1) {
    w.tokens_per_rank.assign(size_t(world), w.tokens_per_rank[0]);
  } else if (int(w.tokens_per_rank.size()) != world) {
    throw UsageError("--tokens lists " + std::to_string(w.tokens_per_rank.size()) +
                     " counts, but the world has W = ep * tp = " + std::to_string(world) +
                     " ranks (give one count, or one per rank)");
  }
  c.max_tokens_per_rank = *std::max_element(w.tokens_per_rank.begin(), w.tokens_per_rank.end());
  if (c.max_tokens_per_rank < 1) throw UsageError("--tokens: at least one rank needs a token");
  const int64_t slots = int64_t(world) * c.max_tokens_per_rank * m.topk;
  if (slots > kMaxRoutingSlots)
    throw UsageError("W " + std::to_string(world) + " x " + std::to_string(c.max_tokens_per_rank) +
                     " tokens per rank x topk " + std::to_string(m.topk) + " = " + std::to_string(slots) +
                     " routing slots, more than the " + std::to_string(kMaxRoutingSlots) +
                     " this tool plans for (fewer --tokens, ranks or --topk)");
  const int64_t expert_rows = slots * o.tp;
  if (expert_rows > kMaxExpertRows)
    throw UsageError(std::to_string(slots) + " routing slots x TP " + std::to_string(o.tp) + " = " +
                     std::to_string(expert_rows) + " expert rows (every TP rank of an expert holds each of its rows), more than the " +
                     std::to_string(kMaxExpertRows) + " this tool plans for (fewer --tokens, ranks or --topk, or a smaller --tp)");
  // The slot cap does not see E, which the routing and the plan's counts scale with.
  const int64_t routing_work = slots * m.num_experts;
  if (routing_work > kMaxRoutingWork)
    throw UsageError("W " + std::to_string(world) + " x " + std::to_string(c.max_tokens_per_rank) +
                     " tokens per rank x topk " + std::to_string(m.topk) + " x E " + std::to_string(m.num_experts) +
                     " = " + std::to_string(routing_work) + " (routing slots x experts), more than the " +
                     std::to_string(kMaxRoutingWork) + " this tool routes (fewer --experts, --tokens, ranks or --topk)");
  const int64_t plan_counts = int64_t(world) * world * (m.num_experts / o.ep);
  if (plan_counts > kMaxPlanCounts)
    throw UsageError("W " + std::to_string(world) + " x W " + std::to_string(world) + " x E/EP " +
                     std::to_string(m.num_experts / o.ep) + " = " + std::to_string(plan_counts) +
                     " (plan counts, one per src rank, dst rank and local expert), more than the " +
                     std::to_string(kMaxPlanCounts) + " this tool plans for (fewer --experts or ranks, or a larger --ep)");

  // Routing.
  w.routing = parse_routing_option(o.routing);
  if (!(o.mask_fraction >= 0.0 && o.mask_fraction <= 1.0))
    throw UsageError("--mask-fraction must be within [0, 1], not " + fmt_double(o.mask_fraction));
  w.routing.mask_fraction = o.mask_fraction;
  w.seed = o.seed;

  // Storage type and tiles.
  if (std::find(std::begin(kDTypes), std::end(kDTypes), o.dtype) == std::end(kDTypes))
    throw UsageError("--dtype must be bf16, f16 or f32, not \"" + o.dtype + "\"");
  c.dtype = parse_dtype(o.dtype);
  c.tiles = default_tiles;
  if (o.tile_opts[0]->count()) c.tiles.block_m = o.block_m;
  if (o.tile_opts[1]->count()) c.tiles.block_n0 = o.block_n0;
  if (o.tile_opts[2]->count()) c.tiles.block_n1 = o.block_n1;
  if (c.tiles.block_m < 1 || c.tiles.block_n0 < 1 || c.tiles.block_n1 < 1)
    throw UsageError("--block-m, --block-n0 and --block-n1 must be positive");
  // Every expert segment is padded to a whole M tile, and no token cap sees that padding: with
  // --block-m 65536 one token per rank made gigabytes of buffers.
  if (c.tiles.block_m > kMaxBlockM)
    throw UsageError("--block-m " + std::to_string(c.tiles.block_m) + " is more than " + std::to_string(kMaxBlockM) +
                     " rows (each expert's rows are padded to a whole M tile)");

  const Status status = c.validate();
  if (!status) throw UsageError(user_message(status.reason));
  return w;
}

}  // namespace

RoutingSpec parse_routing_option(const std::string& text) {
  try {
    return parse_routing_spec(text);
  } catch (const Error& e) {
    throw UsageError("--routing: " + user_message(e.what()));
  }
}

Workload build_workload(const WorkloadOptions& o, const TileConfig& default_tiles) {
  try {
    return build_workload_checked(o, default_tiles);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    // Whatever the library rejects while reading the options is bad input too.
    throw UsageError(user_message(e.what()));
  }
}

std::vector<Routing> generate_all_routing(const Workload& w) {
  std::vector<Routing> routing;
  const ModelShape& m = w.config.model;
  for (int r = 0; r < w.config.layout.world; ++r)
    routing.push_back(generate_routing(w.routing, w.tokens_per_rank[size_t(r)], m.routed_experts(),
                                       m.topk, w.seed, r));
  return routing;
}

}  // namespace comet::tools
