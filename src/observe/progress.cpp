// fsdp-cpp: progress lines (see fsdp/progress.h).
#include "fsdp/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "fsdp/config.h"
#include "fsdp/errors.h"
#include "fsdp/memory.h"

namespace fsdp {
namespace {

// The terminal line currently drawn by a reporter (at most one per process).
std::mutex g_mu;
FILE* g_open = nullptr;
const Progress* g_owner = nullptr;

std::string fixed(double v) {
  char b[32];
  const double a = std::fabs(v);
  std::snprintf(b, sizeof b, a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : "%.2f", v);
  return b;
}

int terminal_width(FILE* f) {
  struct winsize ws {};
  if (::ioctl(::fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

}  // namespace

namespace progress {

void clear_line() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_open) return;
  std::fputs("\r\033[K", g_open);
  std::fflush(g_open);
  g_open = nullptr;
  g_owner = nullptr;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = static_cast<long long>(std::llround(s));
  char b[48];
  if (t < 60)
    std::snprintf(b, sizeof b, "%llds", t);
  else if (t < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
  else if (t < 86400)
    std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  else
    std::snprintf(b, sizeof b, "%lldd%02lldh", t / 86400, (t % 86400) / 3600);
  return b;
}

}  // namespace progress

Progress::Progress(ProgressOptions opts) : o_(std::move(opts)) {
  if (!o_.clock) {
    o_.clock = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
  if (!o_.out) o_.out = stdout;
  // The environment, read here once (docs/CONFIG.md): FSDP_PROGRESS and
  // FSDP_PROGRESS_EVERY.
  const config::EnvConfig env = config::read_env();
  using Mode = config::ProgressMode;
  const Mode mode = env.progress;
  if (o_.interval_s < 0) o_.interval_s = env.progress_every_s.value_or(5.0);
  if (!std::isfinite(o_.window_s) || o_.window_s <= 0) o_.window_s = 20;
  active_ = o_.enabled && o_.rank == 0 && mode != Mode::OFF;
  if (o_.tty >= 0)
    tty_ = o_.tty != 0;
  else if (mode == Mode::LINES || mode == Mode::TTY)
    tty_ = mode == Mode::TTY;
  else
    tty_ = ::isatty(::fileno(o_.out)) == 1;
  start_ = now();
  done_ = o_.initial;
  samples_.push_back({start_, done_});
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {
  }
}

double Progress::now() const { return o_.clock(); }

double Progress::elapsed() const { return now() - start_; }

double Progress::rate() const {
  if (samples_.size() < 2) return 0;
  const auto& a = samples_.front();
  const auto& b = samples_.back();
  const double dt = b.first - a.first;
  return dt > 0 ? double(b.second - a.second) / dt : 0;
}

double Progress::eta() const {
  if (o_.total <= 0) return -1;
  if (done_ >= o_.total) return 0;
  const double r = rate();
  return r > 0 ? double(o_.total - done_) / r : -1;
}

std::string Progress::line() const {
  const bool bytes = o_.unit == "bytes";
  auto amount = [&](int64_t v) { return bytes ? memory::format_bytes(v) : std::to_string(v); };
  std::string s = "progress: " + o_.label + " " + amount(done_);
  if (o_.total > 0) {
    s += "/" + amount(o_.total);
    if (!bytes) s += " " + o_.unit;
    const double pct = std::min(100.0, 100.0 * double(done_) / double(o_.total));
    s += " (" + std::to_string(int(std::floor(pct))) + "%)";
  } else if (!bytes) {
    s += " " + o_.unit;
  }
  s += " | elapsed " + progress::format_duration(std::max(0.0, elapsed()));
  if (o_.total > 0) s += " | ETA " + progress::format_duration(eta());
  const double r = rate();
  if (r > 0) {
    if (bytes)
      s += " | " + memory::format_bytes(int64_t(r * o_.rate_scale)) + "/s";
    else
      s += " | " + fixed(r * o_.rate_scale) + " " + (o_.rate_unit.empty() ? o_.unit + "/s" : o_.rate_unit);
  }
  for (auto& [k, v] : fields_) s += " | " + k + " " + v;
  return s;
}

void Progress::print() {
  std::string text = line();
  std::lock_guard<std::mutex> lk(g_mu);
  if (tty_) {
    const int w = terminal_width(o_.out);
    if (w > 1 && int(text.size()) > w - 1) text.resize(size_t(w - 1));
    std::fprintf(o_.out, "\r%s\033[K", text.c_str());
    g_open = o_.out;
    g_owner = this;
  } else {
    if (g_open == o_.out) {  // another reporter's terminal line on this stream
      std::fputs("\r\033[K", g_open);
      g_open = nullptr;
      g_owner = nullptr;
    }
    std::fprintf(o_.out, "%s\n", text.c_str());
  }
  std::fflush(o_.out);
  ++printed_;
  last_print_ = now();
  last_printed_done_ = done_;
}

bool Progress::update(int64_t done, const Fields& fields) {
  done_ = done;
  fields_ = fields;
  const double t = now();
  // The moving-average window: drop samples while the next one still covers
  // window_s; thin out samples closer than window_s / 256 (bounded memory).
  if (samples_.size() >= 2 && t - samples_[samples_.size() - 2].first < o_.window_s / 256)
    samples_.back() = {t, done};
  else
    samples_.push_back({t, done});
  while (samples_.size() > 2 && samples_[1].first <= t - o_.window_s) samples_.pop_front();

  if (!active_ || finished_) return false;
  const double el = t - start_;
  bool due;
  if (tty_)
    due = el >= o_.tty_delay_s && (last_print_ < 0 || t - last_print_ >= o_.tty_interval_s);
  else
    due = el >= o_.interval_s && (last_print_ < 0 || t - last_print_ >= o_.interval_s);
  // The last update always shows once anything was shown: logs end at 100%.
  if (o_.total > 0 && done >= o_.total && printed_ > 0 && last_printed_done_ != done) due = true;
  if (!due) return false;
  print();
  return true;
}

void Progress::finish() {
  if (!active_ || printed_ == 0 || finished_) return;
  finished_ = true;
  if (tty_) {
    bool mine;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      mine = g_owner == this;
    }
    if (!mine || last_printed_done_ != done_) print();  // show the final state
    std::lock_guard<std::mutex> lk(g_mu);
    std::fputs("\n", o_.out);
    std::fflush(o_.out);
    if (g_owner == this) {
      g_open = nullptr;
      g_owner = nullptr;
    }
  } else if (last_printed_done_ != done_) {
    print();
  }
}

}  // namespace fsdp
