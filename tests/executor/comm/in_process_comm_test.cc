// The in-process CPU communicators against comm.h's semantics: every collective for 1 to 4 ranks in
// fp32 and bf16, bit for bit equal to a sequential rank-order fold on every rank; Megatron's tp, dp
// and pp groups used at once; send/recv matching; a failing rank ending every rank with its own
// exception; a rank that never comes ending the world with a timeout that names the group.
// Bodies run on rank threads, where Catch's assertions are not safe: they record what they saw and
// the test thread checks it.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rank_groups.h"
#include "executor/comm/comm.h"
#include "executor/comm/in_process_comm.h"
#include "executor/comm/rank_threads.h"

using Catch::Matchers::Contains;
using megaplan::bf16_to_float;
using megaplan::DType;
using megaplan::float_to_bf16;
using megaplan::exec::CommAborted;
using megaplan::exec::InProcessWorld;
using megaplan::exec::ReduceOp;
using megaplan::exec::run_rank_threads;

namespace {

using Bytes = std::vector<std::byte>;
using std::chrono::milliseconds;

constexpr milliseconds kGenerousTimeout{10000};  // a hang fails the test instead of blocking it

std::vector<int64_t> iota_ranks(int64_t n) {
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < n; ++r) ranks.push_back(r);
  return ranks;
}

// Values as a buffer of `type` (bf16 rounds to nearest even).
Bytes encode(const std::vector<float>& values, DType type) {
  Bytes bytes(values.size() * dtype_bytes(type));
  if (type == DType::kFloat32) {
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());  // an empty one's data() may be null
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const uint16_t bits = float_to_bf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

std::vector<float> decode(const Bytes& bytes, DType type) {
  const std::size_t count = bytes.size() / dtype_bytes(type);
  std::vector<float> values(count);
  if (type == DType::kFloat32) {
    if (count > 0) std::memcpy(values.data(), bytes.data(), bytes.size());
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      values[i] = bf16_to_float(bits);
    }
  }
  return values;
}

// Element i of rank r's input: large terms that cancel and small ones they swallow, so a sum's
// float value depends on the order of its terms (element 0 of ranks 0, 1, 2 is 1, 2^27, -2^27:
// 0 in rank order, 1 in reverse). All are exact in bf16.
std::vector<float> rank_values(int64_t rank, std::size_t count) {
  static constexpr float kTerms[] = {1.0f, 0.375f, 3.0f, -134217728.0f, -7.25f, 134217728.0f, 256.0f};
  constexpr std::size_t kTermCount = sizeof(kTerms) / sizeof(kTerms[0]);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = kTerms[(i + 5 * static_cast<std::size_t>(rank)) % kTermCount];
  return values;
}

// The contract's reference: ((x0 op x1) op x2) ... in float, in the order given.
float fold(const std::vector<float>& terms, ReduceOp op) {
  float result = terms.front();
  for (std::size_t i = 1; i < terms.size(); ++i) {
    result = op == ReduceOp::kSum ? result + terms[i] : std::max(result, terms[i]);
  }
  return result;
}

// Element-wise fold over ranks (in rank order) of inputs[r][offset + i], rounded to `type` once.
Bytes expected_reduction(const std::vector<Bytes>& inputs, DType type, ReduceOp op, std::size_t offset,
                         std::size_t count) {
  std::vector<std::vector<float>> widened;
  for (const Bytes& input : inputs) widened.push_back(decode(input, type));
  std::vector<float> result(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<float> terms;
    for (const auto& values : widened) terms.push_back(values[offset + i]);
    result[i] = fold(terms, op);
  }
  return encode(result, type);
}

const char* type_name(DType type) { return type == DType::kFloat32 ? "fp32" : "bf16"; }

