// Units for every number megaplan prints, one set for the commands' text and errors, their
// tables and the reports: counts, FLOPs, bytes, memory (always GiB), percentages, seconds.
#pragma once

#include <string>

namespace megaplan {

// Human-readable quantities: 174.56e9 -> "174.6B"; 2.5e18 FLOPs -> "2.50 EFLOP";
// 1536 bytes -> "1.5 KiB".
std::string format_count(double value);
std::string format_flops(double flops);
std::string format_bytes(double bytes);
// Memory, always in GiB with two decimals, so that columns and reports compare: "80.00 GiB";
// gib_number: the number alone, for a column headed in GiB.
std::string format_gib(double bytes);
std::string gib_number(double bytes);
// A fraction as a percentage with one decimal: 0.1234 -> "12.3%"; `with_sign`: "+12.3%", "-4.0%".
std::string format_percent(double fraction, bool with_sign = false);
// `digits` after the point: (2.34567, 3) -> "2.346".
std::string format_fixed(double value, int digits);
// `digits` significant digits, as a table of seconds shows them: (0.0123456, 4) -> "0.01235".
std::string format_significant(double value, int digits);
// Seconds as milliseconds with three decimals, the number alone: 0.0123456 -> "12.346".
std::string milliseconds_number(double seconds);
// Whole numbers as integers ("500000"), others as the shortest decimal that reads back as the
// value ("1e-05", "0.1"): a number a program reads back, as flags and configs take them.
std::string format_shortest(double value);
// A duration for people: "42.0 s", "12m05s", "3h04m" (under a minute, minutes, hours).
std::string format_duration(double seconds);

}  // namespace megaplan
