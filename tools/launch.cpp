// tools/launch.cpp: the process supervisor behind `comet launch` (contract in launch.h).
//
//   comet launch -n 4 --timeout-s 600 -- ./my_program --flag
//
// One thread, one poll() loop over every rank's stdout and stderr pipes plus a self-pipe that
// the signal handler writes to (SIGCHLD, SIGINT, SIGTERM), so no event is missed between a
// check and the wait. Output is cut into lines per (rank, stream) and each batch of whole lines
// goes out in one write(2), so lines of different ranks never mix.
//
// Pitfalls handled here:
// - A rank's leader process can exit while processes it started still hold its pipes open, so
//   reaching EOF is not the end of a rank: its exit is seen with waitid(WNOWAIT), whatever is
//   already in its pipes is read, and the pipes are closed.
// - The leader is left a zombie until the end: its pid is its process group id, and a zombie
//   keeps that id from being reused, so signalling the group (kill(-pid)) never hits a stranger.
// - Between fork and exec the child must not run the launcher's signal handlers (they would
//   write to the launcher's self-pipe): signals are blocked around fork, and the child restores
//   the default dispositions (also SIGPIPE, ignored here, which exec would pass on) before
//   unblocking them.
// - An exec failure is reported through a close-on-exec pipe, so "command not found" is told
//   apart from a program that exits with 127.
#include "launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace comet::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadBytes = 64 * 1024;
// A line longer than this is cut and forwarded as it is (a progress bar that only ever writes
// '\r' must not grow without bound).
constexpr size_t kMaxLineBytes = 64 * 1024;
// Reads of an exited rank's pipes: enough for everything it wrote (a pipe holds 64 KiB by
// default), bounded in case a process it left behind keeps writing.
constexpr int kMaxDrainReads = 256;

[[noreturn]] void throw_system(const std::string& what, int err) {
  throw Error("launch: " + what + ": " + std::strerror(err));
}

// ---- output: a slow reader must not stop the supervision -----------------------------------
// While the run goes on, output waits for whoever reads our stdout and stderr; once the run's
// deadline has passed, the run is being stopped (a signal), or a rank has failed (its exit may
// not have been handled yet: the loop that would handle it can be the one waiting here), it
// waits no more: what the reader does not take at once is dropped, so that the timeout and the
// stop still happen when the reader is stuck (a paused pager, a full log pipe).
volatile sig_atomic_t g_stop_signals = 0;   // stop signals received so far (see on_signal)
volatile sig_atomic_t g_child_signals = 0;  // SIGCHLDs received so far
bool g_output_impatient = false;            // set when the run starts stopping
Clock::time_point g_output_deadline = Clock::time_point::max();
std::vector<pid_t> g_rank_pids;  // every rank's leader, as spawned
sig_atomic_t g_child_signals_scanned = 0;
bool g_rank_failed = false;

// The output state of one launch (the Launcher's constructor; a process may launch twice).
void reset_output_state() {
  g_output_impatient = false;
  g_output_deadline = Clock::time_point::max();
  g_rank_pids.clear();
  g_child_signals_scanned = g_child_signals;
  g_rank_failed = false;
}

// Whether a rank's leader has exited with a failure (a status other than 0, or a signal). Looked
// up again only after a SIGCHLD, and without reaping (WNOWAIT): the loop's check_exits still
// sees the exit. Once true it stays true for the launch.
bool a_rank_failed() {
  if (g_rank_failed || g_child_signals_scanned == g_child_signals) return g_rank_failed;
  g_child_signals_scanned = g_child_signals;
  for (const pid_t pid : g_rank_pids) {
    siginfo_t info{};
    if (::waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid) continue;
    if (info.si_code != CLD_EXITED || info.si_status != 0) g_rank_failed = true;
  }
  return g_rank_failed;
}

bool output_may_wait() {
  return g_stop_signals == 0 && !g_output_impatient && Clock::now() < g_output_deadline && !a_rank_failed();
}

