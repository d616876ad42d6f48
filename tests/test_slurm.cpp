// Real Slurm: a one-host cluster of the test's own (munged, slurmctld and
// slurmd started here, as root, in a private directory with private ports, key
// and munge socket) and the commands a user types: srun, sbatch, salloc,
// mpirun inside an srun step, scancel. What this host cannot run is skipped,
// saying why.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config/cluster_env.h"
#include "test_util.h"

using fsdp::testing::bin_path;
using fsdp::testing::lines_with;
using fsdp::testing::slurp;

namespace FSDP_TEST_ID {
namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// An executable named `name` on PATH or in the system's sbin folders (the
// daemons are there, off a user's PATH); "" when none.
std::string find_program(const std::string& name) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/usr/local/sbin:/sbin";
  std::stringstream ss(dirs);
  for (std::string d; std::getline(ss, d, ':');)
    if (!d.empty() && access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return "";
}

// Waits until `done()` or the deadline, checking every 20 ms.
bool wait_until(const std::function<bool()>& done, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// A process started by the cluster helper: its pid and the file that takes
// its stdout and stderr.
struct Started {
  pid_t pid = -1;
  std::string out;
};

// Prints the lines of a command's output that tell the story.
void show(const std::string& output);

// "$ srun -n 2 tiny --save ''", as a shell would take it.
std::string command_line(const std::vector<std::string>& argv) {
  std::string shown = "$";
  for (auto& w : argv) shown += " " + (w.empty() ? std::string("''") : w);
  return shown;
}

// The exit status as a shell says it: the code, or 128 + the signal.
int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// A one-host Slurm cluster: munged, slurmctld and slurmd of this process's
// own, the node named localhost (so the store's host resolves anywhere),
// everything in one private directory; stopped by the destructor (jobs
// cancelled, daemons ended, the directory removed). The daemons get SIGTERM
// when this process ends, so a crashed test leaves none running.
class SlurmCluster {
 public:
  // The cluster, or null with `skip` (what this host lacks) or `failure`
  // (a daemon that did not come up, with its log) set.
  static std::unique_ptr<SlurmCluster> start(std::string* skip, std::string* failure);
  ~SlurmCluster();

  // A program of Slurm's (srun, sbatch, ...) or mpirun; "" when missing.
  std::string program(const std::string& name) const { return find_program(name); }
  // Where jobs run and write.
  const std::string& dir() const { return dir_; }

  // Starts `argv` in dir() with this process's environment less every
  // launcher's variables, plus the cluster's SLURM_CONF, Open MPI's consent
  // to run as root, TMPDIR=dir() (Open MPI's session files) and `env`.
  Started start_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::string& name);
  // Waits for it (killing its process group after timeout_s): its exit code.
  static int finish(const Started& s, double timeout_s);
  // Whether it has ended (not reaped: finish() still reads its status).
  static bool ended(const Started& s) {
    siginfo_t info{};
    return waitid(P_PID, s.pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == s.pid;
  }

  struct Ran {
    int exit_code = -1;
    std::string output;
  };
  // start_command, then finish; the lines of its output that tell the story
  // are printed to the test's log.
  Ran run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}, double timeout_s = 120);

 private:
  SlurmCluster() = default;
  pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& out,
              bool tied_to_us);
  std::vector<std::string> environment(const std::vector<std::string>& extra) const;
  std::string daemon_logs() const;
  void stop();

  std::string dir_, conf_;
  long first_job_id_ = 0;
  pid_t munged_ = -1, slurmctld_ = -1, slurmd_ = -1;
  int commands_ = 0;
};

// The job ids of one cluster are its own: they start at a random id whose
// derived store ports (20000 + id mod 20000) are free now.
long pick_first_job_id() {
  std::mt19937_64 rng(std::random_device{}());
  for (int tries = 0; tries < 100; ++tries) {
    const long id = 100000 + static_cast<long>(rng() % 9000000);
    bool free = true;
    for (long k = 0; k < 20 && free; ++k) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(fsdp::config::derived_port(std::to_string(id + k))));
      free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      close(fd);
    }
    if (free) return id;
  }
  return 100000;
}

