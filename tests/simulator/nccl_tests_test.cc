// nccl-tests output into link tables: the collective from the rows' shape, the group from the rank
// lines, the link from their hosts; a later import replaces the same op, group and link.
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "simulator/nccl_tests.h"
#include "simulator/profile.h"

namespace {

using megaplan::sim::read_nccl_tests;

// nccl-tests' layout: a settings line, the ranks, the two-line header, rows, a summary.
std::string output(int hosts, int ranks_per_host, const std::string& rows) {
  std::string text =
      "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20\n#\n# Using "
      "devices\n";
  for (int h = 0; h < hosts; ++h) {
    for (int r = 0; r < ranks_per_host; ++r) {
      text += "#  Rank " + std::to_string(h * ranks_per_host + r) + " Group  0 Pid " + std::to_string(1000 + r) +
              " on node" + std::to_string(h) + " device  " + std::to_string(r) +
              " [0000:1b:00] NVIDIA H100 80GB HBM3\n";
    }
  }
  text +=
      "#\n#                                                              out-of-place                       in-place\n"
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
      "#wrong\n"
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n";
  text += rows;
  text += "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 120.5\n";
  return text;
}

}  // namespace

TEST_CASE("an all-reduce on one host is an NVLink table of bus bandwidths", "[nccl-tests]") {
  const std::string rows =
      "           8             2     float     sum      -1    20.10    0.00    0.00      0    19.90    0.00    0.00   "
      "   0\n"
      "     1048576        262144     float     sum      -1    25.00   41.94   73.40      0    24.80   42.28   73.99   "
      "   0\n"
      "  1073741824     268435456     float     sum      -1   4600.0  233.42  408.49      0   4590.0  233.93  409.38   "
      "   0\n";
  const auto run = read_nccl_tests(output(1, 8, rows), "all_reduce.txt");
  CHECK(run.op == megaplan::CollectiveOp::kAllReduce);
  CHECK(run.group_size == 8);
  CHECK(run.link == "nvlink");
  CHECK(run.device == "NVIDIA H100 80GB HBM3");
  REQUIRE(run.bus_bandwidth.size() == 2);  // 0.00 GB/s rows are skipped
  CHECK(run.bus_bandwidth[1].first == 1073741824);
  CHECK(run.bus_bandwidth[1].second == Approx(408.49e9));

  // Into a profile's tables.
  nlohmann::json profile = megaplan::sim::with_link_tables(nlohmann::json::object(), {run});
  REQUIRE(profile["collectives"].size() == 2);
  CHECK(profile["collectives"][0]["op"] == "all_reduce");
  CHECK(profile["collectives"][0]["group_size"] == 8);
  // A second import of the same op, group and link replaces it, others stay.
  auto again = run;
  again.bus_bandwidth = {{4096, 1e9}};
  auto other = run;
  other.group_size = 4;
  profile = megaplan::sim::with_link_tables(profile, {again, other});
  CHECK(profile["collectives"].size() == 3);
}

TEST_CASE("the rows' shape tells all-gather, reduce-scatter, all-to-all and send/receive apart", "[nccl-tests]") {
  // 16 ranks on two hosts: the network. count x 4 bytes x 16 ranks = size.
  const std::string gathered =
      "     1048576         16384     float    none      -1    90.00   11.65   10.92      0    89.00   11.78   11.04   "
      "   0\n";
  const auto all_gather = read_nccl_tests(output(2, 8, gathered), "all_gather_16.txt");
  CHECK(all_gather.op == megaplan::CollectiveOp::kAllGather);
  CHECK(all_gather.group_size == 16);
  CHECK(all_gather.link == "network");
  CHECK(read_nccl_tests(output(2, 8, gathered), "alltoall_perf.log").op == megaplan::CollectiveOp::kAllToAll);
  const std::string scattered =
      "     1048576         16384     float     sum      -1    95.00   11.04   10.35      0    94.00   11.16   10.46   "
      "   0\n";
  CHECK(read_nccl_tests(output(2, 8, scattered), "rs.txt").op == megaplan::CollectiveOp::kReduceScatter);
  const std::string pairs =
      "     1048576        262144     float    none      -1    12.50   83.89   83.89      0    12.40   84.56   84.56   "
      "   0\n";
  const auto sendrecv = read_nccl_tests(output(1, 8, pairs), "sendrecv.txt");
  CHECK(sendrecv.op == megaplan::CollectiveOp::kSendRecv);
  REQUIRE(sendrecv.seconds.size() == 1);
  CHECK(sendrecv.seconds[0].second == Approx(12.5e-6));
  const nlohmann::json profile = megaplan::sim::with_link_tables(nlohmann::json::object(), {sendrecv});
  CHECK(profile["p2p"].size() == 1);
  CHECK(profile["p2p"][0]["link"] == "nvlink");
}