// Everything, or as much as the reader takes: when whoever reads our stdout has gone away
// (EPIPE) the rest is dropped, because the ranks must still be supervised to the end. Writes
// go out once poll() says the fd takes them, at most PIPE_BUF bytes at a time, which a pipe
// that polls writable takes without blocking.
void write_all(int fd, std::string_view text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    pollfd pfd{fd, POLLOUT, 0};
    const int ready = ::poll(&pfd, 1, 100);
    if (ready < 0 && errno != EINTR) return;
    if (ready <= 0) {
      if (!output_may_wait()) return;
      continue;
    }
    const ssize_t n = ::write(fd, p, std::min<size_t>(left, PIPE_BUF));
    if (n > 0) {
      p += n;
      left -= size_t(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!output_may_wait()) return;
    } else {
      return;
    }
  }
}

// The first PATH entry holding a file named `cmd`, or "".
std::string find_in_path(const std::string& cmd) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "";
  while (true) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + cmd;
    if (::access(candidate.c_str(), F_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

void report(const std::string& message) { write_all(2, "comet launch: error: " + message + "\n"); }

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// ---- signals: handlers write one byte to a non-blocking self-pipe --------------------------
int g_wake_write_fd = -1;
volatile sig_atomic_t g_last_stop_signal = 0;

void on_signal(int sig) {
  const int saved_errno = errno;
  if (sig != SIGCHLD) {
    g_last_stop_signal = sig;
    g_stop_signals = g_stop_signals + 1;  // no nesting: sa_mask blocks the other handled signals
  } else {
    g_child_signals = g_child_signals + 1;
  }
  const char byte = 0;
  const ssize_t ignored = ::write(g_wake_write_fd, &byte, 1);  // full pipe: a wake-up is pending
  (void)ignored;
  errno = saved_errno;
}

// Every signal but SIGCHLD stops the run: SIGHUP (the terminal or ssh session went away) and
// SIGQUIT too, so that ranks are not left running on their GPUs. (SIGKILL cannot be caught:
// each rank's own process asks the kernel to kill it when the launcher dies, PR_SET_PDEATHSIG;
// processes the rank starts are not covered.)
constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Installs the handlers and the self-pipe for its lifetime; restores what was there before.
class SignalScope {
 public:
  SignalScope() {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw_system("pipe", errno);
    g_wake_write_fd = wake_[1];
    g_stop_signals = 0;
    g_output_impatient = false;
    g_output_deadline = Clock::time_point::max();
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_NOCLDSTOP;  // a stopped rank is not an exited one
    sigemptyset(&sa.sa_mask);
    for (int sig : kHandledSignals) sigaddset(&sa.sa_mask, sig);
    for (size_t i = 0; i < std::size(kHandledSignals); ++i)
      ::sigaction(kHandledSignals[i], &sa, &saved_[i]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &saved_pipe_);
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i)
      ::sigaction(kHandledSignals[i], &saved_[i], nullptr);
    ::sigaction(SIGPIPE, &saved_pipe_, nullptr);
    g_wake_write_fd = -1;
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int wake_fd() const { return wake_[0]; }
  void clear_wake() {
    char buf[256];
    while (::read(wake_[0], buf, sizeof buf) > 0) {
    }
  }

 private:
  int wake_[2] = {-1, -1};
  struct sigaction saved_[std::size(kHandledSignals)] {};
  struct sigaction saved_pipe_ {};
};

// ---- the private directory of COMET_BOOTSTRAP_FILE ------------------------------------------
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/comet-launch-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw_system("cannot create a directory like " + tmpl, errno);
    path_ = tmpl;  // mkdtemp: mode 0700, so the file a rank writes there is private
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int free_local_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) throw_system("socket for a free MASTER_PORT", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the kernel picks a free one
  socklen_t len = sizeof addr;
  if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(s);
    throw_system("bind 127.0.0.1 for a free MASTER_PORT", err);
  }
  ::close(s);
  return ntohs(addr.sin_port);
}