// The exception run_rank_threads rethrew, with its dynamic type checked by the caller.
template <typename Body>
std::exception_ptr failure_of(InProcessWorld& world, int64_t world_size, const Body& body) {
  try {
    run_rank_threads(world, world_size, body);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

TEST_CASE("every collective equals a sequential rank-order fold, bit for bit on every rank", "[comm]") {
  constexpr std::size_t kCount = 7;
  for (DType type : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t n = 1; n <= 4; ++n) {
      INFO(type_name(type) << ", " << n << " ranks");
      std::vector<Bytes> inputs, scatter_inputs;
      for (int64_t r = 0; r < n; ++r) {
        inputs.push_back(encode(rank_values(r, kCount), type));
        scatter_inputs.push_back(encode(rank_values(r + 1, kCount * static_cast<std::size_t>(n)), type));
      }
      InProcessWorld world(n, kGenerousTimeout);
      std::vector<std::map<std::string, Bytes>> seen(static_cast<std::size_t>(n));
      std::atomic<int64_t> before_barrier{0};
      std::vector<int64_t> after_barrier(static_cast<std::size_t>(n), -1);
      run_rank_threads(world, n, [&](int64_t rank) {
        auto comm = world.group(rank, iota_ranks(n), "tp");
        auto& mine = seen[static_cast<std::size_t>(rank)];
        const Bytes& input = inputs[static_cast<std::size_t>(rank)];
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          const std::string suffix = op == ReduceOp::kSum ? " sum" : " max";
          Bytes data = input;
          comm->all_reduce(data.data(), kCount, type, op)->wait();
          mine["all_reduce" + suffix] = data;
          Bytes output(input.size());
          comm->reduce_scatter(scatter_inputs[static_cast<std::size_t>(rank)].data(), output.data(), kCount, type, op)
              ->wait();
          mine["reduce_scatter" + suffix] = output;
        }
        Bytes gathered(input.size() * static_cast<std::size_t>(n));
        comm->all_gather(input.data(), gathered.data(), kCount, type)->wait();
        mine["all_gather"] = gathered;
        for (int64_t root = 0; root < n; ++root) {
          Bytes data = input;
          comm->broadcast(data.data(), kCount, type, root)->wait();
          mine["broadcast from " + std::to_string(root)] = data;
        }
        ++before_barrier;
        comm->barrier();
        after_barrier[static_cast<std::size_t>(rank)] = before_barrier.load();
      });

      Bytes all_inputs;
      for (const Bytes& input : inputs) all_inputs.insert(all_inputs.end(), input.begin(), input.end());
      for (int64_t r = 0; r < n; ++r) {
        INFO("rank " << r);
        auto& mine = seen[static_cast<std::size_t>(r)];
        const std::size_t offset = static_cast<std::size_t>(r) * kCount;
        CHECK(mine["all_reduce sum"] == expected_reduction(inputs, type, ReduceOp::kSum, 0, kCount));
        CHECK(mine["all_reduce max"] == expected_reduction(inputs, type, ReduceOp::kMax, 0, kCount));
        CHECK(mine["reduce_scatter sum"] == expected_reduction(scatter_inputs, type, ReduceOp::kSum, offset, kCount));
        CHECK(mine["reduce_scatter max"] == expected_reduction(scatter_inputs, type, ReduceOp::kMax, offset, kCount));
        CHECK(mine["all_gather"] == all_inputs);
        for (int64_t root = 0; root < n; ++root) {
          CHECK(mine["broadcast from " + std::to_string(root)] == inputs[static_cast<std::size_t>(root)]);
        }
        CHECK(after_barrier[static_cast<std::size_t>(r)] == n);  // nobody left the barrier early
      }
      if (n >= 3) {
        // The inputs can tell the orders apart: folding in reverse rank order gives other bits.
        std::vector<Bytes> reversed(inputs.rbegin(), inputs.rend());
        CHECK(expected_reduction(reversed, type, ReduceOp::kSum, 0, kCount) !=
              expected_reduction(inputs, type, ReduceOp::kSum, 0, kCount));
      }
    }
  }
}