TEST_CASE("measured link entries replace those of the same link (and op and group size outside p2p)", "[nccl-tests]") {
  using nlohmann::json;
  json profile = {{"overlap",
                   {{{"op", "all_reduce"}, {"group_size", 2}, {"link", "nvlink"}, {"compute_slowdown", 0.3}},
                    {{"op", "all_reduce"}, {"group_size", 4}, {"link", "nvlink"}, {"compute_slowdown", 0.2}},
                    {{"op", "all_gather"}, {"group_size", 4}, {"link", "nvlink"}, {"compute_slowdown", 0.25}},
                    {{"op", "all_reduce"}, {"group_size", 4}, {"link", "network"}, {"compute_slowdown", 0.1}}}},
                  {"p2p",
                   {{{"link", "nvlink"}, {"bytes", 1024}, {"seconds", 1e-5}},
                    {{"link", "nvlink"}, {"bytes", 2048}, {"seconds", 2e-5}},
                    {{"link", "network"}, {"bytes", 1024}, {"seconds", 5e-5}}}}};
  megaplan::sim::replace_link_entries(
      profile, "overlap",
      json::array({{{"op", "all_reduce"}, {"group_size", 4}, {"link", "nvlink"}, {"compute_slowdown", 0.5}}}));
  const json& overlap = profile["overlap"];
  REQUIRE(overlap.size() == 4);  // only the nvlink all-reduce over 4 went; its successor comes last
  CHECK(overlap[0]["group_size"] == 2);
  CHECK(overlap[1]["op"] == "all_gather");
  CHECK(overlap[2]["link"] == "network");
  CHECK(overlap[3]["compute_slowdown"] == 0.5);
  // p2p entries carry no op or group size: a fresh nvlink table replaces every nvlink entry.
  megaplan::sim::replace_link_entries(profile, "p2p",
                                      json::array({{{"link", "nvlink"}, {"bytes", 4096}, {"seconds", 3e-5}}}));
  REQUIRE(profile["p2p"].size() == 2);
  CHECK(profile["p2p"][0]["link"] == "network");
  CHECK(profile["p2p"][1]["bytes"] == 4096);
  // A table that is absent (or not an array) starts empty.
  profile["collectives"] = "junk";
  megaplan::sim::replace_link_entries(profile, "collectives", json::array());
  CHECK(profile["collectives"] == json::array());
}

TEST_CASE("nccl-tests files it cannot read are refused with the file and the reason", "[nccl-tests]") {
  const auto refused = [](const std::string& text, const std::string& reason) {
    INFO(reason);
    try {
      (void)read_nccl_tests(text, "f.txt");
      FAIL("accepted");
    } catch (const megaplan::SpecError& error) {
      const std::string message = error.what();
      CHECK(message.find("--import-nccl-tests") != std::string::npos);
      CHECK(message.find("f.txt: " + reason) != std::string::npos);
    }
  };
  refused("hello\n", "no nccl-tests table");
  const std::string row =
      "     1048576        262144     float     sum      -1    25.00   41.94   73.40      0    24.80   42.28   73.99   "
      "   0\n";
  refused(output(1, 8,
                 "     1048576        262144     float     sum       0    25.00   41.94   73.40      0    24.80   "
                 "42.28   73.99      0\n"),
          "a rooted test");
  refused(output(1, 8, "     1048576        262144     float     sum      -1    25.00\n"),
          "line 16: a row with fewer columns");
  refused(output(1, 8,
                 "     1048576        262144    float7     sum      -1    25.00   41.94   73.40      0    24.80   "
                 "42.28   73.99      0\n"),
          "line 16: unknown data type \"float7\"");
  refused(output(1, 8,
                 "     1048577        262144     float     sum      -1    25.00   41.94   73.40      0    24.80   "
                 "42.28   73.99      0\n"),
          "line 16: size 1048577 is neither");
  refused(output(1, 8,
                 "     1048576        262144     float     sum      -1    25.00   41.94   -3.00      0    24.80   "
                 "42.28   73.99      0\n"),
          "line 16: size, count, time and busbw must be non-negative numbers");
  refused(output(1, 1, row), "no \"# Rank\" lines for at least 2 ranks");
}
