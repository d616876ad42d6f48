// `fsdp report DIR -o report.html`: a trace directory -> one self-contained page.
//
// Also merges the rank files into DIR/trace.json (for Perfetto) unless
// --no-merge, so one command leaves both views of the run.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <filesystem>
#include <string>

#include "cli_checks.h"
#include "command.h"
#include "fsdp/flight.h"
#include "fsdp/memory.h"
#include "fsdp/trace.h"

namespace {

int cmd_report(int argc, char** argv) {
  std::string in, out = "report.html", title = "fsdp-cpp report";
  bool no_merge = false, print_json = false;
  CLI::App app{"Turn a trace (DIR written by --trace, or a trace.json) into one HTML page: shard map, "
               "step timeline, memory vs the ledger, traffic vs 3P / 2P, checkpoints",
               "fsdp report"};
  app.add_option("trace", in,
                 "trace directory (trace-rank<R>.json files, or replica groups' group<g>/ folders of them) or a "
                 "merged trace.json; or a folder of flight recorder "
                 "dumps (flight-rank<R>.json, fsdp run --flight-dir): their side-by-side page")
      ->required();
  app.add_option("-o,--out", out, "output HTML file")->capture_default_str();
  app.add_option("--title", title, "page title")->capture_default_str();
  app.add_flag("--no-merge", no_merge, "do not write DIR/trace.json");
  app.add_flag("--json", print_json, "print the report's data model (JSON) to stdout instead of a summary");
  if (const std::optional<int> rc = fsdp::cli::parse(app, argc, argv)) return *rc;
  // A folder of flight recorder dumps (and no trace): their page instead.
  {
    bool is_file = in.size() > 5 && in.compare(in.size() - 5, 5, ".json") == 0;
    auto dumps = is_file ? std::vector<nlohmann::json>{} : fsdp::flight::read_dumps(in);
    bool has_trace = false;
    std::error_code ec;
    if (!is_file)
      for (auto& e : std::filesystem::directory_iterator(in, ec))
        has_trace |= e.path().filename().string().rfind("trace-rank", 0) == 0;
    if (!dumps.empty() && !has_trace) {
      if (title == "fsdp-cpp report") title = "fsdp-cpp flight recorder";
      if (print_json) {
        std::printf("%s\n", fsdp::flight::analyze_dumps(dumps).dump(1).c_str());
        return 0;
      }
      auto sum = fsdp::flight::write_report(dumps, out, title);
      std::printf("fsdp report: flight recorder dumps of %d rank(s), %d unfinished collective(s) -> %s (%s)\n",
                  sum.ranks, sum.unfinished, out.c_str(), fsdp::memory::format_bytes(sum.bytes).c_str());
      std::printf("fsdp report: %s\n", sum.headline.c_str());
      return 0;
    }
  }
  nlohmann::json model = fsdp::report::analyze(in);
  int64_t bytes = fsdp::report::write_html(model, out, title);
  std::string merged;
  bool is_file = in.size() > 5 && in.compare(in.size() - 5, 5, ".json") == 0;
  if (!no_merge && !is_file) {
    if (model.contains("replica_dirs"))  // replica groups: one merged trace per group's folder
      for (auto& d : model["replica_dirs"])
        merged += (merged.empty() ? "" : ", ") + fsdp::trace::merge(d.get<std::string>());
    else
      merged = fsdp::trace::merge(in);
  }
  if (print_json) {
    std::printf("%s\n", model.dump(1).c_str());
    return 0;
  }
  size_t steps = 0;
  for (auto& r : model["ranks"]) steps = std::max(steps, r["steps"].size());
  std::printf("fsdp report: %zu rank(s), %zu step(s), %zu unit(s) -> %s (%s)\n", model["ranks"].size(), steps,
              model["units"].size(), out.c_str(), fsdp::memory::format_bytes(bytes).c_str());
  if (!merged.empty()) std::printf("fsdp report: merged trace for Perfetto / chrome://tracing: %s\n", merged.c_str());
  if (model.contains("replicas")) {
    const auto& rep = model["replicas"];
    std::printf("fsdp report: replica groups: %zu quorum(s), %zu group(s), %zu heal(s)%s\n", rep["quorums"].size(),
                rep["groups"].size(), rep["heals"].size(),
                model.contains("replica_group")
                    ? (" (timeline of group " + std::to_string(model["replica_group"].get<int>()) + ")").c_str()
                    : "");
  }
  for (auto& w : model["warnings"]) std::printf("fsdp report: warning: %s\n", w.get<std::string>().c_str());
  return 0;
}

}  // namespace

FSDP_COMMAND(report, "trace DIR -> one self-contained HTML report (shard map, timeline, memory, traffic)",
             cmd_report);