TEST_CASE("hand-computed sums: float rank order, bf16 rounded once at the end; max keeps NaN", "[comm]") {
  InProcessWorld world(3, kGenerousTimeout);
  // fp32: (1 + 1e8) - 1e8 = 0 (1e8 swallows 1); the reverse order would give 1.
  const float fp32_terms[3] = {1.0f, 1e8f, -1e8f};
  // bf16: 1 + 256 - 256 = 1 in float; rounding after each addition (257 -> 256) would give 0.
  const float bf16_terms[3] = {1.0f, 256.0f, -256.0f};
  std::vector<float> fp32_sum(3), bf16_sum(3), max_with_nan(3);
  run_rank_threads(world, 3, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1, 2}, "tp");
    const auto r = static_cast<std::size_t>(rank);
    float value = fp32_terms[r];
    comm->all_reduce(&value, 1, DType::kFloat32, ReduceOp::kSum)->wait();
    fp32_sum[r] = value;
    uint16_t bits = float_to_bf16(bf16_terms[r]);
    comm->all_reduce(&bits, 1, DType::kBFloat16, ReduceOp::kSum)->wait();
    bf16_sum[r] = bf16_to_float(bits);
    float maybe_nan = rank == 1 ? std::numeric_limits<float>::quiet_NaN() : 5.0f;
    comm->all_reduce(&maybe_nan, 1, DType::kFloat32, ReduceOp::kMax)->wait();
    max_with_nan[r] = maybe_nan;
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(fp32_sum[r] == 0.0f);
    CHECK(bf16_sum[r] == 1.0f);
    CHECK(std::isnan(max_with_nan[r]));
  }
}

TEST_CASE("Megatron's tp, dp and pp groups work at once, interleaved on each rank", "[comm]") {
  const megaplan::RankGroups groups = megaplan::megatron_rank_groups(8, 2, 2);
  auto group_of = [&](const char* kind, int64_t rank) {
    for (const auto& ranks : groups.at(kind)) {
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) return ranks;
    }
    throw std::logic_error("no group");
  };
  // Each rank's value in an iteration; group sums of different groups differ.
  auto value = [](int64_t rank, int iteration) { return static_cast<float>(rank * 100 + iteration) + 0.5f; };
  constexpr int kIterations = 24;
  InProcessWorld world(8, kGenerousTimeout);
  struct Seen {
    std::vector<float> tp_sum, dp_sum, pp_received;
  };
  std::vector<Seen> seen(8);
  run_rank_threads(world, 8, [&](int64_t rank) {
    auto tp = world.group(rank, group_of("tp", rank), "tp");
    auto dp = world.group(rank, group_of("dp", rank), "dp");
    auto pp = world.group(rank, group_of("pp", rank), "pp");
    Seen& mine = seen[static_cast<std::size_t>(rank)];
    for (int iteration = 0; iteration < kIterations; ++iteration) {
      // Every rank takes the groups in the same, rotating order.
      for (int step = 0; step < 3; ++step) {
        switch ((iteration + step) % 3) {
          case 0: {
            float x = value(rank, iteration);
            tp->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum)->wait();
            mine.tp_sum.push_back(x);
            break;
          }
          case 1: {
            uint16_t x = float_to_bf16(value(rank, iteration));
            dp->all_reduce(&x, 1, DType::kBFloat16, ReduceOp::kSum)->wait();
            mine.dp_sum.push_back(bf16_to_float(x));
            break;
          }
          case 2: {
            const float x = value(rank, iteration);
            float received = 0;
            auto sent = pp->send(&x, 1, DType::kFloat32, 1 - pp->rank());
            pp->recv(&received, 1, DType::kFloat32, 1 - pp->rank())->wait();
            sent->wait();
            mine.pp_received.push_back(received);
            break;
          }
        }
      }
    }
  });
  for (int64_t rank = 0; rank < 8; ++rank) {
    INFO("rank " << rank);
    const Seen& mine = seen[static_cast<std::size_t>(rank)];
    REQUIRE(mine.tp_sum.size() == kIterations);
    REQUIRE(mine.dp_sum.size() == kIterations);
    REQUIRE(mine.pp_received.size() == kIterations);
    const auto tp_ranks = group_of("tp", rank), dp_ranks = group_of("dp", rank), pp_ranks = group_of("pp", rank);
    for (int iteration = 0; iteration < kIterations; ++iteration) {
      std::vector<float> tp_terms, dp_terms;
      for (int64_t member : tp_ranks) tp_terms.push_back(value(member, iteration));
      for (int64_t member : dp_ranks) dp_terms.push_back(bf16_to_float(float_to_bf16(value(member, iteration))));
      const int64_t pp_peer = pp_ranks[0] == rank ? pp_ranks[1] : pp_ranks[0];
      CHECK(mine.tp_sum[static_cast<std::size_t>(iteration)] == fold(tp_terms, ReduceOp::kSum));
      CHECK(mine.dp_sum[static_cast<std::size_t>(iteration)] ==
            bf16_to_float(float_to_bf16(fold(dp_terms, ReduceOp::kSum))));
      CHECK(mine.pp_received[static_cast<std::size_t>(iteration)] == value(pp_peer, iteration));
    }
  }
}

