#include "core/edit_distance.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace megaplan {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> nearest_name(std::string_view name, std::span<const std::string_view> candidates) {
  const std::size_t allowed = std::max<std::size_t>(2, name.size() / 3);
  std::size_t best = std::numeric_limits<std::size_t>::max();
  std::optional<std::string> nearest;
  for (const std::string_view candidate : candidates) {
    const std::size_t distance = edit_distance(name, candidate);
    if (distance < best && distance <= allowed && distance < candidate.size() / 2) {
      best = distance;
      nearest = std::string(candidate);
    }
  }
  return nearest;
}

}  // namespace megaplan