std::unique_ptr<SlurmCluster> SlurmCluster::start(std::string* skip, std::string* failure) {
  if (geteuid() != 0) {
    *skip = "slurmd starts each step's processes as the job's user, so it runs as root; this suite runs as uid " +
            std::to_string(geteuid());
    return nullptr;
  }
  std::string missing;
  for (const char* p :
       {"munged", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "scancel", "scontrol", "sinfo", "squeue"})
    if (find_program(p).empty()) missing += std::string(missing.empty() ? "" : ", ") + p;
  if (!missing.empty()) {
    *skip = "Slurm is not installed here (no " + missing +
            "; Debian's slurmctld, slurmd, slurm-client and munge, which `make deps` installs)";
    return nullptr;
  }
  std::unique_ptr<SlurmCluster> c(new SlurmCluster);
  c->dir_ = (fs::temp_directory_path() / ("fsdp-slurm-" + std::to_string(getpid()))).string();
  fs::remove_all(c->dir_);
  fs::create_directories(c->dir_ + "/munge");
  // munged refuses a socket in a folder others cannot enter, and a key
  // others can read.
  chmod(c->dir_.c_str(), 0755);
  chmod((c->dir_ + "/munge").c_str(), 0755);
  const std::string key = c->dir_ + "/munge.key", socket = c->dir_ + "/munge/socket";
  {
    std::ofstream k(key, std::ios::binary);
    std::random_device rd;
    for (int i = 0; i < 256; ++i) {
      const uint32_t w = rd();
      k.write(reinterpret_cast<const char*>(&w), sizeof w);
    }
  }
  chmod(key.c_str(), 0600);
  const int ctld_port = fsdp::testing::free_port();
  int slurmd_port = fsdp::testing::free_port();
  while (slurmd_port == ctld_port) slurmd_port = fsdp::testing::free_port();
  c->first_job_id_ = pick_first_job_id();
  c->conf_ = c->dir_ + "/slurm.conf";
  {
    const std::string& d = c->dir_;
    std::ofstream conf(c->conf_);
    conf << "ClusterName=fsdptest\n"
         << "SlurmctldHost=localhost(127.0.0.1)\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << slurmd_port << "\n"
         << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket << "\n"
         << "StateSaveLocation=" << d << "/slurmctld\nSlurmdSpoolDir=" << d << "/slurmd\n"
         << "SlurmctldPidFile=" << d << "/slurmctld.pid\nSlurmdPidFile=" << d << "/slurmd.pid\n"
         << "SlurmctldLogFile=" << d << "/slurmctld.log\nSlurmdLogFile=" << d << "/slurmd.log\n"
         << "FirstJobId=" << c->first_job_id_ << "\n"
         // No cgroups here: processes are tracked by their parents.
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
         << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
         // The node's 8 CPUs as written, whatever this host has: two jobs of
         // two tasks fit on a 2-core machine.
         << "SlurmdParameters=config_overrides\nReturnToService=2\nMpiDefault=none\n"
         // A cancelled step's SIGTERM is followed by SIGKILL after 2 s, not 30.
         << "KillWait=2\n"
         // A job that waits for the last one to complete is tried again
         // within a second, not a minute.
         << "SchedulerParameters=sched_interval=1,sched_min_interval=100000\n"
         << "NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN\n"
         << "PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
  }
  const std::vector<std::string> env = c->environment({});
  c->munged_ = c->spawn({find_program("munged"), "-F", "--socket=" + socket, "--key-file=" + key,
                         "--pid-file=" + c->dir_ + "/munge/pid", "--log-file=" + c->dir_ + "/munged.log",
                         "--seed-file=" + c->dir_ + "/munge/seed"},
                        env, c->dir_ + "/munged.out", true);
  auto alive = [](pid_t p) { return p > 0 && waitpid(p, nullptr, WNOHANG) == 0; };
  if (!wait_until([&] { return fs::exists(socket) || !alive(c->munged_); }, 20) || !alive(c->munged_)) {
    *failure = "munged did not open its socket " + socket + ":\n" + c->daemon_logs();
    return nullptr;
  }
  c->slurmctld_ = c->spawn({find_program("slurmctld"), "-D", "-i", "-f", c->conf_}, env, c->dir_ + "/slurmctld.out",
                           true);
  c->slurmd_ = c->spawn({find_program("slurmd"), "-D", "-N", "localhost", "-f", c->conf_}, env,
                        c->dir_ + "/slurmd.out", true);
  // Up when the node is idle: the controller answers and the node registered.
  std::string state;
  const bool up = wait_until(
      [&] {
        if (!alive(c->slurmctld_) || !alive(c->slurmd_)) return true;
        const Started s = c->start_command({find_program("sinfo"), "-h", "-o", "%T"}, {}, "sinfo");
        finish(s, 10);
        state = slurp(s.out);
        return has(state, "idle");
      },
      60);
  if (!up || !has(state, "idle")) {
    *failure = "the cluster did not come up (sinfo said '" + state + "'):\n" + c->daemon_logs();
    return nullptr;
  }
  return c;
}

