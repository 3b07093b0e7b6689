// Action text form: torch.distributed.pipelining's spellings round-trip; bad text is refused.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/schedule/action.h"

using Catch::Matchers::Contains;
using megaplan::ActionKind;

TEST_CASE("actions print as torch writes them and parse back", "[schedule][action]") {
  for (const char* text : {"2F0", "1B3", "0I12", "3W7", "0SEND_F1", "1RECV_F1", "2SEND_B0", "2RECV_B10", "1REDUCE_GRAD",
                           "OPTIM", "(0F3;3B1)OVERLAP_F_B", "(1F0;2I4)OVERLAP_F_B"}) {
    INFO(text);
    CHECK(megaplan::to_string(megaplan::parse_action(text, "t.csv")) == text);
  }
  const megaplan::Action send = megaplan::parse_action("0SEND_F1", "t.csv");
  CHECK(send.kind == ActionKind::kSendForward);
  CHECK(send.stage == 0);
  CHECK(send.microbatch == 1);
  const megaplan::Action reduce = megaplan::parse_action("12REDUCE_GRAD", "t.csv");
  CHECK(reduce.kind == ActionKind::kReduceGrad);
  CHECK(reduce.stage == 12);
  CHECK(reduce.microbatch == -1);
  const megaplan::Action overlap = megaplan::parse_action("(0F3;3B1)OVERLAP_F_B", "t.csv");
  const megaplan::ActionParts parts = megaplan::parts_of(overlap);
  REQUIRE(parts.count == 2);
  CHECK(parts.parts[0] == megaplan::forward(0, 3));
  CHECK(parts.parts[1] == megaplan::backward(3, 1));
  CHECK(megaplan::to_string(overlap) == "(0F3;3B1)OVERLAP_F_B");
  CHECK(megaplan::parts_of(megaplan::forward(2, 5)).count == 1);
  CHECK(megaplan::to_string({megaplan::forward(0, 0), megaplan::backward(1, 2)}) == "0F0 1B2");
}

TEST_CASE("unknown or malformed actions are refused with the text", "[schedule][action]") {
  CHECK_THROWS_WITH(megaplan::parse_action("0X1", "t.csv"), "t.csv: unknown action \"0X1\"");
  CHECK_THROWS_WITH(megaplan::parse_action("F1", "t.csv"),
                    "t.csv: unknown action \"F1\": expected a stage number first");
  CHECK_THROWS_WITH(megaplan::parse_action("0F", "t.csv"), "t.csv: unknown action \"0F\": F needs a microbatch number");
  CHECK_THROWS_WITH(megaplan::parse_action("0REDUCE_GRAD3", "t.csv"), Contains("REDUCE_GRAD takes no microbatch"));
  CHECK_THROWS_WITH(megaplan::parse_action("(0F3)OVERLAP_F_B", "t.csv"), Contains("OVERLAP_F_B needs two actions"));
  CHECK_THROWS_WITH(megaplan::parse_action("(0SEND_F3;1B0)OVERLAP_F_B", "t.csv"),
                    Contains("OVERLAP_F_B overlaps a forward, then a backward"));
  CHECK_THROWS_WITH(megaplan::parse_action("9999999999F0", "t.csv"), Contains("index too large"));
  CHECK_THROWS_WITH(megaplan::parse_action("", "t.csv"), Contains("unknown action \"\""));
  // Issue 42: nested overlaps (20,000 deep once took 21 s and 5 GB before a raw bad_alloc) and cells
  // longer than any action are refused before they are parsed; the longest action still parses.
  CHECK_THROWS_WITH(megaplan::parse_action("((0F3;3B1)OVERLAP_F_B;3B1)OVERLAP_F_B", "t.csv"),
                    Contains("OVERLAP_F_B overlaps two plain actions (no nesting)"));
  std::string nested = std::string(20000, '(') + "0F3";
  for (int depth = 0; depth < 20000; ++depth) nested += ";3B1)OVERLAP_F_B";
  CHECK_THROWS_WITH(megaplan::parse_action(nested, "t.csv"),
                    Contains("t.csv: an action of " + std::to_string(nested.size()) + " characters"));
  CHECK(megaplan::to_string(megaplan::parse_action("(999999999F999999999;999999999I999999999)OVERLAP_F_B", "t.csv")) ==
        "(999999999F999999999;999999999I999999999)OVERLAP_F_B");
}