TEST_CASE("recvs match sends per pair in call order, whatever the order of the waits", "[comm]") {
  // Group ranks differ from global ones: group rank 0 is global rank 4.
  InProcessWorld world(5, kGenerousTimeout);
  std::vector<std::vector<float>> received(3, std::vector<float>(2, 0.0f));
  run_rank_threads(world, 5, [&](int64_t rank) {
    if (rank != 4 && rank != 1) return;
    auto comm = world.group(rank, {4, 1}, "pp");
    if (rank == 4) {
      for (float first : {10.0f, 20.0f, 30.0f}) {
        const float message[2] = {first, first + 1};
        comm->send(message, 2, DType::kFloat32, 1)->wait();  // buffered: the copy is taken here
      }
      return;
    }
    std::vector<megaplan::exec::Request> requests;
    for (auto& buffer : received) requests.push_back(comm->recv(buffer.data(), 2, DType::kFloat32, 0));
    for (std::size_t k : {2, 0, 1}) requests[k]->wait();
  });
  CHECK(received[0] == std::vector<float>{10, 11});
  CHECK(received[1] == std::vector<float>{20, 21});
  CHECK(received[2] == std::vector<float>{30, 31});
}

TEST_CASE("both ranks may send (or post a recv) before receiving", "[comm]") {
  InProcessWorld world(2, kGenerousTimeout);
  std::vector<float> after_send_first(2), after_recv_first(2);
  run_rank_threads(world, 2, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1}, "pp");
    const int64_t peer = 1 - rank;
    const float mine = static_cast<float>(rank) + 0.25f;
    auto& first = after_send_first[static_cast<std::size_t>(rank)];
    auto sent = comm->send(&mine, 1, DType::kFloat32, peer);
    comm->recv(&first, 1, DType::kFloat32, peer)->wait();
    sent->wait();
    // Posted recv, then send, then wait: as a GPU rank may issue them.
    auto& second = after_recv_first[static_cast<std::size_t>(rank)];
    auto receiving = comm->recv(&second, 1, DType::kFloat32, peer);
    const float doubled = mine * 2;
    comm->send(&doubled, 1, DType::kFloat32, peer)->wait();
    receiving->wait();
  });
  CHECK(after_send_first == std::vector<float>{1.25f, 0.25f});
  CHECK(after_recv_first == std::vector<float>{2.5f, 0.5f});
}

TEST_CASE("send_recv passes a ring on in one operation, and matches plain sends and receives", "[comm]") {
  // Each of three ranks sends its value to the next and takes the previous one's, twice; then rank 0
  // exchanges with rank 1 by send_recv while rank 1 uses a plain recv and send.
  InProcessWorld world(3, kGenerousTimeout);
  std::vector<std::vector<float>> got(3);
  std::vector<float> paired(2);
  run_rank_threads(world, 3, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1, 2}, "cp");
    const int64_t next = (rank + 1) % 3, previous = (rank + 2) % 3;
    float value = static_cast<float>(rank) + 0.5f;
    for (int step = 0; step < 2; ++step) {
      float arriving = -1;
      comm->send_recv(&value, next, &arriving, previous, 1, DType::kFloat32)->wait();
      value = arriving;
      got[static_cast<std::size_t>(rank)].push_back(arriving);
    }
    const float mine = 10.0f + static_cast<float>(rank);
    if (rank == 0) {
      comm->send_recv(&mine, 1, &paired[0], 1, 1, DType::kFloat32)->wait();
    } else if (rank == 1) {
      auto receiving = comm->recv(&paired[1], 1, DType::kFloat32, 0);
      comm->send(&mine, 1, DType::kFloat32, 0)->wait();
      receiving->wait();
    }
  });
  CHECK(got == std::vector<std::vector<float>>{{2.5f, 1.5f}, {0.5f, 2.5f}, {1.5f, 0.5f}});
  CHECK(paired == std::vector<float>{11.0f, 10.0f});
}