SlurmCluster::~SlurmCluster() { stop(); }

void SlurmCluster::stop() {
  // The jobs first (a step's processes are slurmstepd's, not ours), then
  // the daemons, then their files.
  if (slurmctld_ > 0 && waitpid(slurmctld_, nullptr, WNOHANG) == 0) {
    finish(start_command({find_program("scancel"), "--partition=main"}, {}, "scancel-all"), 30);
    wait_until(
        [&] {
          const Started s = start_command({find_program("squeue"), "-h"}, {}, "squeue");
          return finish(s, 10) == 0 && slurp(s.out).empty();
        },
        30);
  }
  for (pid_t* p : {&slurmd_, &slurmctld_, &munged_}) {
    if (*p <= 0) continue;
    kill(*p, SIGTERM);
    if (!wait_until([&] { return waitpid(*p, nullptr, WNOHANG) != 0; }, 15)) {
      kill(*p, SIGKILL);
      waitpid(*p, nullptr, 0);
    }
    *p = -1;
  }
  // A step whose slurmstepd outlived the cancel: ours by its job id.
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp(e.path().string() + "/cmdline");
    long job = 0;
    if (std::sscanf(cmd.c_str(), "slurmstepd: [%ld", &job) == 1 && job >= first_job_id_ &&
        job < first_job_id_ + 100000)
      kill(std::stoi(name), SIGKILL);
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<std::string> SlurmCluster::environment(const std::vector<std::string>& extra) const {
  std::vector<std::string> env;
  const char* const drop[] = {"SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_", "OMPI_", "PMI_", "PMIX_",
                              "PET_", "MPI_LOCAL", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                              "GROUP_RANK=", "MASTER_ADDR=", "MASTER_PORT=", "FSDP_STORE_HOSTED=",
                              "FSDP_RANK_TEST=", "TMPDIR="};
  for (char** e = environ; *e; ++e) {
    bool keep = true;
    for (const char* p : drop) keep &= std::strncmp(*e, p, std::strlen(p)) != 0;
    if (keep) env.push_back(*e);
  }
  env.push_back("SLURM_CONF=" + conf_);
  env.push_back("TMPDIR=" + dir_);
  // mpirun refuses root without both.
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

pid_t SlurmCluster::spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          const std::string& out, bool tied_to_us) {
  // Everything the child needs is made before fork: it only calls
  // async-signal-safe functions.
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    if (tied_to_us && (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)) _exit(126);
    setpgid(0, 0);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0 || chdir(dir_.c_str()) != 0) _exit(126);
    execve(a[0], a.data(), e.data());
    const char msg[] = "exec failed\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  if (fd >= 0) close(fd);
  return pid;
}

Started SlurmCluster::start_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                    const std::string& name) {
  Started s;
  s.out = dir_ + "/" + name + "-" + std::to_string(++commands_) + ".out";
  s.pid = spawn(argv, environment(env), s.out, false);
  return s;
}

int SlurmCluster::finish(const Started& s, double timeout_s) {
  int status = 0;
  if (!wait_until([&] { return waitpid(s.pid, &status, WNOHANG) != 0; }, timeout_s)) {
    kill(-s.pid, SIGKILL);
    waitpid(s.pid, &status, 0);
    std::ofstream(s.out, std::ios::app) << "\n[test: killed after " << timeout_s << " s]\n";
  }
  return exit_code_of(status);
}

SlurmCluster::Ran SlurmCluster::run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                    double timeout_s) {
  Ran r;
  const Started s = start_command(argv, env, fs::path(argv[0]).filename().string());
  r.exit_code = finish(s, timeout_s);
  r.output = slurp(s.out);
  std::printf("[ SLURM    ] %s   (exit %d)\n", command_line(argv).c_str(), r.exit_code);
  show(r.output);
  return r;
}

void show(const std::string& output) {
  // What says where each rank ran and how the job ended; not the tables.
  static const std::regex telling("launcher:|salloc:|srun:|slurmstepd|resumed|restart|error|epoch [0-9]+ loss");
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (std::regex_search(line, telling)) std::printf("[ SLURM    ]   %s\n", line.c_str());
  std::fflush(stdout);
}