// ---- ranks ----------------------------------------------------------------------------------
struct OutputStream {
  int fd = -1;    // read end of the pipe; -1 once closed
  int dest = 1;   // 1: stdout, 2: stderr
  std::string partial;  // bytes after the last newline
};

struct Rank {
  pid_t pid = -1;  // also its process group id
  bool exited = false;  // the leader exited (seen with WNOWAIT: still a zombie)
  bool reaped = false;
  int exit_code = 0;    // exit status, or 128 + signal
  int term_signal = 0;  // the signal that killed it, or 0
  std::string prefix;
  OutputStream streams[2];
};

enum class ReadResult { kData, kEmpty, kClosed };

class Launcher {
 public:
  explicit Launcher(const LaunchSpec& spec) : spec_(spec), ranks_(size_t(spec.num_ranks)) {
    reset_output_state();
    devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull_ < 0) throw_system("open /dev/null", errno);
    bootstrap_file_ = dir_.path() + "/bootstrap";
    build_base_env();
  }
  ~Launcher() {
    // Normal runs reap every rank; this is the path of an exception.
    for (Rank& r : ranks_) {
      if (r.pid > 0 && !r.reaped) {
        ::kill(-r.pid, SIGKILL);
        int status = 0;
        while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      for (OutputStream& s : r.streams)
        if (s.fd >= 0) ::close(s.fd);
    }
    ::close(devnull_);
  }
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run();

 private:
  void build_base_env();
  void spawn(int rank);
  void check_exits();
  ReadResult read_once(Rank& r, OutputStream& s);
  void forward(Rank& r, OutputStream& s, const char* data, size_t n);
  void close_stream(Rank& r, OutputStream& s);
  void drain(Rank& r);
  void begin_stop(int sig, int exit_code);
  void signal_groups(int sig);
  void end_leftovers();
  bool all_exited() const;
  std::string running_ranks_text() const;

  const LaunchSpec spec_;
  SignalScope signals_;
  TempDir dir_;
  std::string bootstrap_file_;
  std::vector<std::string> base_env_;  // the caller's environment minus what launch sets
  int devnull_ = -1;
  std::vector<Rank> ranks_;
  bool stopping_ = false;
  bool killed_ = false;  // SIGKILL sent to every group
  int exit_code_ = 0;
  Clock::time_point kill_at_{};
};

void Launcher::build_base_env() {
  static constexpr std::string_view kPerRank[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE", "COMET_BOOTSTRAP_FILE"};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (std::find(std::begin(kPerRank), std::end(kPerRank), name) == std::end(kPerRank))
      base_env_.emplace_back(kv);
  }
  // torchrun's rendezvous variables, for programs that initialize torch.distributed; a value
  // the caller set (a multi-node job, say) is kept.
  if (std::getenv("MASTER_ADDR") == nullptr) base_env_.emplace_back("MASTER_ADDR=127.0.0.1");
  if (std::getenv("MASTER_PORT") == nullptr)
    base_env_.push_back("MASTER_PORT=" + std::to_string(free_local_port()));
}