TEST_CASE("all_to_all hands each member its segment, own and empty ones included", "[comm]") {
  // Member r sends member p a segment of (r + 2p) % 4 elements (some empty), valued 100r + 10p + i.
  const auto segment = [](int64_t from, int64_t to) { return static_cast<std::size_t>((from + 2 * to) % 4); };
  for (const DType type : {DType::kFloat32, DType::kBFloat16}) {
    for (const int64_t ranks : {1, 2, 3}) {
      INFO(type_name(type) << ", " << ranks << " ranks");
      InProcessWorld world(ranks, kGenerousTimeout);
      std::vector<Bytes> received(static_cast<std::size_t>(ranks));
      std::vector<std::vector<float>> expected(static_cast<std::size_t>(ranks));
      for (int64_t to = 0; to < ranks; ++to) {
        for (int64_t from = 0; from < ranks; ++from) {
          for (std::size_t i = 0; i < segment(from, to); ++i) {
            expected[static_cast<std::size_t>(to)].push_back(static_cast<float>(100 * from + 10 * to) +
                                                             static_cast<float>(i));
          }
        }
      }
      run_rank_threads(world, ranks, [&](int64_t rank) {
        auto comm = world.group(rank, iota_ranks(ranks), "ep");
        std::vector<std::size_t> send_counts, recv_counts;
        std::vector<float> values;
        for (int64_t peer = 0; peer < ranks; ++peer) {
          send_counts.push_back(segment(rank, peer));
          recv_counts.push_back(segment(peer, rank));
          for (std::size_t i = 0; i < segment(rank, peer); ++i) {
            values.push_back(static_cast<float>(100 * rank + 10 * peer) + static_cast<float>(i));
          }
        }
        const Bytes input = encode(values, type);
        std::size_t incoming = 0;
        for (std::size_t count : recv_counts) incoming += count;
        Bytes output(incoming * dtype_bytes(type), std::byte{0xAB});
        comm->all_to_all(input.data(), send_counts, output.data(), recv_counts, type)->wait();
        received[static_cast<std::size_t>(rank)] = output;
      });
      for (int64_t rank = 0; rank < ranks; ++rank) {
        CHECK(decode(received[static_cast<std::size_t>(rank)], type) == expected[static_cast<std::size_t>(rank)]);
      }
    }
  }
}

TEST_CASE("all_to_all refuses counts that are not one per member, or disagree with the sender's", "[comm]") {
  InProcessWorld world(2, kGenerousTimeout);
  std::string refusal;
  const std::exception_ptr failure = failure_of(world, 2, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1}, "ep");
    float input[4] = {1, 2, 3, 4}, output[4] = {};
    if (rank == 0) {
      try {
        comm->all_to_all(input, {1}, output, {1, 1}, DType::kFloat32);
      } catch (const std::invalid_argument& error) {
        refusal = error.what();
      }
    }
    // Rank 1 expects 2 elements from rank 0, which sends 1.
    comm->all_to_all(input, {1, 1}, output, {rank == 1 ? 2u : 1u, 1}, DType::kFloat32)->wait();
  });
  CHECK(refusal == "all_to_all on group ep [0, 1]: send_counts has 1 entries for 2 members");
  REQUIRE_THROWS_MATCHES(std::rethrow_exception(failure), std::logic_error,
                         Catch::Message("rank 1: recv of 2 fp32 from rank 0 on group ep [0, 1] matched a send "
                                        "of 1 fp32"));
}

TEST_CASE("a recv waiting before its send arrives gets it", "[comm]") {
  InProcessWorld world(2, kGenerousTimeout);
  std::atomic<bool> recv_waiting{false};
  std::vector<uint16_t> received(3, 0);
  run_rank_threads(world, 2, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1}, "pp");
    if (rank == 1) {
      auto request = comm->recv(received.data(), 3, DType::kBFloat16, 0);
      recv_waiting = true;
      request->wait();
      return;
    }
    while (!recv_waiting) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(5));  // let rank 1 block in wait()
    const uint16_t message[3] = {float_to_bf16(1.5f), float_to_bf16(-2.0f), float_to_bf16(1e30f)};
    comm->send(message, 3, DType::kBFloat16, 1)->wait();
  });
  CHECK(received == std::vector<uint16_t>{float_to_bf16(1.5f), float_to_bf16(-2.0f), float_to_bf16(1e30f)});
}

