// SpecError: the one error type for bad user input (a spec, a plan, a file). It names the field
// that is wrong and the rule it breaks, so the CLI can print a single actionable line.
#pragma once

#include <stdexcept>
#include <string>

namespace megaplan {

class SpecError : public std::runtime_error {
 public:
  // `field` is what the user wrote or can find (a flag, a JSON key, "FILE:LINE:COL");
  // `rule` says what it must satisfy, ideally with the offending values.
  SpecError(std::string field, std::string rule)
      : std::runtime_error(field + ": " + rule), field_(std::move(field)), rule_(std::move(rule)) {}

  const std::string& field() const { return field_; }
  const std::string& rule() const { return rule_; }

 private:
  std::string field_;
  std::string rule_;
};

}  // namespace megaplan