void Launcher::spawn(int rank) {
  Rank& r = ranks_[size_t(rank)];
  r.prefix = "[rank " + std::to_string(rank) + "] ";

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env = base_env_;
  const std::string world = std::to_string(spec_.num_ranks);
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + world);
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("LOCAL_WORLD_SIZE=" + world);
  env.push_back("COMET_BOOTSTRAP_FILE=" + bootstrap_file_);
  std::vector<char*> envp, argv;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec_.argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw_system("pipe", errno);
  r.streams[0] = {out_pipe[0], 1, {}};
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(out_pipe[1]);
    throw_system("pipe", err);
  }
  r.streams[1] = {err_pipe[0], 2, {}};
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    throw_system("pipe", err);
  }

  sigset_t all, saved_mask;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &saved_mask);
  const pid_t launcher_pid = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : kHandledSignals) ::sigaction(sig, &dfl, nullptr);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);
    // Killed with the launcher, whatever ends it (SIGKILL included); a launcher that died
    // between fork and here is seen as a new parent. Only this process is: what the rank starts
    // itself outlives a launcher killed by SIGKILL (docs/cli.md).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher_pid) ::_exit(127);
    ::dup2(devnull_, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    environ = envp.data();
    ::execvp(argv[0], argv.data());
    const int err = errno;
    const ssize_t ignored = ::write(exec_pipe[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &saved_mask, nullptr);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::close(exec_pipe[1]);
  if (pid < 0) {
    ::close(exec_pipe[0]);
    throw_system("fork of rank " + std::to_string(rank), fork_errno);
  }
  r.pid = pid;
  g_rank_pids.push_back(pid);

  // EOF: exec succeeded (the pipe closed with it); an int: the child's errno from execvp.
  int exec_errno = 0;
  ssize_t n = 0;
  while ((n = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  ::close(exec_pipe[0]);
  if (n == ssize_t(sizeof exec_errno)) {
    const std::string& cmd = spec_.argv[0];
    std::string why = std::strerror(exec_errno);
    if (exec_errno == ENOENT) {
      // ENOENT also comes from an existing file whose interpreter (its #! line) is missing.
      const bool searched = cmd.find('/') == std::string::npos;
      const std::string found = searched ? find_in_path(cmd) : (::access(cmd.c_str(), F_OK) == 0 ? cmd : "");
      if (!found.empty())
        why = "\"" + found + "\" exists, but its interpreter (its #! line) or a library it needs was not found";
      else if (searched)
        why = "command not found (searched PATH)";
    }
    throw LaunchExecError("launch: rank " + std::to_string(rank) + " cannot run \"" + cmd + "\": " + why);
  }
  for (OutputStream& s : r.streams) ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
}

void Launcher::forward(Rank& r, OutputStream& s, const char* data, size_t n) {
  s.partial.append(data, n);
  std::string text;
  size_t begin = 0;
  for (size_t nl; (nl = s.partial.find('\n', begin)) != std::string::npos; begin = nl + 1) {
    text += r.prefix;
    text.append(s.partial, begin, nl + 1 - begin);
  }
  s.partial.erase(0, begin);
  if (s.partial.size() >= kMaxLineBytes) {
    text += r.prefix + s.partial + "\n";
    s.partial.clear();
  }
  if (!text.empty()) write_all(s.dest, text);
}

ReadResult Launcher::read_once(Rank& r, OutputStream& s) {
  char buf[kReadBytes];
  ssize_t n = 0;
  while ((n = ::read(s.fd, buf, sizeof buf)) < 0 && errno == EINTR) {
  }
  if (n > 0) {
    forward(r, s, buf, size_t(n));
    return ReadResult::kData;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadResult::kEmpty;
  return ReadResult::kClosed;  // EOF, or a read error that will not go away
}

void Launcher::close_stream(Rank& r, OutputStream& s) {
  if (!s.partial.empty()) write_all(s.dest, r.prefix + s.partial + "\n");
  s.partial.clear();
  ::close(s.fd);
  s.fd = -1;
}

void Launcher::drain(Rank& r) {
  for (OutputStream& s : r.streams) {
    if (s.fd < 0) continue;
    for (int i = 0; i < kMaxDrainReads && read_once(r, s) == ReadResult::kData; ++i) {
    }
    close_stream(r, s);
  }
}

// `seconds` from now, on the launcher's clock.
Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void Launcher::signal_groups(int sig) {
  // Exited leaders too: their groups may hold processes they started.
  for (const Rank& r : ranks_)
    if (r.pid > 0 && !r.reaped) ::kill(-r.pid, sig);
}

// The whole of a /proc file, or what was read before an error: a process that exits while its
// file is read fails the read (ESRCH), which a stream would throw for.
std::string read_proc_file(const std::filesystem::path& path) {
  std::string text;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) text.append(buf, size_t(n));
    else if (n < 0 && errno == EINTR) continue;
    else break;
  }
  ::close(fd);
  return text;
}

// The process groups among `pgids` that hold a process other than a zombie (Linux /proc; a
// rank's exited leader stays in its group as a zombie until it is reaped). One scan of /proc.
// A process whose main thread exited while other threads run shows as a zombie too and is
// missed; it still got the SIGTERM.
std::set<pid_t> groups_with_live_members(const std::set<pid_t>& pgids) {
  std::set<pid_t> live;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // The whole file: comm (in parentheses) may hold spaces, parentheses and newlines, so the
    // fields are read after the last ')'.
    const std::string stat = read_proc_file(it->path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;  // ended meanwhile
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) continue;
    if (state != 'Z' && state != 'X' && pgids.count(pid_t(pgrp))) live.insert(pid_t(pgrp));
  }
  return live;
}

// After a clean run: SIGTERM to the groups, then, for processes that ignore it, SIGKILL to the
// groups still holding one `grace_s` later. A run that left nothing behind pays one scan of
// /proc. A stop signal meanwhile sends the SIGKILL at once; the ranks all exited with 0, so the
// run still returns 0.
void Launcher::end_leftovers() {
  signal_groups(SIGTERM);
  const Clock::time_point kill_at = after(spec_.grace_s);
  std::set<pid_t> groups;
  for (const Rank& r : ranks_)
    if (r.pid > 0 && !r.reaped) groups.insert(r.pid);
  while (!groups_with_live_members(groups).empty()) {
    if (Clock::now() >= kill_at || g_stop_signals != 0) {
      signal_groups(SIGKILL);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Launcher::begin_stop(int sig, int exit_code) {
  stopping_ = true;
  g_output_impatient = true;
  exit_code_ = exit_code;
  kill_at_ = after(spec_.grace_s);
  signal_groups(sig);
}

bool Launcher::all_exited() const {
  for (const Rank& r : ranks_)
    if (!r.exited) return false;
  return true;
}

std::string Launcher::running_ranks_text() const {
  std::string list;
  int count = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].exited) continue;
    list += (count++ ? ", " : "") + std::to_string(i);
  }
  return (count == 1 ? "rank " : "ranks ") + list;
}

void Launcher::check_exits() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (r.exited) continue;
    siginfo_t info{};
    if (::waitid(P_PID, id_t(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;  // looked at again in the next round
      throw_system("waitid for rank " + std::to_string(i), errno);
    }
    if (info.si_pid != r.pid) continue;  // still running
    r.exited = true;
    if (info.si_code == CLD_EXITED) {
      r.exit_code = info.si_status;
    } else {
      r.term_signal = info.si_status;
      r.exit_code = 128 + info.si_status;
    }
    // Its output comes before any line about its end.
    drain(r);
    if (r.exit_code != 0 && !stopping_) {
      const std::string how = r.term_signal ? "killed by signal " + signal_name(r.term_signal)
                                            : "exited with status " + std::to_string(r.exit_code);
      report("rank " + std::to_string(i) + " " + how + " (stopping the other ranks)");
      begin_stop(SIGTERM, r.exit_code);
    }
  }
}

int Launcher::run() {
  for (int i = 0; i < spec_.num_ranks; ++i) spawn(i);
  const bool has_timeout = spec_.timeout_s > 0;
  const Clock::time_point deadline = after(spec_.timeout_s);
  if (has_timeout) g_output_deadline = deadline;
  sig_atomic_t stop_signals_seen = 0;
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, OutputStream*>> fd_owner;

  for (;;) {
    check_exits();
    if (all_exited()) {
      // Whatever the ranks left running in their groups ends with them (a leftover worker would
      // keep its GPU memory): after a stop at once, after a clean run with SIGTERM and, for what
      // ignores it, SIGKILL after the grace period.
      if (stopping_) signal_groups(SIGKILL);
      else end_leftovers();
      break;
    }

    if (g_stop_signals != stop_signals_seen) {
      stop_signals_seen = g_stop_signals;
      const int sig = g_last_stop_signal;
      if (!stopping_) {
        report("interrupted by " + signal_name(sig) + " (forwarded to every rank; stopping them)");
        begin_stop(sig, 128 + sig);
      } else if (!killed_) {
        signal_groups(SIGKILL);  // asked twice: no more grace
        killed_ = true;
      }
    }
    const Clock::time_point now = Clock::now();
    if (!stopping_ && has_timeout && now >= deadline) {
      report("timeout after " + seconds_text(spec_.timeout_s) + " s: " + running_ranks_text() +
             " still running (stopping them)");
      begin_stop(SIGTERM, kLaunchExitTimeout);
    }
    if (stopping_ && !killed_ && now >= kill_at_) {
      signal_groups(SIGKILL);
      killed_ = true;
    }

    // Wait for output, a signal (a rank's exit is SIGCHLD) or the next deadline.
    int wait_ms = -1;
    const auto ms_until = [&](Clock::time_point t) {  // poll() takes an int: at most ~24 days
      const int64_t ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
      return int(std::clamp<int64_t>(ms, 0, INT_MAX));
    };
    if (!stopping_ && has_timeout) wait_ms = ms_until(deadline);
    if (stopping_ && !killed_) wait_ms = ms_until(kill_at_);
    fds.assign(1, pollfd{signals_.wake_fd(), POLLIN, 0});
    fd_owner.assign(1, {nullptr, nullptr});
    for (Rank& r : ranks_)
      for (OutputStream& s : r.streams)
        if (s.fd >= 0) {
          fds.push_back(pollfd{s.fd, POLLIN, 0});
          fd_owner.emplace_back(&r, &s);
        }
    if (::poll(fds.data(), nfds_t(fds.size()), wait_ms) < 0) {
      if (errno == EINTR) continue;
      throw_system("poll", errno);
    }
    if (fds[0].revents) signals_.clear_wake();
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [rank, stream] = fd_owner[k];
      if (read_once(*rank, *stream) == ReadResult::kClosed) close_stream(*rank, *stream);
    }
  }

  for (Rank& r : ranks_) {
    int status = 0;
    while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.reaped = true;
  }
  return exit_code_;
}

