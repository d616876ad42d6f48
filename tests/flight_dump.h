// fsdp-cpp tests: what a failed rank left in its flight dump
// (FSDP_FLIGHT_DIR/flight-rank<r>.json): the dump, and the decision it
// published (notes.verdict, src/comm/heartbeat.cpp's Verdict::to_json).
// and what `fsdp run` found (launcher-node<k>.json, launch_diagnosis.h's
// finding_json). Tests check these fields, not the words a message renders
// from them; the wording is checked once per message (test_diagnosis.cpp).
// defines: flight_dump, verdict_in, ranks_in, launcher_finding
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "test_util.h"

namespace fsdp::testing {

// Rank `rank`'s flight dump in `flight_dir`, parsed (throws when it is
// missing or not JSON, so the test fails naming it).
inline nlohmann::json flight_dump(const std::string& flight_dir, int rank) {
  const std::string path = flight_dir + "/flight-rank" + std::to_string(rank) + ".json";
  const std::string text = slurp(path);
  if (text.empty()) throw std::runtime_error("no flight dump at " + path);
  return nlohmann::json::parse(text);
}

// The verdict rank `rank` published (a missing key throws).
inline nlohmann::json verdict_in(const std::string& flight_dir, int rank) {
  return flight_dump(flight_dir, rank).at("notes").at("verdict");
}

// verdict[key] as ranks (a missing key throws).
inline std::vector<int> ranks_in(const nlohmann::json& verdict, const char* key) {
  return verdict.at(key).get<std::vector<int>>();
}

// What the launcher of node `node` found when the job failed (throws when
// it wrote nothing).
inline nlohmann::json launcher_finding(const std::string& flight_dir, int node = 0) {
  const std::string path = flight_dir + "/launcher-node" + std::to_string(node) + ".json";
  const std::string text = slurp(path);
  if (text.empty()) throw std::runtime_error("no launcher finding at " + path);
  return nlohmann::json::parse(text);
}

}  // namespace fsdp::testing
