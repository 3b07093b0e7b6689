// The TCP rendezvous with ranks as threads on 127.0.0.1: every rank gets rank 0's blob, whatever
// the start order; a missing rank, a peer of another world size and a duplicate rank are refused
// within the timeout, with messages that name them.
#include "executor/comm/tcp_rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "core/error.h"

using megaplan::SpecError;
using megaplan::exec::tcp_broadcast_from_rank0;
using namespace std::chrono_literals;

namespace {

// A port nobody listens on right now: bind port 0, read what the kernel chose, let it go.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0);
  socklen_t size = sizeof(address);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

// NCCL's unique id is 128 bytes; any recognisable pattern will do.
std::vector<uint8_t> unique_id() {
  std::vector<uint8_t> blob(128);
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<uint8_t>(i * 7 + 3);
  return blob;
}

std::future<std::vector<uint8_t>> start_rank(int64_t rank, int64_t world_size, int port,
                                             std::chrono::milliseconds timeout, std::chrono::milliseconds delay = 0ms) {
  return std::async(std::launch::async, [=] {
    std::this_thread::sleep_for(delay);
    const std::vector<uint8_t> blob = rank == 0 ? unique_id() : std::vector<uint8_t>{};
    return tcp_broadcast_from_rank0(rank, world_size, "127.0.0.1", port, blob, timeout);
  });
}

std::string error_of(std::future<std::vector<uint8_t>>& result) {
  try {
    result.get();
  } catch (const SpecError& error) {
    return error.what();
  }
  return "";
}

size_t open_descriptors() {
  const std::filesystem::directory_iterator entries("/proc/self/fd");
  return static_cast<size_t>(std::distance(begin(entries), end(entries)));
}

}  // namespace

TEST_CASE("world size 1 needs no network", "[launch]") {
  // Port 1 is privileged: any attempt to listen or connect there would fail.
  CHECK(tcp_broadcast_from_rank0(0, 1, "no-such-host.invalid", 1, unique_id(), 10ms) == unique_id());
}

TEST_CASE("every rank gets rank 0's blob: worlds of 2 and 4", "[launch]") {
  for (const int64_t world_size : {2, 4}) {
    INFO("world size " << world_size);
    const int port = free_port();
    std::vector<std::future<std::vector<uint8_t>>> ranks;
    for (int64_t rank = 0; rank < world_size; ++rank) ranks.push_back(start_rank(rank, world_size, port, 10s));
    for (auto& rank : ranks) CHECK(rank.get() == unique_id());
  }
}

TEST_CASE("rank 0 may start last", "[launch]") {
  const int port = free_port();
  std::vector<std::future<std::vector<uint8_t>>> ranks;
  for (int64_t rank = 1; rank < 4; ++rank) ranks.push_back(start_rank(rank, 4, port, 10s));
  ranks.push_back(start_rank(0, 4, port, 10s, 300ms));
  for (auto& rank : ranks) CHECK(rank.get() == unique_id());
}

TEST_CASE("a missing rank ends every rank within the timeout, naming it", "[launch]") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  auto rank0 = start_rank(0, 4, port, 600ms);
  auto rank1 = start_rank(1, 4, port, 5s);
  auto rank3 = start_rank(3, 4, port, 5s);
  const std::string expected = "MASTER_ADDR: rank(s) 2 did not connect to rank 0 on port " + std::to_string(port) +
                               " within 600 ms (2 of 3 did); every rank needs the same MASTER_ADDR, "
                               "MASTER_PORT and WORLD_SIZE";
  CHECK(error_of(rank0) == expected);
  // The connected ranks hear the same reason from rank 0 instead of waiting out their own 5 s.
  CHECK(error_of(rank1) == expected);
  CHECK(error_of(rank3) == expected);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("rank 0 never started: the others give up at their timeout", "[launch]") {
  const int port = free_port();
  auto rank1 = start_rank(1, 2, port, 300ms);
  CHECK_THAT(error_of(rank1), Catch::Matchers::StartsWith("MASTER_ADDR: could not reach rank 0 at 127.0.0.1:" +
                                                          std::to_string(port) + " within 300 ms: "));
}

TEST_CASE("a peer of another world size is refused; the real rank still gets in", "[launch]") {
  const int port = free_port();
  auto rank0 = start_rank(0, 2, port, 10s);
  auto stranger = start_rank(1, 3, port, 10s);
  CHECK_THAT(error_of(stranger),
             Catch::Matchers::StartsWith("MASTER_ADDR: rank 0 refused this process: rank 1 from ") &&
                 Catch::Matchers::Contains("announced world size 3, but rank 0 runs a world of 2"));
  auto rank1 = start_rank(1, 2, port, 10s);
  CHECK(rank1.get() == unique_id());
  CHECK(rank0.get() == unique_id());
}

TEST_CASE("a refused peer is named when rank 0 times out", "[launch]") {
  const int port = free_port();
  auto rank0 = start_rank(0, 2, port, 500ms);
  auto stranger = start_rank(1, 8, port, 5s);
  CHECK_THAT(error_of(stranger), Catch::Matchers::Contains("announced world size 8"));
  CHECK_THAT(error_of(rank0), Catch::Matchers::StartsWith("MASTER_ADDR: rank(s) 1 did not connect") &&
                                  Catch::Matchers::Contains("; refused rank 1 from ") &&
                                  Catch::Matchers::Contains("announced world size 8, but rank 0 runs a world of 2"));
}

TEST_CASE("a rank that connects twice is refused the second time", "[launch]") {
  const int port = free_port();
  auto rank0 = start_rank(0, 3, port, 10s);
  auto first = start_rank(1, 3, port, 10s);
  std::this_thread::sleep_for(200ms);  // the first rank 1 is connected and waiting
  auto second = start_rank(1, 3, port, 10s);
  CHECK_THAT(error_of(second), Catch::Matchers::Contains("rank 1 connected twice"));
  auto rank2 = start_rank(2, 3, port, 10s);
  CHECK(first.get() == unique_id());
  CHECK(rank2.get() == unique_id());
  CHECK(rank0.get() == unique_id());
}

TEST_CASE("the port is free again at once after a rendezvous", "[launch]") {
  // SO_REUSEADDR: the closed connections' TIME_WAIT must not block the next job on the same port.
  const int port = free_port();
  for (int round = 0; round < 2; ++round) {
    auto rank0 = start_rank(0, 2, port, 10s);
    auto rank1 = start_rank(1, 2, port, 10s);
    CHECK(rank1.get() == unique_id());
    CHECK(rank0.get() == unique_id());
  }
}

TEST_CASE("no socket outlives a call, whether it succeeds or fails", "[launch]") {
  const size_t before = open_descriptors();
  const int port = free_port();
  {
    auto rank0 = start_rank(0, 3, port, 10s);
    auto rank1 = start_rank(1, 3, port, 10s);
    auto rank2 = start_rank(2, 3, port, 10s);
    CHECK(rank0.get() == unique_id());
    CHECK(rank1.get() == unique_id());
    CHECK(rank2.get() == unique_id());
  }
  {
    auto rank0 = start_rank(0, 3, port, 300ms);
    auto rank1 = start_rank(1, 3, port, 5s);
    auto stranger = start_rank(2, 4, port, 5s);
    CHECK_FALSE(error_of(stranger).empty());
    CHECK_FALSE(error_of(rank0).empty());
    CHECK_FALSE(error_of(rank1).empty());
  }
  CHECK(open_descriptors() == before);
}
