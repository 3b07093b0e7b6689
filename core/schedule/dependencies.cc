// The dependency rule.
#include "core/schedule/dependencies.h"

namespace megaplan {

std::vector<Action> dependencies(const Action& action, const ScheduleShape& shape, bool lowered) {
  std::vector<Action> needed;
  for_each_dependency(action, shape, lowered, [&](const Action& dependency) { needed.push_back(dependency); });
  return needed;
}

std::vector<DependencyKey> provided_keys(const Action& done) {
  std::vector<DependencyKey> keys;
  for_each_provided_key(done, [&](const DependencyKey& key) { keys.push_back(key); });
  return keys;
}

}  // namespace megaplan
