// The units every command and report prints with.
#include <catch2/catch.hpp>

#include "core/units.h"

#include <string>

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

TEST_CASE("fixed, significant and millisecond numbers", "[reports]") {
  CHECK(megaplan::format_fixed(2.34567, 3) == "2.346");
  CHECK(megaplan::format_fixed(-0.5, 0) == "-0");
  CHECK(megaplan::format_significant(0.0123456, 4) == "0.01235");
  CHECK(megaplan::format_significant(12.0, 4) == "12");
  CHECK(megaplan::milliseconds_number(0.0123456) == "12.346");
  CHECK(megaplan::format_bytes(1536) == "1.5 KiB");
  CHECK(megaplan::format_flops(2.5e18) == "2.50 EFLOP");
  CHECK(megaplan::format_count(174.56e9) == "174.6B");
}

TEST_CASE("durations for people", "[reports]") {
  CHECK(megaplan::format_duration(42.04) == "42.0 s");
  CHECK(megaplan::format_duration(725) == "12m05s");
  CHECK(megaplan::format_duration(11040) == "3h04m");
  CHECK(megaplan::format_duration(-1) == "unknown");
}

TEST_CASE("numbers a program reads back: integers whole, others the shortest decimal", "[reports]") {
  CHECK(megaplan::format_shortest(500000) == "500000");
  CHECK(megaplan::format_shortest(1e-5) == "1e-05");
  CHECK(megaplan::format_shortest(0.1) == "0.1");
  CHECK(megaplan::format_shortest(-2.5) == "-2.5");
  CHECK(std::stod(megaplan::format_shortest(1.0 / 3)) == 1.0 / 3);  // 17 digits where fewer do not read back
}
