// The unit formatting the commands' tables share.
#include <catch2/catch.hpp>

#include "reports/text_table.h"

TEST_CASE("percentages have one decimal, and a sign where asked", "[reports]") {
  CHECK(megaplan::format_percent(0.1234) == "12.3%");
  CHECK(megaplan::format_percent(1.0) == "100.0%");
  CHECK(megaplan::format_percent(0.1234, true) == "+12.3%");
  CHECK(megaplan::format_percent(-0.04, true) == "-4.0%");
  CHECK(megaplan::format_percent(0.0, true) == "+0.0%");
}

TEST_CASE("memory is in GiB with two decimals, with or without its unit", "[reports]") {
  CHECK(megaplan::format_gib(85899345920.0) == "80.00 GiB");
  CHECK(megaplan::gib_number(1.5 * 1024 * 1024 * 1024) == "1.50");
  CHECK(megaplan::gib_number(0) == "0.00");
}
