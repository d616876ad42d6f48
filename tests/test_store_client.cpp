// The bounded store client the rank's watchdog and the launcher share
// (comm/store_client.h): a store that does not answer costs a caller its
// budget once, then every call fails at once while the client's thread is
// still inside that call; periodic work and reads share one connection.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/rendezvous.h"
#include "comm/store_client.h"
#include "test_util.h"

using Clock = std::chrono::steady_clock;
using fsdp::comm::StoreClient;
using fsdp::comm::StoreSession;

namespace FSDP_TEST_ID {
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(StoreClient, AStoreThatNeverAnswersCostsOneBudgetThenCallsFailAtOnce) {
  // A port that accepts connections (the kernel's backlog) and never answers.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);

  auto client = std::make_unique<StoreClient>(
      [port] { return fsdp::comm::connect_store_client("127.0.0.1", port, std::chrono::seconds(5)); },
      std::chrono::seconds(3));
  auto t0 = Clock::now();
  EXPECT_FALSE(client->read({"k"}, std::chrono::milliseconds(300)).has_value());
  const double first = since(t0);
  EXPECT_GE(first, 0.25);
  EXPECT_LT(first, 1.5) << "a read must not wait past its budget";
  EXPECT_TRUE(client->stuck());
  t0 = Clock::now();
  EXPECT_FALSE(client->read({"k"}, std::chrono::milliseconds(300)).has_value());
  EXPECT_FALSE(client->write("k", "v", std::chrono::milliseconds(300)));
  EXPECT_LT(since(t0), 0.1) << "calls after one that gave up must fail at once";
  t0 = Clock::now();
  client.reset();  // its thread is left behind inside the stuck call
  EXPECT_LT(since(t0), 0.5) << "closing a stuck client must not wait for it";
  // fd stays open: the thread left behind still waits on it until the
  // process ends (closing it would only make libtorch retry and log).
}

TEST(StoreClient, PeriodicWorkAndReadsShareOneConnection) {
  const int port = fsdp::testing::free_port();
  std::unique_ptr<c10d::TCPStore> server(
      fsdp::comm::host_store("127.0.0.1", port, std::chrono::seconds(10), /*bind_all=*/false));
  auto ticks = std::make_shared<std::atomic<int>>(0);
  StoreClient::Periodic p;
  p.every = std::chrono::milliseconds(20);
  p.tick = [ticks](StoreSession& s) { s.set("tick", std::to_string(++*ticks)); };
  p.last = [](StoreSession& s) { s.set("last", "bye"); };
  {
    StoreClient client([port] { return fsdp::comm::connect_store_client("127.0.0.1", port, std::chrono::seconds(2)); },
                       std::chrono::seconds(3), p);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (*ticks < 5 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_GE(*ticks, 5);
    auto v = client.read({"tick", "absent"}, std::chrono::seconds(2));
    ASSERT_TRUE(v.has_value());
    ASSERT_TRUE((*v)[0].has_value());
    EXPECT_GE(std::stoi(*(*v)[0]), 5);
    EXPECT_FALSE((*v)[1].has_value()) << "an absent key is nullopt, not an empty value";
    EXPECT_TRUE(client.write("w", "x", std::chrono::seconds(2)));
    EXPECT_FALSE(client.stuck());
    EXPECT_LT(client.silent_for(), 1.0);
  }
  // The last work ran when the client stopped.
  StoreClient reader([port] { return fsdp::comm::connect_store_client("127.0.0.1", port, std::chrono::seconds(2)); },
                     std::chrono::seconds(3));
  auto v = reader.read({"last", "w"}, std::chrono::seconds(2));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ((*v)[0].value_or(""), "bye");
  EXPECT_EQ((*v)[1].value_or(""), "x");
}

}  // namespace FSDP_TEST_ID