std::string SlurmCluster::daemon_logs() const {
  std::string all;
  for (const char* f : {"munged.out", "munged.log", "slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log"}) {
    std::string text = slurp(dir_ + "/" + f);
    if (text.size() > 3000) text = "..." + text.substr(text.size() - 3000);
    if (!text.empty()) all += std::string("--- ") + f + ":\n" + text + "\n";
  }
  return all;
}

// The job's id, from the first "SLURM_JOB_ID=N" of a launcher's line.
std::string job_id_in(const std::string& output) {
  std::smatch m;
  if (std::regex_search(output, m, std::regex("SLURM_JOB_ID=([0-9]+)"))) return m[1];
  ADD_FAILURE() << "no SLURM_JOB_ID=N in:\n" << output;
  return "0";
}

// The one line of `output` that contains `needle`; a failure naming it otherwise.
std::string the_line(const std::string& output, const std::string& needle) {
  const auto found = lines_with(output, needle);
  if (found.size() == 1) return found[0];
  ADD_FAILURE() << found.size() << " lines contain '" << needle << "', expected 1, in:\n" << output;
  return "";
}

class RealSlurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = SlurmCluster::start(&skip_, &failure_); }
  static void TearDownTestSuite() { cluster_.reset(); }
  void SetUp() override {
    if (!failure_.empty()) FAIL() << failure_;
    if (!cluster_) GTEST_SKIP() << skip_;
  }
  SlurmCluster& cluster() { return *cluster_; }
  // The demo, quiet, writing no weights.
  static std::vector<std::string> tiny(const std::string& epochs = "2", std::vector<std::string> more = {}) {
    std::vector<std::string> argv = {bin_path("tiny"), "--epochs", epochs, "--save", "", "--no-progress"};
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  }
  static std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  static std::unique_ptr<SlurmCluster> cluster_;
  static std::string skip_, failure_;
};
std::unique_ptr<SlurmCluster> RealSlurm::cluster_;
std::string RealSlurm::skip_, RealSlurm::failure_;

