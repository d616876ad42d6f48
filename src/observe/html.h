// fsdp-cpp: text into an HTML page (the report and the flight report).
#pragma once

#include <string>

namespace fsdp::detail {

// `s` safe inside element text and inside quoted attribute values.
inline std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

}  // namespace fsdp::detail