TEST_CASE("a recv whose count or type differs from its send throws, naming both", "[comm]") {
  auto mismatch = [](std::size_t recv_count, DType recv_type) {
    InProcessWorld world(2, kGenerousTimeout);
    return failure_of(world, 2, [&](int64_t rank) {
      auto comm = world.group(rank, {0, 1}, "pp");
      float buffer[3] = {1, 2, 3};
      if (rank == 0) {
        comm->send(buffer, 2, DType::kFloat32, 1)->wait();
      } else {
        comm->recv(buffer, recv_count, recv_type, 0)->wait();
      }
    });
  };
  REQUIRE_THROWS_MATCHES(std::rethrow_exception(mismatch(3, DType::kFloat32)), std::logic_error,
                         Catch::Message("rank 1: recv of 3 fp32 from rank 0 on group pp [0, 1] matched a send "
                                        "of 2 fp32"));
  REQUIRE_THROWS_MATCHES(std::rethrow_exception(mismatch(2, DType::kBFloat16)), std::logic_error,
                         Catch::Message("rank 1: recv of 2 bf16 from rank 0 on group pp [0, 1] matched a send "
                                        "of 2 fp32"));
}

TEST_CASE("members calling different collectives fail with both calls named", "[comm]") {
  InProcessWorld world(2, kGenerousTimeout);
  const std::exception_ptr error = failure_of(world, 2, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1}, "tp");
    float data[4] = {};
    comm->all_reduce(data, rank == 0 ? 4 : 3, DType::kFloat32, ReduceOp::kSum)->wait();
  });
  // Whichever member arrived last throws logic_error; the other's CommAborted does not mask it.
  REQUIRE_THROWS_AS(std::rethrow_exception(error), std::logic_error);
  REQUIRE_THROWS_WITH(std::rethrow_exception(error),
                      Contains("collective mismatch on group tp [0, 1]: group rank 0 called all_reduce(4 fp32, "
                               "sum), group rank 1 called all_reduce(3 fp32, sum)"));
}

TEST_CASE("a rank that throws ends the ranks blocked in recv and all_reduce; its exception comes out", "[comm]") {
  InProcessWorld world(4, kGenerousTimeout);
  std::vector<std::string> others_saw(4);
  const auto start = std::chrono::steady_clock::now();
  const std::exception_ptr error = failure_of(world, 4, [&](int64_t rank) {
    auto pp = rank == 0 || rank == 3 ? world.group(rank, {0, 3}, "pp") : nullptr;
    auto tp = rank == 0 ? nullptr : world.group(rank, {1, 2, 3}, "tp");
    if (rank == 3) {
      std::this_thread::sleep_for(milliseconds(10));  // let the others block first
      throw std::runtime_error("rank three failed");
    }
    try {
      if (rank == 0) {
        float x = 0;
        pp->recv(&x, 1, DType::kFloat32, 1)->wait();
      } else {
        float x = 1;
        tp->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum)->wait();
      }
    } catch (const CommAborted& aborted) {
      others_saw[static_cast<std::size_t>(rank)] = aborted.what();
      throw;
    }
  });
  CHECK(std::chrono::steady_clock::now() - start < milliseconds(5000));  // abort, not the timeout
  REQUIRE(error);
  try {
    std::rethrow_exception(error);
  } catch (const CommAborted& aborted) {
    FAIL("the consequence came out instead of the cause: " << aborted.what());
  } catch (const std::runtime_error& failure) {
    CHECK(std::string(failure.what()) == "rank three failed");
  }
  CHECK(world.abort_reason() == "rank 3: rank three failed");
  for (std::size_t rank = 0; rank < 3; ++rank) CHECK(others_saw[rank] == "rank 3: rank three failed");
}

TEST_CASE("a SpecError from one rank comes out as a SpecError with its field", "[comm]") {
  InProcessWorld world(3, kGenerousTimeout);
  const std::exception_ptr error = failure_of(world, 3, [&](int64_t rank) {
    auto comm = world.group(rank, {0, 1, 2}, "dp");
    if (rank == 1) throw megaplan::SpecError("--tp", "must divide the 12 attention heads");
    comm->barrier();
  });
  REQUIRE(error);
  try {
    std::rethrow_exception(error);
  } catch (const megaplan::SpecError& spec_error) {
    CHECK(spec_error.field() == "--tp");
    CHECK(std::string(spec_error.what()) == "--tp: must divide the 12 attention heads");
  } catch (const std::exception& other) {
    FAIL("not a SpecError: " << other.what());
  }
  CHECK(world.abort_reason() == "rank 1: --tp: must divide the 12 attention heads");
}

