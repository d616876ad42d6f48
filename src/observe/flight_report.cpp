// fsdp-cpp: the flight recorder's dumps side by side, as one HTML page
// (flight::analyze_dumps, flight::write_report; `fsdp report DIR`).
//
// Drawn here, in C++, as inline SVG: no script, nothing fetched, so the page
// opens from a file:// URL anywhere and what the tests check in the DOM is
// what a person sees. One row per rank on one wall-clock axis; each
// collective a bar from its start to its end; one that never finished runs
// to its rank's dump time, in red, labelled. The culprit (the rank the
// survivors' verdicts name most) and its phase head the page.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <set>

#include "common/env.h"
#include "fsdp/errors.h"
#include "fsdp/flight.h"
#include "observe/html.h"

namespace fsdp::flight {
namespace {

std::string clock_text(double wall) {
  std::time_t t = static_cast<std::time_t>(wall);
  std::tm tm{};
  localtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03d", b, static_cast<int>((wall - std::floor(wall)) * 1000));
  return out;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

double num(const nlohmann::json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0;
}

const char* color_of(const std::string& kind) {
  if (kind == "all_gather") return "#4e79a7";
  if (kind == "reduce_scatter") return "#f28e2b";
  if (kind == "all_reduce") return "#59a14f";
  if (kind == "broadcast") return "#b07aa1";
  if (kind == "barrier") return "#9c755f";
  return "#76b7b2";
}

std::string place(const nlohmann::json& c) {
  std::string s = c.value("kind", "?");
  if (!c.value("unit", "").empty()) s += " '" + c.value("unit", "") + "'";
  if (c.value("seq", 0) > 0) s += " #" + std::to_string(c.value("seq", 0));
  return s;
}

}  // namespace

nlohmann::json analyze_dumps(const std::vector<nlohmann::json>& dumps) {
  nlohmann::json m;
  m["ranks"] = nlohmann::json::array();
  std::map<int, int> named;
  std::map<int, std::string> summary_of;  // culprit -> a verdict's summary
  for (auto& d : dumps) {
    nlohmann::json r;
    r["rank"] = d.value("rank", -1);
    r["host"] = d.value("host", "");
    r["pid"] = d.value("pid", 0);
    r["reason"] = d.value("reason", "");
    r["step"] = d.value("step", -1);
    r["phase"] = d.value("phase", "");
    r["written"] = num(d, "written");
    nlohmann::json unfinished = nlohmann::json::array();
    const auto& cs = d.contains("collectives") ? d["collectives"] : nlohmann::json::array();
    for (auto& c : cs)
      if (c.value("state", "") != "done") unfinished.push_back(c);
    r["unfinished"] = unfinished;
    r["last"] = cs.empty() ? nlohmann::json(nullptr) : cs.back();
    if (d.contains("notes") && d["notes"].contains("verdict")) {
      const auto& v = d["notes"]["verdict"];
      r["verdict"] = v;
      if (v.contains("culprits"))
        for (auto& c : v["culprits"]) {
          named[c.get<int>()]++;
          if (!summary_of.count(c.get<int>())) summary_of[c.get<int>()] = v.value("summary", "");
        }
    }
    m["ranks"].push_back(r);
  }
  int culprit = -1;
  for (auto& [c, n] : named)
    if (culprit < 0 || n > named[culprit]) culprit = c;
  m["culprit"] = culprit;
  std::string headline;
  if (culprit >= 0) {
    headline = "Culprit: rank " + std::to_string(culprit);
    const std::string s = summary_of[culprit];
    if (!s.empty()) headline += " — " + s;
    // Its own dump says where it was when it dumped (a stopped rank dumps
    // once continued, so its phase is where it froze).
    for (auto& r : m["ranks"])
      if (r["rank"] == culprit) {
        std::string own = "its own dump (" + r.value("reason", "") + "): step " + std::to_string(r.value("step", -1)) +
                          ", phase " + r.value("phase", "");
        if (!r["unfinished"].empty()) own += ", in " + place(r["unfinished"][0]) + " (unfinished)";
        headline += " — " + own;
      }
    int named_by = named[culprit];
    headline += " — named by " + std::to_string(named_by) + " rank" + (named_by == 1 ? "" : "s");
  } else {
    // No verdict (dumps on demand): the rank that is behind on a
    // communicator's sequence, if any.
    std::map<int, std::pair<int64_t, int>> low;  // comm -> (max seq, rank) lowest
    for (auto& d : dumps) {
      std::map<int, int64_t> top;
      for (auto& c : d.contains("collectives") ? d["collectives"] : nlohmann::json::array())
        top[c.value("comm", 0)] = std::max<int64_t>(top[c.value("comm", 0)], c.value("seq", int64_t(0)));
      for (auto& [comm, s] : top)
        if (!low.count(comm) || s < low[comm].first) low[comm] = {s, d.value("rank", -1)};
    }
    headline = "No failure recorded in these dumps (taken on demand or on SIGUSR1); no rank is named.";
  }
  m["headline"] = headline;
  return m;
}

ReportSummary write_report(const std::vector<nlohmann::json>& dumps, const std::string& out_path,
                           const std::string& title) {
  FSDP_USER_CHECK(!dumps.empty(), "fsdp report: no flight recorder dumps (flight-rank<R>.json) to show");
  nlohmann::json m = analyze_dumps(dumps);
  ReportSummary sum;
  sum.ranks = static_cast<int>(dumps.size());
  sum.culprit = m["culprit"].get<int>();
  sum.headline = m["headline"].get<std::string>();

  // The window: the last collectives of every rank up to its dump.
  constexpr size_t kPerRank = 160;
  double t_lo = 1e300, t_hi = 0;
  for (auto& d : dumps) {
    const auto& cs = d["collectives"];
    const size_t from = cs.size() > kPerRank ? cs.size() - kPerRank : 0;
    for (size_t i = from; i < cs.size(); ++i) {
      const double s = num(cs[i], "started") > 0 ? num(cs[i], "started") : num(cs[i], "enqueued");
      if (s > 0) t_lo = std::min(t_lo, s);
      t_hi = std::max(t_hi, std::max(num(cs[i], "ended"), s));
    }
    t_hi = std::max(t_hi, num(d, "written"));
  }
  if (!(t_lo < t_hi)) t_lo = t_hi - 1;
  const double span = t_hi - t_lo;
  const int left = 150, width = 1150, row_h = 46, top = 34;
  auto x_of = [&](double t) { return left + (t - t_lo) / span * width; };

  std::string svg;
  const int height = top + row_h * static_cast<int>(dumps.size()) + 20;
  svg += "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(left + width + 20) +
         "\" height=\"" + std::to_string(height) + "\">\n";
  // Axis: ticks in seconds from the window's start.
  const double step = span > 20 ? 5 : span > 8 ? 2 : span > 4 ? 1 : span > 1.5 ? 0.5 : span > 0.4 ? 0.1 : 0.02;
  for (double t = 0; t <= span + 1e-9; t += step) {
    const double x = x_of(t_lo + t);
    svg += "<line x1=\"" + fmt("%.1f", x) + "\" y1=\"" + std::to_string(top - 6) + "\" x2=\"" + fmt("%.1f", x) +
           "\" y2=\"" + std::to_string(height - 16) + "\" stroke=\"#ddd\"/>";
    svg += "<text x=\"" + fmt("%.1f", x) + "\" y=\"" + std::to_string(top - 10) +
           "\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">+" + fmt("%.2f", t) + " s</text>\n";
  }
  svg += "<text x=\"4\" y=\"" + std::to_string(top - 10) + "\" font-size=\"11\" fill=\"#555\">" +
         fsdp::detail::html_escape(clock_text(t_lo)) + "</text>\n";
  int row = 0;
  for (auto& d : dumps) {
    const int rank = d.value("rank", -1);
    const int y = top + row_h * row++;
    const bool is_culprit = rank == sum.culprit;
    svg += "<g class=\"rank-row\" data-rank=\"" + std::to_string(rank) + "\">";
    svg += "<rect x=\"0\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(left + width + 20) +
           "\" height=\"" + std::to_string(row_h - 4) + "\" fill=\"" + (is_culprit ? "#fff0f0" : "#f7f7f7") + "\"/>";
    svg += "<text x=\"6\" y=\"" + std::to_string(y + 18) + "\" font-size=\"13\" font-weight=\"bold\" fill=\"" +
           (is_culprit ? "#c00" : "#222") + "\">rank " + std::to_string(rank) + (is_culprit ? " (culprit)" : "") +
           "</text>";
    svg += "<text x=\"6\" y=\"" + std::to_string(y + 34) + "\" font-size=\"10\" fill=\"#666\">" +
           fsdp::detail::html_escape("step " + std::to_string(d.value("step", -1)) + ", " + d.value("phase", "")) + "</text>";
    const auto& cs = d["collectives"];
    const size_t from = cs.size() > kPerRank ? cs.size() - kPerRank : 0;
    const double written = num(d, "written");
    for (size_t i = from; i < cs.size(); ++i) {
      const auto& c = cs[i];
      const std::string state = c.value("state", "");
      double s = num(c, "started"), e = num(c, "ended");
      const bool unfinished = state != "done";
      if (s <= 0) s = num(c, "enqueued");
      if (e <= 0) e = written > 0 ? written : t_hi;
      if (s <= 0) continue;
      const double x0 = x_of(s), x1 = std::max(x_of(e), x0 + 1.5);
      std::string tip = place(c) + " (" + c.value("dtype", "") + ", " + std::to_string(c.value("numel", 0)) +
                        " elements) " + state + ", step " + std::to_string(c.value("step", -1)) + ", " +
                        c.value("phase", "");
      if (c.value("peer", -1) >= 0)
        tip += ", waiting on rank " + std::to_string(c.value("peer", -1)) + " (" + c.value("waiting", "") + "), " +
               std::to_string(c.value("recv_done", 0)) + " of " + std::to_string(c.value("recv_total", 0)) +
               " bytes arrived";
      if (!c.value("error", "").empty()) tip += "\n" + c.value("error", "").substr(0, 300);
      svg += "<rect class=\"coll" + std::string(unfinished ? " unfinished" : "") + "\" data-seq=\"" +
             std::to_string(c.value("seq", 0)) + "\" x=\"" + fmt("%.1f", x0) + "\" y=\"" + std::to_string(y + 6) +
             "\" width=\"" + fmt("%.1f", x1 - x0) + "\" height=\"" + std::to_string(row_h - 16) + "\" fill=\"" +
             (unfinished ? "#e15759" : color_of(c.value("kind", ""))) + "\"" +
             (unfinished ? " stroke=\"#900\" stroke-width=\"2\"" : "") + "><title>" + fsdp::detail::html_escape(tip) + "</title></rect>";
      if (unfinished) {
        ++sum.unfinished;
        svg += "<text class=\"unfinished-label\" x=\"" + fmt("%.1f", std::min(x0 + 4, double(left + width - 260))) +
               "\" y=\"" + std::to_string(y + 25) + "\" font-size=\"11\" fill=\"#fff\" font-weight=\"bold\">" +
               fsdp::detail::html_escape("UNFINISHED " + place(c) + " (" + state + ")") + "</text>";
      }
    }
    svg += "</g>\n";
  }
  svg += "</svg>\n";

  std::string table = "<table><tr><th>rank</th><th>host / pid</th><th>dumped because</th><th>step, phase</th>"
                      "<th>unfinished collectives</th><th>its verdict</th></tr>\n";
  for (auto& r : m["ranks"]) {
    std::string unf;
    for (auto& c : r["unfinished"])
      unf += (unf.empty() ? "" : "<br>") + fsdp::detail::html_escape(place(c) + " (" + c.value("state", "") + ")");
    std::string verdict = r.contains("verdict") ? fsdp::detail::html_escape(r["verdict"].value("summary", "")) : "";
    const bool is_culprit = r["rank"].get<int>() == sum.culprit;
    table += std::string("<tr") + (is_culprit ? " class=\"culprit-row\"" : "") + "><td>" +
             std::to_string(r["rank"].get<int>()) + "</td><td>" + fsdp::detail::html_escape(r.value("host", "")) + " / " +
             std::to_string(r.value("pid", 0)) + "</td><td>" + fsdp::detail::html_escape(r.value("reason", "")) + "</td><td>" +
             std::to_string(r.value("step", -1)) + ", " + fsdp::detail::html_escape(r.value("phase", "")) + "</td><td>" +
             (unf.empty() ? "none" : unf) + "</td><td>" + verdict + "</td></tr>\n";
  }
  table += "</table>\n";

  std::string page =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + fsdp::detail::html_escape(title) +
      "</title><style>body{font-family:sans-serif;margin:16px;color:#222}"
      ".culprit{font-size:17px;padding:10px 14px;border-radius:6px;margin:10px 0 16px 0}"
      ".named{background:#fde2e2;border:2px solid #c00;color:#700}.none{background:#eef;border:1px solid #88a}"
      "table{border-collapse:collapse;margin:14px 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;"
      "text-align:left;vertical-align:top}tr.culprit-row{background:#fff0f0}"
      ".legend span{display:inline-block;margin-right:14px;font-size:12px}"
      ".legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}</style></head>\n"
      "<body data-rendered=\"ok\">\n<h1>" + fsdp::detail::html_escape(title) + "</h1>\n<div id=\"culprit\" class=\"culprit " +
      (sum.culprit >= 0 ? "named" : "none") + "\">" + fsdp::detail::html_escape(sum.headline) + "</div>\n" +
      "<p>" + std::to_string(dumps.size()) + " rank(s); the last " + std::to_string(kPerRank) +
      " collectives of each on one wall-clock axis (from " + fsdp::detail::html_escape(clock_text(t_lo)) + ", " + fmt("%.3f", span) +
      " s). Bars run from a collective's start to its end; one that never finished runs to its rank's dump, in "
      "red. Hover a bar for its details.</p>\n<div class=\"legend\">";
  for (const char* k : {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"})
    page += std::string("<span><i style=\"background:") + color_of(k) + "\"></i>" + k + "</span>";
  page += "<span><i style=\"background:#e15759;border:1px solid #900\"></i>unfinished</span></div>\n" + svg + table +
          "</body></html>\n";
  try {
    fsdp::detail::replace_file(out_path, page, /*do_fsync=*/false);
  } catch (const Error& e) {
    throw Error(fsdp::detail::cat("fsdp report: ", e.what(), " Pass -o with a writable path."));
  }
  sum.bytes = static_cast<int64_t>(page.size());
  return sum;
}

}  // namespace fsdp::flight
