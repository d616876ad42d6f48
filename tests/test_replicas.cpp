// fsdp-cpp tests: replica groups that come and go (fsdp/replicas.h) — real
// processes: `fsdp coordinator` and one `fsdp run -n 2` per group, each
// rank running tests/workers/replica_scenarios.cpp. Every run is checked
// against a reference that replays, in this process, the participation
// schedule the groups printed (which groups took part in which committed
// step), to fp32 rounding; every replica must end with the same weights,
// bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core_model.h"
#include "fsdp/trace.h"
#include "replica_batch.h"
#include "replicas/protocol.h"
#include "test_util.h"

namespace fsdp::testing {
namespace FSDP_TEST_ID {

using json = nlohmann::json;

constexpr int kRanks = 2;  // per group

// A process whose output goes to a file (the coordinator: it runs until
// told to stop).
struct Background {
  pid_t pid = -1;
  std::string out;
  Background(const std::vector<std::string>& argv, std::string file) : out(std::move(file)) {
    pid = fork();
    if (pid == 0) {
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      exec_or_exit(argv);
    }
  }
  // SIGTERM, then its output.
  std::string stop(int sig = SIGTERM) {
    if (pid > 0) {
      kill(pid, sig);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
    return slurp(out);
  }
  ~Background() { stop(SIGKILL); }
};

struct Job {
  std::string dir;
  int port = free_port();
  double heartbeat_s;
  int min_groups;
  int lives = 0;
  std::unique_ptr<Background> coordinator;

