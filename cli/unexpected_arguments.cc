#include "cli/unexpected_arguments.h"

#include <sstream>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/edit_distance.h"

namespace megaplan::cli {

std::vector<std::string> long_flags(const CLI::App& command) {
  std::vector<std::string> flags;
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  }
  return flags;
}

std::string unexpected_arguments_line(const CLI::App& app, const std::string& what) {
  // CLI11 keeps no list on the error: its message ends with the arguments, last given first.
  const std::size_t colon = what.find(": ");
  if (colon == std::string::npos) return what;
  std::vector<std::string> extras;
  std::istringstream words(what.substr(colon + 2));
  for (std::string word; words >> word;) extras.insert(extras.begin(), word);
  if (extras.empty()) return what;
  const std::string& word = extras.front();
  const CLI::App* command = &app;
  std::string name = "megaplan";
  for (const CLI::App* selected = &app; !selected->get_subcommands().empty();) {
    selected = selected->get_subcommands().back();
    command = selected;
    name += " " + selected->get_name();
  }
  const std::vector<std::string> flags = long_flags(*command);
  const std::vector<std::string_view> candidates(flags.begin(), flags.end());
  const std::string flag = word.substr(0, word.find('='));
  const std::optional<std::string> nearest = word.rfind("--", 0) == 0 ? nearest_name(flag, candidates) : std::nullopt;
  return (word.rfind("-", 0) == 0 ? flag : word) + ": is not an argument of `" + name + "` (see " + name + " --help)" +
         (nearest ? "; did you mean " + *nearest + "?" : "");
}

}  // namespace megaplan::cli