TEST_CASE("after an abort every call and every wait throws the first reason", "[comm]") {
  InProcessWorld world(2, kGenerousTimeout);
  auto first = world.group(0, {0, 1}, "tp");
  auto second = world.group(1, {0, 1}, "tp");
  float x = 1;
  auto sent = first->send(&x, 1, DType::kFloat32, 1);
  CHECK_FALSE(world.aborted());
  CHECK(world.abort_reason().empty());
  world.abort("rank 0: first reason");
  world.abort("rank 1: second reason");
  CHECK(world.aborted());
  CHECK(world.abort_reason() == "rank 0: first reason");
  CHECK_THROWS_AS(sent->wait(), CommAborted);
  CHECK_THROWS_WITH(second->recv(&x, 1, DType::kFloat32, 0), "rank 0: first reason");
  CHECK_THROWS_WITH(first->send(&x, 1, DType::kFloat32, 1), "rank 0: first reason");
  CHECK_THROWS_WITH(first->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum), "rank 0: first reason");
  CHECK_THROWS_WITH(second->barrier(), "rank 0: first reason");
  // A group built after the abort is aborted too.
  auto late = world.group(0, {0}, "embedding");
  CHECK_THROWS_AS(late->broadcast(&x, 1, DType::kFloat32, 0), CommAborted);
}

TEST_CASE("group() checks its members; one communicator per member and group", "[comm]") {
  InProcessWorld world(4, kGenerousTimeout);
  CHECK_THROWS_AS(world.group(0, {}, "tp"), std::invalid_argument);
  CHECK_THROWS_AS(world.group(0, {0, 4}, "tp"), std::invalid_argument);
  CHECK_THROWS_AS(world.group(0, {0, 1, 0}, "tp"), std::invalid_argument);
  CHECK_THROWS_AS(world.group(2, {0, 1}, "tp"), std::invalid_argument);
  auto comm = world.group(3, {3, 1}, "dp");
  CHECK(comm->name() == "in-process-cpu");
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 2);
  CHECK(comm->global_ranks() == std::vector<int64_t>{3, 1});
  CHECK_THROWS_AS(world.group(3, {3, 1}, "dp"), std::logic_error);
  // The same ranks under another label are another group (Megatron's dp and dp-cp when cp = 1).
  CHECK(world.group(3, {3, 1}, "dp-cp")->rank() == 0);
  comm.reset();
  CHECK(world.group(3, {3, 1}, "dp")->rank() == 0);
  float x = 0;
  auto other = world.group(1, {3, 1}, "tp");
  CHECK_THROWS_AS(other->send(&x, 1, DType::kFloat32, 1), std::invalid_argument);  // itself
  CHECK_THROWS_AS(other->broadcast(&x, 1, DType::kFloat32, 2), std::invalid_argument);
  CHECK_FALSE(world.aborted());
}

TEST_CASE("a member that waits longer than the timeout aborts the world, naming op and group", "[comm]") {
  {
    InProcessWorld world(2, milliseconds(50));
    const std::exception_ptr error = failure_of(world, 2, [&](int64_t rank) {
      if (rank == 1) return;  // never joins
      auto comm = world.group(rank, {0, 1}, "tp");
      float x = 1;
      comm->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum)->wait();
    });
    REQUIRE_THROWS_MATCHES(std::rethrow_exception(error), CommAborted,
                           Catch::Message("rank 0: timed out after 50 ms in all_reduce on group tp [0, 1]; "
                                          "waiting for ranks [1]"));
    CHECK(world.abort_reason() ==
          "rank 0: timed out after 50 ms in all_reduce on group tp [0, 1]; "
          "waiting for ranks [1]");
  }
  {
    InProcessWorld world(3, milliseconds(50));
    const std::exception_ptr error = failure_of(world, 3, [&](int64_t rank) {
      if (rank != 2) return;
      auto comm = world.group(rank, {0, 2}, "pp");
      float x = 1;
      comm->recv(&x, 1, DType::kFloat32, 0)->wait();
    });
    REQUIRE_THROWS_MATCHES(std::rethrow_exception(error), CommAborted,
                           Catch::Message("rank 2: timed out after 50 ms in recv from rank 0 on group pp [0, 2]"));
  }
}
