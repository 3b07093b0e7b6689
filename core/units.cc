#include "core/units.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace megaplan {

namespace {

std::string printf_string(const char* format, double value, const char* unit) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value, unit);
  return buffer;
}

// Scales `value` by powers of `base` until it is below `base`, then prints it with a suffix.
std::string scaled(double value, double base, const std::vector<const char*>& suffixes, const char* format) {
  std::size_t index = 0;
  while (std::abs(value) >= base && index + 1 < suffixes.size()) {
    value /= base;
    ++index;
  }
  return printf_string(format, value, suffixes[index]);
}

}  // namespace

std::string format_count(double value) { return scaled(value, 1000.0, {"", "K", "M", "B", "T", "Q"}, "%.1f%s"); }

std::string format_flops(double flops) {
  return scaled(flops, 1000.0, {" FLOP", " KFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP", " EFLOP", " ZFLOP"},
                "%.2f%s");
}

std::string format_bytes(double bytes) {
  return scaled(bytes, 1024.0, {" B", " KiB", " MiB", " GiB", " TiB", " PiB"}, "%.1f%s");
}

std::string gib_number(double bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string format_gib(double bytes) { return gib_number(bytes) + " GiB"; }

std::string format_percent(double fraction, bool with_sign) {
  char text[64];
  std::snprintf(text, sizeof(text), with_sign ? "%+.1f%%" : "%.1f%%", 100 * fraction);
  return text;
}

std::string format_fixed(double value, int digits) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(digits);
  text << value;
  return text.str();
}

std::string format_significant(double value, int digits) {
  std::ostringstream text;
  text.precision(digits);
  text << value;
  return text.str();
}

std::string milliseconds_number(double seconds) { return format_fixed(seconds * 1e3, 3); }

std::string format_shortest(double value) {
  if (value == std::floor(value) && std::abs(value) < 1e15) return std::to_string(static_cast<int64_t>(value));
  for (int digits = 1; digits < 17; ++digits) {
    std::ostringstream shortest;
    shortest.precision(digits);
    shortest << value;
    if (std::stod(shortest.str()) == value) return shortest.str();
  }
  std::ostringstream text;  // 17 significant digits read back any double
  text.precision(17);
  text << value;
  return text.str();
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) return "unknown";
  if (seconds < 60) return format_fixed(seconds, 1) + " s";
  char text[64];
  const auto whole = static_cast<long long>(std::llround(seconds));
  if (whole < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", whole / 60, whole % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldh%02lldm", whole / 3600, (whole % 3600) / 60);
  }
  return text;
}

}  // namespace megaplan