// `srun -n 2 PROGRAM`: every task a rank, the store on the job's first host
// at 20000 + job id mod 20000.
TEST_F(RealSlurm, SrunStartsEachTaskAsARank) {
  const auto r = cluster().run(cat({cluster().program("srun"), "-n", "2"}, tiny()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string id = job_id_in(r.output);
  const std::string port = std::to_string(fsdp::config::derived_port(id));
  for (int k = 0; k < 2; ++k) {
    const std::string rank = std::to_string(k);
    const std::string line = the_line(r.output, "fsdp: launcher: slurm (SLURM_NTASKS=2 SLURM_PROCID=" + rank + " ");
    EXPECT_TRUE(has(line, "SLURM_JOB_ID=" + id + "): rank " + rank + " of 2, local rank " + rank +
                              " of 2, node 0 of 1, store at localhost:" + port))
        << line;
  }
  // One world: its rank 0 alone prints the steps.
  EXPECT_EQ(lines_with(r.output, "epoch 1 loss").size(), 1u) << r.output;
}

// `srun -N 1 --ntasks-per-node=1 fsdp run -n 2 -- PROGRAM`: the step places
// the launcher's node, and the launcher's ranks say why the step's own
// variables were not theirs.
TEST_F(RealSlurm, SrunStepRunsFsdpRunOnItsNode) {
  const auto r = cluster().run(
      cat({cluster().program("srun"), "-N", "1", "--ntasks-per-node=1", bin_path("fsdp"), "run", "-n", "2", "--"},
          tiny()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string node = the_line(r.output, "fsdp run: launcher: slurm (SLURM_NNODES=1 SLURM_NODEID=0 ");
  EXPECT_TRUE(has(node, "): node 0 of 1")) << node;
  for (int k = 0; k < 2; ++k) {
    const std::string line = the_line(r.output, "[rank " + std::to_string(k) + "] fsdp: launcher: torchrun (");
    EXPECT_TRUE(has(line, ": rank " + std::to_string(k) + " of 2, ")) << line;
    EXPECT_TRUE(has(line, "; slurm's (SLURM_PROCID=0 SLURM_NTASKS=1) variables ignored: torchrun's are set for each "
                          "rank by the launcher that started it"))
        << line;
  }
  EXPECT_EQ(lines_with(r.output, "epoch 1 loss").size(), 1u) << r.output;
}

// The sbatch script of docs/GUIDE.md §8, on one node of two tasks and with
// tiny for gpt: both forms, every task a rank and one `fsdp run` per node.
TEST_F(RealSlurm, SbatchScriptOfTheGuideRunsBothForms) {
  const std::string tiny_args = bin_path("tiny") + " --epochs 2 --save '' --no-progress";
  const std::string script = cluster().dir() + "/job.sh";
  std::ofstream(script) << "#!/bin/bash\n"
                           "#SBATCH --job-name=tiny\n"
                           "#SBATCH --nodes=1\n"
                           "#SBATCH --ntasks-per-node=2\n"
                           "#SBATCH --cpus-per-task=1\n"
                           "#SBATCH --time=00:05:00\n"
                           "#SBATCH --output=job.out\n"
                           "export FSDP_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')\n"
                           "# every task a rank\n"
                           "srun " << tiny_args << "\n"
                           "# one launcher per node, each starting 2 ranks\n"
                           "srun --ntasks=$SLURM_NNODES --ntasks-per-node=1 " << bin_path("fsdp") << " run -n 2 -- "
                        << tiny_args << "\n";
  const auto submitted = cluster().run({cluster().program("sbatch"), "--parsable", script});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string id = submitted.output.substr(0, submitted.output.find_first_not_of("0123456789"));
  // The job's end: it leaves the queue (`sbatch --wait` would look every 10 s).
  const bool ended = wait_until(
      [&] {
        const auto q = cluster().start_command({cluster().program("squeue"), "-h", "-j", id}, {}, "squeue");
        return SlurmCluster::finish(q, 10) == 0 && slurp(q.out).empty();
      },
      120);
  const auto job = cluster().run({cluster().program("scontrol"), "show", "job", id});
  const std::string out = slurp(cluster().dir() + "/job.out");
  std::printf("[ SLURM    ] job.out:\n");
  show(out);
  ASSERT_TRUE(ended) << job.output << out;
  // "ExitCode=0:0": the script's exit code, and the signal that ended it.
  EXPECT_TRUE(has(job.output, " ExitCode=0:0")) << job.output << out;
  EXPECT_TRUE(has(job.output, " JobState=COMPLETED ")) << job.output << out;
  for (int k = 0; k < 2; ++k) {
    const std::string rank = std::to_string(k);
    EXPECT_TRUE(has(the_line(out, "fsdp: launcher: slurm (SLURM_NTASKS=2 SLURM_PROCID=" + rank + " "),
                    "): rank " + rank + " of 2, local rank " + rank + " of 2"))
        << out;
    EXPECT_TRUE(has(the_line(out, "[rank " + rank + "] fsdp: launcher: torchrun ("), ": rank " + rank + " of 2, "))
        << out;
  }
  EXPECT_TRUE(has(the_line(out, "fsdp run: launcher: slurm ("), "SLURM_NTASKS=1 ")) << out;
  EXPECT_EQ(lines_with(out, "epoch 1 loss").size(), 2u) << out;  // one per step
}

// `salloc -n 2 mpirun -np 2 PROGRAM`: mpirun runs in the allocation's shell
// (no step), so Open MPI's variables alone place the ranks.
TEST_F(RealSlurm, SallocMpirunStartsTwoRanks) {
  const std::string m = cluster().program("mpirun");
  if (m.empty()) GTEST_SKIP() << "mpirun (Open MPI; Debian's openmpi-bin, which `make deps` installs) is not installed";
  const auto r = cluster().run(cat({cluster().program("salloc"), "-n", "2", m, "-np", "2"}, tiny()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 2; ++k) {
    const std::string rank = std::to_string(k);
    const std::string line =
        the_line(r.output, "fsdp: launcher: openmpi (OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=" + rank + " ");
    EXPECT_TRUE(has(line, "): rank " + rank + " of 2, local rank " + rank + " of 2, node 0 of 1")) << line;
    EXPECT_FALSE(has(line, "ignored")) << line;
  }
  EXPECT_EQ(lines_with(r.output, "epoch 1 loss").size(), 1u) << r.output;
}

// `srun -n 1 mpirun -np 2 PROGRAM`: the ranks are mpirun's, inside a step
// of one task whose variables they inherit. They form one world of two,
// and each says why the step's variables were not read.
TEST_F(RealSlurm, MpirunInsideAnSrunStepFormsOneWorld) {
  const std::string m = cluster().program("mpirun");
  if (m.empty()) GTEST_SKIP() << "mpirun (Open MPI; Debian's openmpi-bin, which `make deps` installs) is not installed";
  // A step of one task gives mpirun one slot.
  const auto r = cluster().run(cat({cluster().program("srun"), "-n", "1", m, "--oversubscribe", "-np", "2"}, tiny()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 2; ++k) {
    const std::string rank = std::to_string(k);
    const std::string line =
        the_line(r.output, "fsdp: launcher: openmpi (OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=" + rank + " ");
    EXPECT_TRUE(has(line, "): rank " + rank + " of 2, local rank " + rank + " of 2, node 0 of 1")) << line;
    EXPECT_TRUE(std::regex_search(line, std::regex("; slurm's \\(SLURM_PROCID=0 SLURM_NTASKS=1\\) variables ignored: "
                                                   "an outer launcher's, already set for process [0-9]+ \\(mpirun\\) "
                                                   "above this one, which has no openmpi's$")))
        << line;
  }
  // Two worlds of one would each print their steps.
  EXPECT_EQ(lines_with(r.output, "epoch 1 loss").size(), 1u) << r.output;
  EXPECT_TRUE(lines_with(r.output, "launcher: slurm").empty()) << r.output;
}

// A step cancelled mid-training (`scancel JOB.STEP`: SIGKILL to every
// process of the step, `fsdp run` included): no restart is spent, since no
// launcher is left to restart anything; the same command run again (a
// requeued job, the script's next srun) resumes from the newest checkpoint.
TEST_F(RealSlurm, CancelledStepResumesFromItsCheckpoint) {
  // 100 ms per step on rank 0: the cancel lands long before step 30. (The
  // test worker's tiny, tests/workers/trainer_scenarios.cpp: the same
  // trainer, with the delay.)
  auto slowed = tiny("30", {"--ckpt-dir", "ck", "--ckpt-every", "5", "--resume", "--straggler-factor", "0"});
  slowed[0] = bin_path("fsdp_test_worker");
  slowed.insert(slowed.begin() + 1, "tiny");
  const auto argv = cat({cluster().program("srun"), "-N", "1", "--ntasks-per-node=1", bin_path("fsdp"), "run", "-n",
                         "2", "--max-restarts", "3", "--"},
                        slowed);
  const std::vector<std::string> delay = {"FSDP_INJECT_STEP_DELAY=0:100"};
  std::printf("[ SLURM    ] %s   (FSDP_INJECT_STEP_DELAY=0:100, in the background)\n", command_line(argv).c_str());
  const Started first = cluster().start_command(argv, delay, "cancelled");
  // Step 10's checkpoint is whole once step 11 is printed.
  const bool trained = wait_until(
      [&] { return has(slurp(first.out), "epoch 11 loss") || SlurmCluster::ended(first); }, 120);
  const std::string id = job_id_in(slurp(first.out));
  const auto cancel = cluster().run({cluster().program("scancel"), id + ".0"});
  const int first_exit = SlurmCluster::finish(first, 60);
  const std::string cancelled = slurp(first.out);
  std::printf("[ SLURM    ] the cancelled step (exit %d):\n", first_exit);
  show(cancelled);
  ASSERT_TRUE(trained) << cancelled;
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_NE(first_exit, 0) << cancelled;
  EXPECT_TRUE(has(cancelled, "CANCELLED")) << cancelled;
  EXPECT_FALSE(has(cancelled, "epoch 29 loss")) << cancelled;
  EXPECT_FALSE(has(cancelled, "restarting")) << cancelled;

  const auto again = cluster().run(argv);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(again.output, m, std::regex("resumed from ck/step-0*([0-9]+) at step ([0-9]+)")))
      << again.output;
  const int resumed = std::stoi(m[2]);
  EXPECT_GE(resumed, 10) << m[0];
  EXPECT_EQ(lines_with(again.output, "epoch 29 loss").size(), 1u) << again.output;
  // Resumed bit-exact: the steps both runs took print the same losses (up
  // to the cancelled run's last step line, which the kill may have cut).
  int compared = 0;
  for (int e = resumed; e < 30; ++e) {
    const auto before = lines_with(cancelled, "] epoch " + std::to_string(e) + " loss ");
    if (before.empty() || lines_with(cancelled, "] epoch " + std::to_string(e + 1) + " loss ").empty()) break;
    EXPECT_EQ(before, lines_with(again.output, "] epoch " + std::to_string(e) + " loss "));
    ++compared;
  }
  EXPECT_GE(compared, 1) << "no step of the cancelled run after its checkpoint to compare";
}

}  // namespace FSDP_TEST_ID
