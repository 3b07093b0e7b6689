// Levenshtein distance, for did-you-mean suggestions (flags, preset names).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace megaplan {

// The fewest single-character insertions, deletions and substitutions that turn `a` into `b`.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name` when it is close for its length: within a third of the name
// (at least two edits) and under half the candidate's length, so "--lr" never suggests "--tp".
// The first of equally near candidates wins.
std::optional<std::string> nearest_name(std::string_view name, std::span<const std::string_view> candidates);

}  // namespace megaplan