// Writes nothing to the fds 0-2 of this process, but pipes created while one of them is closed
// would take its number, and dup2 onto it in the child would then be a no-op.
void ensure_standard_fds_open() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) ::open("/dev/null", O_RDWR);
}

}  // namespace

std::string signal_name(int sig) {
  static constexpr std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
  for (const auto& [number, name] : kNames)
    if (number == sig) return name;
  return "signal " + std::to_string(sig);
}

int launch_ranks(const LaunchSpec& spec) {
  COMET_CHECK(spec.num_ranks >= 1 && spec.num_ranks <= kMaxLaunchRanks,
              "launch: " << spec.num_ranks << " ranks; between 1 and " << kMaxLaunchRanks << " are supported");
  COMET_CHECK(!spec.argv.empty() && !spec.argv[0].empty(), "launch: no command to run");
  COMET_CHECK(spec.timeout_s >= 0 && spec.timeout_s <= kMaxLaunchTimeoutS,
              "launch: timeout " << spec.timeout_s << " s is not within [0, " << kMaxLaunchTimeoutS << "]");
  COMET_CHECK(spec.grace_s >= 0 && spec.grace_s <= 3600, "launch: grace " << spec.grace_s << " s is not within [0, 3600]");
  ensure_standard_fds_open();
  Launcher launcher(spec);
  return launcher.run();
}

}  // namespace comet::tools