  explicit Job(const std::string& tag, double heartbeat = 2.0, int min = 3)
      : dir(temp_dir(tag)), heartbeat_s(heartbeat), min_groups(min) {
    start_coordinator();
  }
  // A coordinator on the job's port (again: the previous one stopped), its
  // output in coordinator.log (then coordinator-2.log, ...).
  void start_coordinator(const std::vector<std::string>& env = {}) {
    ++lives;
    std::vector<std::string> argv{bin_path("fsdp"), "coordinator", "--port", std::to_string(port),
                                  "--heartbeat-timeout", std::to_string(heartbeat_s), "--min-groups",
                                  std::to_string(min_groups)};
    if (!env.empty()) argv.insert(argv.begin(), env.begin(), env.end()), argv.insert(argv.begin(), "/usr/bin/env");
    coordinator = std::make_unique<Background>(
        argv, dir + (lives == 1 ? "/coordinator.log" : "/coordinator-" + std::to_string(lives) + ".log"));
  }
  std::vector<std::string> env(int group, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> e{"FSDP_COORDINATOR=127.0.0.1:" + std::to_string(port),
                               "FSDP_REPLICA_GROUP=" + std::to_string(group), "FSDP_TIMEOUT=20",
                               "FSDP_PROGRESS=off"};
    e.insert(e.end(), extra.begin(), extra.end());
    return e;
  }
  static std::vector<std::string> group_argv(int64_t steps, const std::vector<std::string>& worker_args = {},
                                             int restarts = 1, int ranks = kRanks) {
    std::vector<std::string> v{bin_path("fsdp"), "run", "-n", std::to_string(ranks), "--max-restarts",
                               std::to_string(restarts), "--",
                               bin_path("fsdp_test_worker"), "replica_train", std::to_string(steps)};
    v.insert(v.end(), worker_args.begin(), worker_args.end());
    return v;
  }
};

struct StepLine {
  int group = -1, rank = -1;
  int64_t step = -1, q = -1;
  std::string members;
  bool commit = false, healed = false;
};

std::vector<StepLine> steps_in(const std::string& out) {
  std::vector<StepLine> v;
  for (const auto& line : lines_with(out, "STEP group=")) {
    const auto at = line.find("STEP group=");
    std::istringstream in(line.substr(at));
    std::string word;
    StepLine s;
    while (in >> word) {
      const auto eq = word.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = word.substr(0, eq), val = word.substr(eq + 1);
      if (k == "group") s.group = std::stoi(val);
      if (k == "rank") s.rank = std::stoi(val);
      if (k == "step") s.step = std::stoll(val);
      if (k == "q") s.q = std::stoll(val);
      if (k == "members") s.members = val;
      if (k == "commit") s.commit = val == "1";
      if (k == "healed") s.healed = val == "1";
    }
    v.push_back(s);
  }
  return v;
}

// name -> values, from one group's PARAM lines.
std::map<std::string, std::vector<double>> params_in(const std::string& out) {
  std::map<std::string, std::vector<double>> m;
  for (const auto& line : lines_with(out, "PARAM ")) {
    std::istringstream in(line.substr(line.find("PARAM ") + 6));
    std::string name;
    in >> name;
    double v;
    while (in >> v) m[name].push_back(v);
  }
  return m;
}

std::vector<int> parse_members(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string p;
  while (std::getline(ss, p, ',')) v.push_back(std::stoi(p));
  return v;
}

// Committed step -> the groups that took part, as every group printed it
// (they must agree); fails the test on a disagreement or a gap.
std::vector<std::vector<int>> schedule_of(const std::vector<std::string>& outs, int64_t steps) {
  std::map<int64_t, std::string> m;
  std::map<int64_t, std::string> who;  // step -> "group G rank R quorum Q: members" of every commit
  for (const auto& out : outs)
    for (const auto& s : steps_in(out)) {
      if (!s.commit) continue;
      m.emplace(s.step, s.members);
      who[s.step] += "  group " + std::to_string(s.group) + " rank " + std::to_string(s.rank) + " quorum " +
                     std::to_string(s.q) + ": " + s.members + "\n";
    }
  for (const auto& out : outs)
    for (const auto& s : steps_in(out))
      if (s.commit)
        EXPECT_EQ(m[s.step], s.members) << "step " << s.step << " committed with two memberships:\n" << who[s.step];
  std::vector<std::vector<int>> v;
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_TRUE(m.count(i)) << "step " << i << " was never committed";
    v.push_back(m.count(i) ? parse_members(m[i]) : std::vector<int>{});
  }
  return v;
}

// The unsharded reference: each committed step averages the gradients of
// rank r of every member group (the groups' batches), then Adam.
std::map<std::string, std::vector<double>> reference(const std::vector<std::vector<int>>& schedule, int64_t d = 12,
                                                     int ranks = kRanks) {
  torch::manual_seed(1);
  Net net(7, d, 5, 3);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
  for (size_t s = 0; s < schedule.size(); ++s) {
    opt.zero_grad();
    const double share = 1.0 / (ranks * static_cast<double>(schedule[s].size()));
    for (int g : schedule[s])
      for (int r = 0; r < ranks; ++r) {
        auto [x, y] = batch_of(static_cast<int64_t>(s), g, r);
        (torch::mse_loss(net->forward(x), y) * share).backward();
      }
    opt.step();
  }
  std::map<std::string, std::vector<double>> m;
  for (auto& p : net->named_parameters()) {
    auto f = p.value().detach().to(torch::kFloat64).reshape({-1});
    m[p.key()] = std::vector<double>(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  }
  return m;
}

void expect_near_reference(const std::map<std::string, std::vector<double>>& got,
                           const std::map<std::string, std::vector<double>>& want, const std::string& who) {
  ASSERT_EQ(got.size(), want.size()) << who << ": parameters printed";
  for (auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << who << ": no PARAM line for " << name;
    ASSERT_EQ(it->second.size(), w.size()) << who << " " << name;
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_NEAR(it->second[i], w[i], 2e-5 + 2e-5 * std::abs(w[i])) << who << " " << name << "[" << i << "]";
  }
}

// Groups 0, 1 and 2 of `res`: each ended with the weights of the reference
// that replays the schedule they printed.
void expect_groups_match_reference(const std::vector<ProcResult>& res, int64_t steps, int ranks = kRanks) {
  const auto schedule = schedule_of({res.at(0).output, res.at(1).output, res.at(2).output}, steps);
  const auto want = reference(schedule, 12, ranks);
  for (int g = 0; g < 3; ++g) expect_near_reference(params_in(res[g].output), want, "group " + std::to_string(g));
}

// Runs the groups' launchers at once (each: group id, extra env, worker
// args), returns their results in order.
std::vector<ProcResult> run_groups(const Job& job, int64_t steps, const std::vector<int>& groups,
                                   const std::vector<std::vector<std::string>>& extra_env = {},
                                   const std::vector<std::vector<std::string>>& worker_args = {},
                                   const std::vector<int>& start_after_ms = {}, int restarts = 1,
                                   int ranks = kRanks) {
  std::vector<ProcResult> res(groups.size());
  std::vector<std::thread> t;
  for (size_t i = 0; i < groups.size(); ++i)
    t.emplace_back([&, i] {
      if (i < start_after_ms.size() && start_after_ms[i] > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(start_after_ms[i]));
      res[i] = run_command(Job::group_argv(steps, i < worker_args.size() ? worker_args[i] : std::vector<std::string>{},
                                           restarts, ranks),
                           job.env(groups[i], i < extra_env.size() ? extra_env[i] : std::vector<std::string>{}),
                           180);
    });
  for (auto& x : t) x.join();
  return res;
}

// Waits (60 s at most) until the coordinator's log holds `text`; its log.
std::string wait_for_log(const Job& job, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string log;
  while ((log = slurp(job.coordinator->out)).find(text) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return log;
}

void touch(const std::string& file) { close(open(file.c_str(), O_WRONLY | O_CREAT, 0644)); }

bool restarted(const ProcResult& r) { return r.output.find("restarting all") != std::string::npos; }

// Steps of one launch: the committed step numbers of group g's rank 0,
// in order.
std::vector<int64_t> committed_steps(const std::string& out, int g) {
  std::vector<int64_t> v;
  for (auto& s : steps_in(out))
    if (s.group == g && s.rank == 0 && s.commit) v.push_back(s.step);
  return v;
}

TEST(ReplicaGroups, AKilledRankCostsAStepAndItsGroupHealsFromAPeer) {
  Job job("replicas_kill");
  const int64_t steps = 10;
  // Groups 0 and 2 hold before step 7 until group 1 is back (so that it
  // has steps left to rejoin).
  const std::string go = job.dir + "/back";
  std::vector<ProcResult> res;
  std::thread t([&] {
    const std::string trace = "FSDP_TEST_TRACE=" + job.dir + "/trace";
    res = run_groups(job, steps, {0, 1, 2},
                     {{"FSDP_TEST_HOLD=7:" + go, trace}, {"FSDP_TEST_FAULT=1:1:3:kill", trace},
                      {"FSDP_TEST_HOLD=7:" + go, trace}});
  });
  wait_for_log(job, "group 1 restarted");
  touch(go);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  // Groups 0 and 2 never restarted, read no checkpoint, and their step
  // counter ran on: every step committed once, in order.
  for (int g : {0, 2}) {
    EXPECT_FALSE(restarted(res[g])) << res[g].output;
    std::vector<int64_t> want(steps);
    for (int64_t i = 0; i < steps; ++i) want[i] = i;
    EXPECT_EQ(committed_steps(res[g].output, g), want) << res[g].output;
  }
  // Group 1 restarted once, healed before its first step, and committed it.
  ASSERT_TRUE(restarted(res[1])) << res[1].output;
  const auto after = res[1].output.substr(res[1].output.find("restarting all"));
  const auto first = steps_in(after);
  ASSERT_FALSE(first.empty()) << after;
  EXPECT_TRUE(first.front().healed) << after;
  EXPECT_TRUE(first.front().commit) << after;
  EXPECT_NE(coord.find("healing 1 from"), std::string::npos) << coord;
  // The step group 1 died in was dropped on groups 0 and 2 (nobody applied
  // it), and the coordinator says which group's rank went missing.
  for (int g : {0, 2}) {
    bool dropped3 = false;
    for (auto& s : steps_in(res[g].output)) dropped3 |= s.step == 3 && !s.commit;
    EXPECT_TRUE(dropped3) << res[g].output;
  }
  EXPECT_NE(coord.find("dropped: no vote from "), std::string::npos) << coord;
  EXPECT_NE(coord.find("group 1 rank 1 (host "), std::string::npos) << "the drop names group 1's rank 1:\n" << coord;
  const auto schedule = schedule_of({res[0].output, res[1].output, res[2].output}, steps);
  const auto want = reference(schedule);
  const auto p0 = params_in(res[0].output);
  for (int g = 0; g < 3; ++g) {
    const auto p = params_in(res[g].output);
    EXPECT_EQ(p, p0) << "group " << g << " ended with other weights than group 0";
    expect_near_reference(p, want, "group " + std::to_string(g));
  }
  // The report of the groups' traces (fsdp report DIR): every quorum, who
  // took part in it, and group 1's heal with its duration.
  const json m = report::analyze(job.dir + "/trace");
  ASSERT_TRUE(m.contains("replicas")) << m["warnings"].dump();
  const json& rep = m["replicas"];
  ASSERT_EQ(rep["groups"].size(), 3u) << rep.dump();
  std::map<int, json> by_group;
  for (const auto& g : rep["groups"]) by_group[g["group"].get<int>()] = g;
  for (int g : {0, 2}) {
    EXPECT_EQ(by_group[g]["committed"], steps) << rep.dump();
    EXPECT_EQ(by_group[g]["absent"], 0) << rep.dump();
  }
  // Every group took part in the step that was dropped; group 1 in the
  // steps its two launches printed (its first launch wrote no trace: the
  // others' quorums name it).
  for (int g = 0; g < 3; ++g) {
    EXPECT_GE(by_group[g]["dropped"].get<int>(), 1) << "step 3 was dropped: " << rep.dump();
    const json& row = by_group[g];
    EXPECT_EQ(row["committed"].get<int>() + row["dropped"].get<int>() + row["absent"].get<int>(),
              static_cast<int>(rep["quorums"].size()))
        << rep.dump();
  }
  EXPECT_EQ(by_group[1]["committed"].get<size_t>(), committed_steps(res[1].output, 1).size()) << rep.dump();
  EXPECT_TRUE(by_group[1]["traced"].get<bool>()) << "the restarted launch wrote its trace";
  int64_t committed = 0;
  for (const auto& q : rep["quorums"]) committed += q["committed"].get<bool>();
  EXPECT_EQ(committed, steps) << rep.dump();
  // (The first quorum also copies group 0's initial state to the others:
  // heals before step 0.)
  std::vector<json> rejoin;
  for (const auto& h : rep["heals"])
    if (h["step"].get<int64_t>() > 0) rejoin.push_back(h);
  ASSERT_EQ(rejoin.size(), 1u) << rep.dump();
  const json& heal = rejoin[0];
  EXPECT_EQ(heal["group"], 1);
  EXPECT_EQ(heal["step"], first.front().step);
  // Shard r from source r mod #sources: groups 0 and 2 both held step k.
  for (const auto& src : heal["sources"]) EXPECT_TRUE(src == 0 || src == 2) << heal.dump();
  EXPECT_FALSE(heal["sources"].empty()) << heal.dump();
  EXPECT_EQ(heal["ranks"], kRanks) << heal.dump();
  EXPECT_GT(heal["dur"].get<double>(), 0) << heal.dump();
  EXPECT_GT(heal["bytes"].get<double>(), 0) << heal.dump();
}

// Over TCP (FSDP_TRANSPORT=tcp), as between hosts: the other tests' groups
// share this host and move bytes by cross-memory attach.
TEST(ReplicaGroups, TwoGroupsLostAtOnceCostTheThirdOneStep) {
  Job job("replicas_two");
  const int64_t steps = 8;
  // Group 0 holds before step 6 until both came back.
  const std::string go = job.dir + "/back";
  std::vector<ProcResult> res;
  std::thread t([&] {
    res = run_groups(job, steps, {0, 1, 2},
                     {{"FSDP_TEST_HOLD=6:" + go, "FSDP_TRANSPORT=tcp"},
                      {"FSDP_TEST_FAULT=1:0:3:kill", "FSDP_TRANSPORT=tcp"},
                      {"FSDP_TEST_FAULT=2:1:3:kill", "FSDP_TRANSPORT=tcp"}});
  });
  wait_for_log(job, "group 1 restarted");
  wait_for_log(job, "group 2 restarted");
  touch(go);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  EXPECT_FALSE(restarted(res[0])) << res[0].output;
  EXPECT_TRUE(restarted(res[1]) && restarted(res[2])) << coord;
  std::vector<int64_t> want(steps);
  for (int64_t i = 0; i < steps; ++i) want[i] = i;
  EXPECT_EQ(committed_steps(res[0].output, 0), want) << res[0].output;
  bool dropped3 = false;
  for (auto& s : steps_in(res[0].output)) dropped3 |= s.step == 3 && !s.commit;
  EXPECT_TRUE(dropped3) << res[0].output << coord;
  expect_groups_match_reference(res, steps);
}

// Groups 0, 1 and 2 train 8 steps; `fault` (FSDP_TEST_FAULT) kills a rank of
// group 1 at step 4, and groups 0 and 2 hold before step 6 until group 1 was
// relaunched. The step it died in is dropped on groups 0 and 2, then taken
// again, and every group ends on the reference.
void expect_a_kill_at_step_4_drops_it_everywhere(const std::string& name, const std::string& fault) {
  Job job(name);
  const int64_t steps = 8;
  const std::string go = job.dir + "/back";
  std::vector<ProcResult> res;
  std::thread t([&] {
    res = run_groups(job, steps, {0, 1, 2}, {{"FSDP_TEST_HOLD=6:" + go}, {"FSDP_TEST_FAULT=" + fault},
                                             {"FSDP_TEST_HOLD=6:" + go}});
  });
  wait_for_log(job, "group 1 restarted");
  touch(go);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  for (int g : {0, 2}) {
    bool dropped4 = false;
    for (auto& s : steps_in(res[g].output)) dropped4 |= s.step == 4 && !s.commit && s.members == "0,1,2";
    EXPECT_TRUE(dropped4) << res[g].output << coord;
  }
  EXPECT_NE(coord.find("dropped"), std::string::npos) << coord;
  expect_groups_match_reference(res, steps);
}

TEST(ReplicaGroups, AFailureDuringTheReduceDropsTheStepOnEveryGroup) {
  expect_a_kill_at_step_4_drops_it_everywhere("replicas_reduce", "1:0:4:kill_reduce");
}

// The mean across groups runs unit by unit inside backward: a rank killed
// there leaves its peers' means half done, and the step is dropped on every
// group all the same (nothing of it applied anywhere).
TEST(ReplicaGroups, ARankKilledWhileTheMeansRunInBackwardDropsTheStepOnEveryGroup) {
  expect_a_kill_at_step_4_drops_it_everywhere("replicas_backward", "1:1:4:kill_backward");
}

TEST(ReplicaGroups, AFrozenGroupIsDroppedNamedAndHealsWhenItThaws) {
  Job job("replicas_stop", 1.0);
  const int64_t steps = 10;
  const std::string go = job.dir + "/thawed";
  // Groups 0 and 2 hold before step 8 until group 1 thawed; group 1's rank
  // 1 stops itself at step 3, and the test wakes it once the coordinator
  // dropped its group.
  std::vector<ProcResult> res;
  std::thread t([&] {
    res = run_groups(job, steps, {0, 1, 2},
                     {{"FSDP_TEST_HOLD=8:" + go}, {"FSDP_TEST_FAULT=1:1:3:stop_reduce"}, {"FSDP_TEST_HOLD=8:" + go}});
  });
  std::string log = wait_for_log(job, "group 1 lost: rank 1 (host ");
  const auto at = log.find("group 1 lost: rank 1 (host ");
  ASSERT_NE(at, std::string::npos) << log;
  const auto pid_at = log.find("pid ", at);
  const pid_t frozen = static_cast<pid_t>(std::stol(log.substr(pid_at + 4)));
  wait_for_log(job, "quorum 4: step 3, groups 0,2");  // the survivors went on without it
  kill(frozen, SIGCONT);
  wait_for_log(job, "group 1 is back");
  touch(go);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  EXPECT_NE(coord.find("group 1 is back"), std::string::npos) << coord;
  // The survivors' logs name the frozen rank and its host, as the coordinator's does.
  for (int g : {0, 2}) {
    const auto drops = lines_with(res[g].output, "DROPPED group=");
    ASSERT_FALSE(drops.empty()) << res[g].output;
    bool named = false;
    for (const auto& d : drops)
      named |= d.find("group 1 was lost during the step: rank 1 (host ") != std::string::npos ||
               d.find("group 1 rank 1 (host ") != std::string::npos;
    EXPECT_TRUE(named) << res[g].output;
  }
  for (auto& r : res) EXPECT_FALSE(restarted(r)) << r.output;
  bool healed = false;
  for (auto& s : steps_in(res[1].output)) healed |= s.healed && s.commit;
  EXPECT_TRUE(healed) << res[1].output << coord;
  expect_groups_match_reference(res, steps);
}

TEST(ReplicaGroups, AGroupThatWasNeverThereJoinsAndOneWithAnotherModelIsRefused) {
  Job job("replicas_grow", 2.0, 2);
  const int64_t steps = 8;
  const std::string go = job.dir + "/joined";
  // Groups 0 and 1 start and hold before step 4 until group 2 (the same
  // model) joined and group 3 (width 10) was refused.
  std::vector<ProcResult> first, second;
  std::thread t([&] {
    first = run_groups(job, steps, {0, 1}, {{"FSDP_TEST_HOLD=4:" + go}, {"FSDP_TEST_HOLD=4:" + go}});
  });
  wait_for_log(job, "quorum 0:");
  std::thread late([&] { second = run_groups(job, steps, {2, 3}, {}, {{}, {"FULL_SHARD", "10"}}); });
  wait_for_log(job, "group 2 joined");
  wait_for_log(job, "group 3 joined");
  touch(go);
  late.join();
  t.join();
  const std::vector<ProcResult> res{first.at(0), first.at(1), second.at(0), second.at(1)};
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  EXPECT_NE(res[3].exit_code, 0) << res[3].output;
  EXPECT_NE(res[3].output.find("replica group 3 was refused by the coordinator"), std::string::npos) << res[3].output;
  EXPECT_NE(res[3].output.find("model: "), std::string::npos) << res[3].output;
  EXPECT_NE(coord.find("group 3 joined: 2 ranks (FULL_SHARD, params fp32); refused: model: "), std::string::npos)
      << coord;
  bool healed = false;
  for (auto& s : steps_in(res[2].output)) healed |= s.healed;
  EXPECT_TRUE(healed) << res[2].output;
  expect_groups_match_reference(res, steps);
}

TEST(ReplicaGroups, AFreshGroupIsRefusedOnceNoGroupHoldsTheJobsState) {
  Job job("replicas_gone", 2.0, 1);
  auto first = run_groups(job, 3, {0});
  ASSERT_EQ(first[0].exit_code, 0) << first[0].output;
  // Group 0 trained 3 steps and left: a fresh group has nobody to heal from.
  auto late = run_groups(job, 3, {1}, {}, {}, {}, /*restarts=*/0);
  const std::string coord = job.coordinator->stop();
  EXPECT_NE(late[0].exit_code, 0) << late[0].output;
  EXPECT_NE(late[0].output.find("this job committed 3 steps, and no live group holds them"), std::string::npos)
      << late[0].output << coord;
}

// A coordinator that never comes back (FSDP_COORDINATOR_TIMEOUT passes):
// every rank stops with one message. (One that comes back: the next test.)
TEST(ReplicaGroups, ACoordinatorGoneForGoodStopsEveryGroupWithOneMessage) {
  Job job("replicas_coord", 1.0, 2);
  std::vector<ProcResult> res;
  std::thread t([&] {
    res = run_groups(job, 100000, {0, 1}, {{"FSDP_COORDINATOR_TIMEOUT=2"}, {"FSDP_COORDINATOR_TIMEOUT=2"}}, {}, {},
                     /*restarts=*/0);
  });
  // Once both groups committed a step, the coordinator dies.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (slurp(job.coordinator->out).find("quorum 0:") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string coord = job.coordinator->stop(SIGKILL);
  t.join();
  ASSERT_NE(coord.find("quorum 0:"), std::string::npos) << coord;
  for (auto& r : res) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("stopped answering for 2 s"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("within FSDP_COORDINATOR_TIMEOUT"), std::string::npos) << r.output;
  }
}

// The hole of a lone group: restarted by its launcher faster than the
// heartbeat timeout, the coordinator used to wait for votes the new launch
// would never cast, and the group hung. Now the launch change drops the
// step at once, and the new launch, which holds nothing of the job's state,
// is refused with one message instead of waiting forever.
TEST(ReplicaGroups, ALoneGroupRestartedFasterThanTheHeartbeatTimeoutIsToldAtOnce) {
  Job job("replicas_lone", 5.0, 1);
  const auto res = run_groups(job, 10, {0}, {{"FSDP_TEST_FAULT=0:1:4:kill_reduce"}}, {}, {}, /*restarts=*/1);
  const std::string coord = job.coordinator->stop();
  ASSERT_TRUE(restarted(res[0])) << res[0].output;
  EXPECT_NE(coord.find("dropped: group 0 restarted during the step"), std::string::npos) << coord;
  EXPECT_NE(res[0].exit_code, 0) << res[0].output;
  EXPECT_NE(res[0].output.find("this job committed 4 steps, and no live group holds them"), std::string::npos)
      << res[0].output << coord;
  // It ended by itself, well before run_groups' 180 s bound would have ended it.
  EXPECT_LT(res[0].seconds, 90) << res[0].output << coord;
}

// A heal interrupted half way: group 1 comes back and heals (at step 5 or
// later), shard 0 from group 0 and shard 1 from group 2; group 0's rank 0
// dies after the header crossed and before the tensors did. Group 1's rank 1
// got its whole shard, rank 0 did not: neither installs (the group agrees
// first), both vote the failure, nobody waits in forward, and the next
// quorum heals group 1 again from group 2. Groups 1 and 2 never restart
// again, and every group ends equal to the reference.
TEST(ReplicaGroups, AHealInterruptedHalfWayLeavesNoRankWaitingAndNothingTorn) {
  Job job("replicas_heal_kill");
  const int64_t steps = 12;
  const std::string back = job.dir + "/back", back0 = job.dir + "/back0";
  std::vector<ProcResult> res;
  std::thread t([&] {
    // Groups 0 and 2 hold before step 5 until group 1 is back, and group
    // 1's second launch registers only once they hold there (however fast
    // it restarts, its heal is at step 5, where group 0's rank 0 dies
    // lending); groups 1 and 2 hold before step 10 until group 0 is back
    // from its own kill (so that it has steps left to rejoin).
    res = run_groups(job, steps, {0, 1, 2},
                     {{"FSDP_TEST_HOLD=5:" + back, "FSDP_TEST_FAULT=0:0:5:kill_lend"},
                      {"FSDP_TEST_FAULT=1:1:3:kill", "FSDP_TEST_HOLD=10:" + back0,
                       "FSDP_TEST_HOLD_RELAUNCH=" + back + ".held"},
                      {"FSDP_TEST_HOLD=5:" + back, "FSDP_TEST_HOLD2=10:" + back0}});
  });
  wait_for_log(job, "group 1 restarted");
  touch(back);
  wait_for_log(job, "group 0 restarted");
  touch(back0);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  EXPECT_NE(coord.find("healing 1 from 0,2"), std::string::npos) << coord;
  // Group 0 lost its rank 0 in the heal and restarted; group 1 restarted
  // once (its own kill), never again; group 2 never.
  EXPECT_TRUE(restarted(res[0])) << res[0].output;
  const auto count = [](const std::string& out, const std::string& what) {
    size_t n = 0;
    for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(res[1].output, "restarting all"), 1u) << res[1].output;
  EXPECT_FALSE(restarted(res[2])) << res[2].output;
  // The interrupted heal was voted down (the drop names the first failed
  // vote, group 1's rank 0; its rank 1, whose copy had arrived, voted the
  // failure with it: group 1's second launch never restarted).
  EXPECT_NE(coord.find("group 1 rank 0 failed: healing from a peer failed"), std::string::npos) << coord;
  expect_groups_match_reference(res, steps);
}

// The coordinator killed under a running job and started again on the
// same address: the ranks wait for it, tell it where they stand, and go
// on. No group restarts, no step is applied twice or lost (every group's
// committed steps run 0, 1, ... once each), and every group ends equal to
// the reference.
TEST(ReplicaGroups, TheCoordinatorRestartedUnderTheJobCostsNoGroupARestart) {
  Job job("replicas_coord_restart", 2.0, 3);
  const int64_t steps = 40;
  const std::string go = job.dir + "/restarted";
  std::vector<ProcResult> res;
  std::thread t([&] {
    // Each group holds before step 30 until the new coordinator is up (the
    // old one dies wherever the groups are then: mid-step, mid-vote).
    res = run_groups(job, steps, {0, 1, 2},
                     {{"FSDP_TEST_HOLD=30:" + go}, {"FSDP_TEST_HOLD=30:" + go}, {"FSDP_TEST_HOLD=30:" + go}});
  });
  wait_for_log(job, "quorum 0:");
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const std::string first = job.coordinator->stop(SIGKILL);
  job.start_coordinator();
  touch(go);
  t.join();
  const std::string second = job.coordinator->stop();
  for (int g = 0; g < 3; ++g)
    ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << first << second;
  for (int g = 0; g < 3; ++g) {
    EXPECT_FALSE(restarted(res[g])) << res[g].output;
    std::vector<int64_t> want(steps);
    for (int64_t i = 0; i < steps; ++i) want[i] = i;
    EXPECT_EQ(committed_steps(res[g].output, g), want) << res[g].output;
    EXPECT_NE(res[g].output.find("coordinator_restarts=1"), std::string::npos) << res[g].output;
  }
  EXPECT_NE(second.find("recovered the job's state from its ranks"), std::string::npos) << second;
  expect_groups_match_reference(res, steps);
}

// What the coordinator cannot parse, it logs once and ignores: registrations
// that are not JSON or name a group of another size, a mailbox of another
// protocol version, a heartbeat of the wrong type. The job goes on.
TEST(ReplicaGroups, JunkInTheCoordinatorsStoreIsLoggedAndTheJobGoesOn) {
  Job job("replicas_junk", 2.0, 2);
  const int64_t steps = 6;
  const std::string go = job.dir + "/junk";
  std::vector<ProcResult> res;
  std::thread t([&] {
    res = run_groups(job, steps, {0, 1}, {{"FSDP_TEST_HOLD=3:" + go}, {"FSDP_TEST_HOLD=3:" + go}});
  });
  wait_for_log(job, "quorum 0:");
  {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(job.port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = std::chrono::seconds(10);
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    auto bytes = [](const std::string& t) { return std::vector<uint8_t>(t.begin(), t.end()); };
    // Registrations live under the coordinator's era (its settings' epoch).
    const auto cfg = store->get("fsdp-ft/cfg");
    std::string bad;
    const auto settings = replicas::parse_settings(std::string(cfg.begin(), cfg.end()), &bad);
    EXPECT_TRUE(settings) << bad;  // (no ASSERT: the groups' thread must be joined)
    const std::string era = std::to_string(settings ? replicas::era_of(settings->epoch) : 0);
    const std::string reg = "fsdp-ft/reg/" + era + "/";
    const int64_t n = store->add("fsdp-ft/nreg/" + era, 3);
    store->set(reg + std::to_string(n - 3), bytes("{not json"));
    store->set(reg + std::to_string(n - 2),
               bytes(R"({"group":7,"rank":0,"inc":1,"size":1,"host":"x","pid":1,"model":"m","sharding":"s"})"));
    // reg n-1 stays a hole: counted, never written.
    store->set("fsdp-ft/mb/7/1/0", bytes(R"({"v":99,"seq":1,"kind":"vote"})"));
    store->set("fsdp-ft/hb/7/1/0", bytes(R"({"inc":1,"n":"seven"})"));
    store->set("fsdp-ft/bell", bytes(""));
  }
  wait_for_log(job, "ignored fsdp-ft/mb/7/1/0");
  touch(go);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 2; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  EXPECT_NE(coord.find("registration: not JSON"), std::string::npos) << coord;
  EXPECT_NE(coord.find("message: of protocol 99, expected 2"), std::string::npos) << coord;
  EXPECT_NE(coord.find("heartbeat: field 'n': expected an integer"), std::string::npos) << coord;
  for (int g = 0; g < 2; ++g) EXPECT_EQ(committed_steps(res[g].output, g).size(), static_cast<size_t>(steps));
}

// With FSDP_JOB_TOKEN the coordinator's keys live under the token; a group
// started with another token is told whose coordinator it reached.
TEST(ReplicaGroups, AGroupWithAnotherJobTokenIsToldTheCoordinatorIsAnotherJobs) {
  Job job("replicas_token", 2.0, 1);
  job.coordinator->stop();
  const std::string token = "FSDP_JOB_TOKEN=replica-test-token-0001";
  job.start_coordinator({token});
  const auto ok = run_groups(job, 3, {0}, {{token}});
  const auto other = run_groups(job, 3, {1}, {{"FSDP_JOB_TOKEN=replica-test-token-0002"}}, {}, {}, /*restarts=*/0);
  const std::string coord = job.coordinator->stop();
  EXPECT_EQ(ok[0].exit_code, 0) << ok[0].output << coord;
  EXPECT_NE(coord.find("keys under the job token"), std::string::npos) << coord;
  EXPECT_NE(other[0].exit_code, 0) << other[0].output;
  EXPECT_NE(other[0].output.find("belongs to another job: its FSDP_JOB_TOKEN fingerprint is"), std::string::npos)
      << other[0].output;
}

// Chaos: three groups of two ranks over 300 steps, and a fault every ~20
// steps drawn from a seed (FSDP_TEST_CHAOS_SEED, default 1): a rank killed,
// a whole group killed, a rank stopped past the heartbeat timeout and
// continued, a source killed as a heal starts, the coordinator killed and
// started again at once. Every group finishes; a group no fault touched
// never restarts; every group ends with the same weights, equal to a
// reference that replays the committed schedule.
TEST(ReplicaGroups, ChaosOfThreeGroupsOverThreeHundredSteps) {
  Job job("replicas_chaos", 1.0, 3);
  const int64_t steps = 300;
  const char* seed_env = std::getenv("FSDP_TEST_CHAOS_SEED");
  std::mt19937 rng(seed_env ? static_cast<unsigned>(std::atoi(seed_env)) : 1u);
  auto pick = [&](int n) { return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng)); };
  std::vector<std::unique_ptr<Background>> groups;
  auto outputs = [&] {
    std::vector<std::string> v;
    for (auto& g : groups) v.push_back(slurp(g->out));
    return v;
  };
  for (int g = 0; g < 3; ++g) {
    std::vector<std::string> argv{"/usr/bin/env"};
    for (const auto& e : job.env(g)) argv.push_back(e);
    for (const auto& a : Job::group_argv(steps, {}, /*restarts=*/40)) argv.push_back(a);
    groups.push_back(std::make_unique<Background>(argv, job.dir + "/group" + std::to_string(g) + ".log"));
  }
  // The pid of group g's rank r in its latest launch (its LAUNCH line).
  auto pid_of = [&](int g, int r) -> pid_t {
    pid_t pid = -1;
    for (const auto& line : lines_with(slurp(groups[g]->out), "LAUNCH group=" + std::to_string(g) + " rank=" +
                                                                   std::to_string(r) + " pid="))
      pid = static_cast<pid_t>(std::stol(line.substr(line.find("pid=") + 4)));
    return pid;
  };
  auto progress = [&] {
    int64_t most = -1;
    const auto outs = outputs();
    for (int g = 0; g < 3; ++g)
      for (const auto& st : steps_in(outs[g]))
        if (st.commit) most = std::max(most, st.step);
    return most;
  };
  std::vector<int> exit_status(3, -1);  // once reaped
  auto all_done = [&] {
    bool done = true;
    for (int g = 0; g < 3; ++g) {
      if (exit_status[g] >= 0) continue;
      int status = 0;
      if (waitpid(groups[g]->pid, &status, WNOHANG) == groups[g]->pid) {
        exit_status[g] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        groups[g]->pid = -1;
      } else {
        done = false;
      }
    }
    return done;
  };
  std::set<int> hit;
  std::vector<std::string> faults;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(6);
  for (int64_t next = 20; next < steps - 20; next += 15 + pick(11)) {
    while (progress() < next && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int what = pick(5), g = pick(3), r = pick(kRanks);
    const pid_t pid = pid_of(g, r);
    if (what == 0 && pid > 0) {
      kill(pid, SIGKILL);
      hit.insert(g);
      faults.push_back("step " + std::to_string(next) + ": killed group " + std::to_string(g) + " rank " +
                       std::to_string(r));
    } else if (what == 1) {
      for (int k = 0; k < kRanks; ++k)
        if (pid_of(g, k) > 0) kill(pid_of(g, k), SIGKILL);
      hit.insert(g);
      faults.push_back("step " + std::to_string(next) + ": killed group " + std::to_string(g) + " (its host lost)");
    } else if (what == 2 && pid > 0) {
      kill(pid, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      kill(pid, SIGCONT);
      hit.insert(g);
      faults.push_back("step " + std::to_string(next) + ": stopped group " + std::to_string(g) + " rank " +
                       std::to_string(r) + " for 1.5 s");
    } else if (what == 3 && pid > 0) {
      // Kill a group; once the coordinator logs its heal, kill rank r of a source.
      // "quorum N: step S, groups 0,1,2; healing 1,2 from 0": the heals of group g.
      auto heals_of = [g](const std::string& log) {
        std::vector<std::string> v;
        for (const auto& line : lines_with(log, "; healing ")) {
          const auto at = line.find("; healing ") + 10, from = line.find(" from ", at);
          if (from == std::string::npos) continue;
          const auto healing = parse_members(line.substr(at, from - at));
          if (std::find(healing.begin(), healing.end(), g) != healing.end()) v.push_back(line.substr(from + 6));
        }
        return v;
      };
      const size_t before = heals_of(slurp(job.coordinator->out)).size();
      kill(pid, SIGKILL);
      hit.insert(g);
      std::vector<std::string> now;
      while ((now = heals_of(slurp(job.coordinator->out))).size() <= before && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (now.size() <= before) continue;
      const int source = now.back()[0] - '0';
      const pid_t src = pid_of(source, r);
      if (src > 0) kill(src, SIGKILL);
      hit.insert(source);
      faults.push_back("step " + std::to_string(next) + ": killed group " + std::to_string(g) + ", then group " +
                       std::to_string(source) + " rank " + std::to_string(r) + " as it started to heal it");
    } else if (what == 4) {
      job.coordinator->stop(SIGKILL);
      job.start_coordinator();
      faults.push_back("step " + std::to_string(next) + ": the coordinator killed and started again");
    }
  }
  while (!all_done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<ProcResult> res(3);
  for (int g = 0; g < 3; ++g) {
    res[g].exit_code = exit_status[g];  // -1: still running at the deadline (the Background stops it)
    res[g].output = slurp(groups[g]->out);
  }
  std::string coord;
  for (int life = 1; life <= job.lives; ++life)
    coord += slurp(job.dir + (life == 1 ? "/coordinator.log" : "/coordinator-" + std::to_string(life) + ".log"));
  job.coordinator->stop();
  std::string story;
  for (const auto& f : faults) story += f + "\n";
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << story << coord;
  for (int g = 0; g < 3; ++g)
    if (!hit.count(g)) EXPECT_FALSE(restarted(res[g])) << "group " << g << " was not hit:\n" << story << res[g].output;
  expect_groups_match_reference(res, steps);
  int64_t pairs = 0;
  for (const auto& members : schedule_of({res[0].output, res[1].output, res[2].output}, steps)) pairs += members.size();
  std::printf("chaos: %zu faults; (group, step) pairs committed: %lld of %lld\n%s", faults.size(),
              static_cast<long long>(pairs), static_cast<long long>(3 * steps), story.c_str());
}

// DDP-like replication: groups of one rank under NO_SHARD. A killed group
// costs the others one step; its launcher restarts it and it heals.
TEST(ReplicaGroups, GroupsOfOneRankReplicateLikeDdp) {
  Job job("replicas_ddp");
  const int64_t steps = 8;
  const std::string go = job.dir + "/back";
  std::vector<ProcResult> res;
  std::thread t([&] {
    res = run_groups(job, steps, {0, 1, 2},
                     {{"FSDP_TEST_HOLD=6:" + go}, {"FSDP_TEST_FAULT=1:0:2:kill_reduce"}, {"FSDP_TEST_HOLD=6:" + go}},
                     {{"NO_SHARD"}, {"NO_SHARD"}, {"NO_SHARD"}}, {}, 1, /*ranks=*/1);
  });
  wait_for_log(job, "group 1 restarted");
  touch(go);
  t.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 3; ++g) ASSERT_EQ(res[g].exit_code, 0) << "group " << g << ":\n" << res[g].output << coord;
  EXPECT_NE(coord.find("group 0 joined: 1 rank (NO_SHARD, params fp32)"), std::string::npos) << coord;
  ASSERT_TRUE(restarted(res[1])) << res[1].output;
  bool healed = false;
  for (auto& s : steps_in(res[1].output.substr(res[1].output.find("restarting all")))) healed |= s.healed && s.commit;
  EXPECT_TRUE(healed) << res[1].output << coord;
  const auto p0 = params_in(res[0].output);
  for (int g = 1; g < 3; ++g) EXPECT_EQ(params_in(res[g].output), p0) << "group " << g;
  expect_groups_match_reference(res, steps, 1);
}

// A group that joins part-way through (it heals at step k) counts the steps
// it trained, not the job's: its tokens/s and its traffic per step come
// from the steps it applied (each printed with --log-every 1).
TEST(ReplicaGroups, TheGptExampleCountsTheStepsOfAGroupThatJoinedPartWay) {
  Job job("replicas_gpt_late", 5.0, 1);
  auto gpt_argv = [&](int g) {
    std::vector<std::string> argv{"/usr/bin/env"};
    for (const auto& e : job.env(g)) argv.push_back(e);
    for (const std::string& a : {bin_path("fsdp"), std::string("run"), std::string("-n"), std::string("2"),
                                 std::string("--"), bin_path("gpt"), std::string("--text"), source_path("docs/GUIDE.md"),
                                 std::string("--dim"), std::string("32"), std::string("--layers"), std::string("1"),
                                 std::string("--heads"), std::string("2"), std::string("--seq"), std::string("16"),
                                 std::string("--batch"), std::string("2"), std::string("--steps"), std::string("300"),
                                 std::string("--log-every"), std::string("1"), std::string("--replicas"),
                                 std::string("2"), std::string("--eval-every"), std::string("0")})
      argv.push_back(a);
    return argv;
  };
  Background g0(gpt_argv(0), job.dir + "/g0.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (slurp(g0.out).find("step     5 | quorum") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto late = run_command(gpt_argv(1), {}, 180);
  const std::string out0 = g0.stop(0);  // already finished
  const std::string coord = job.coordinator->stop();
  ASSERT_EQ(late.exit_code, 0) << late.output << coord;
  const auto healed = lines_with(late.output, "replica group 1 healed from group 0 at step ");
  ASSERT_EQ(healed.size(), 1u) << late.output;
  const int64_t k = std::stoll(healed[0].substr(healed[0].find(" at step ") + 9));
  EXPECT_GE(k, 5) << late.output;
  const size_t committed = lines_with(late.output, "committed").size();
  const auto trained = lines_with(late.output, "trained ");
  ASSERT_EQ(trained.size(), 1u) << late.output;
  EXPECT_NE(trained[0].find("trained " + std::to_string(300 - k) + " steps in"), std::string::npos)
      << trained[0] << "\n(healed at step " << k << ")";
  EXPECT_EQ(committed, static_cast<size_t>(300 - k)) << late.output;
}

// The GPT example as two replica groups (gpt --replicas 2, one `fsdp run`
// each) with --trace DIR: each group's ranks trace into DIR/group<g>, and
// `fsdp report DIR` draws both groups' participation.
TEST(ReplicaGroups, TheGptExampleTracesEachGroupAndTheReportDrawsThem) {
  Job job("replicas_gpt", 5.0, 2);
  const std::string trace = job.dir + "/trace";
  std::vector<ProcResult> res(2);
  std::vector<std::thread> t;
  for (int g = 0; g < 2; ++g)
    t.emplace_back([&, g] {
      res[g] = run_command({bin_path("fsdp"), "run", "-n", "2", "--", bin_path("gpt"), "--text",
                            source_path("docs/GUIDE.md"), "--dim", "32", "--layers", "1", "--heads", "2", "--seq", "16",
                            "--batch", "2", "--steps", "4", "--replicas", "2", "--trace", trace},
                           job.env(g), 180);
    });
  for (auto& x : t) x.join();
  const std::string coord = job.coordinator->stop();
  for (int g = 0; g < 2; ++g) {
    ASSERT_EQ(res[g].exit_code, 0) << res[g].output << coord;
    EXPECT_NE(res[g].output.find("quorum 0: groups 0,1 committed"), std::string::npos) << res[g].output;
    EXPECT_NE(res[g].output.find("trace: " + trace + "/group" + std::to_string(g) + "/trace.json"), std::string::npos)
        << res[g].output;
  }
  auto r = run_command({bin_path("fsdp"), "report", trace, "-o", job.dir + "/report.html"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("replica groups: 4 quorum(s), 2 group(s)"), std::string::npos) << r.output;
  const json m = report::analyze(trace);
  ASSERT_TRUE(m.contains("replicas"));
  for (const auto& g : m["replicas"]["groups"]) EXPECT_EQ(g["committed"], 4) << m["replicas"].dump();
}

}  // namespace FSDP_TEST_ID

}  // namespace fsdp::testing
