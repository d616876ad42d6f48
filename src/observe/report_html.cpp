// fsdp-cpp: the report page (fsdp::report::write_html).
//
// One HTML file with its data, styles and script inline: it must open from a
// file:// URL on a machine without network (a cluster login node), so nothing
// is fetched. The script draws inline SVG from the data model of analyze();
// it computes nothing the tests cannot check in C++ except layout, and it
// reports its own success: <body data-rendered="ok"> and an empty
// #fsdp-errors when every section drew (the headless-browser test reads both).
// The page itself is src/observe/report.html, compiled in as bytes at build
// time (cmake/embed.cmake); __TITLE__ and __DATA__ are filled in here.
#include <cstddef>
#include <fstream>

#include "common/env.h"
#include "fsdp/errors.h"
#include "fsdp/trace.h"
#include "observe/html.h"

namespace fsdp::report {
namespace asset {
extern const char report_html[];  // generated: report.html's bytes
extern const std::size_t report_html_size;
}  // namespace asset

namespace {

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + with.size())) s.replace(p, what.size(), with);
}

}  // namespace

int64_t write_html(const nlohmann::json& model, const std::string& out_path, const std::string& title) {
  // Inside <script>, "</script>" or "<!--" in a string would end the block:
  // JSON allows "<" as \u003c, so no '<' reaches the page raw.
  std::string data = model.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  replace_all(data, "<", "\\u003c");
  std::string page(asset::report_html, asset::report_html_size);
  replace_all(page, "__TITLE__", fsdp::detail::html_escape(title));
  size_t p = page.find("__DATA__");
  FSDP_CHECK(p != std::string::npos, "report template lost its data placeholder");
  page.replace(p, 8, data);
  try {
    fsdp::detail::replace_file(out_path, page, /*do_fsync=*/false);
  } catch (const Error& e) {
    throw Error(fsdp::detail::cat("report: ", e.what(), " Pass -o with a writable path."));
  }
  return static_cast<int64_t>(page.size());
}

}  // namespace fsdp::report
