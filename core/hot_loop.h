// MEGAPLAN_HOT_LOOP marks a function whose loop runs once per action or event of schedules with up
// to a million of them (the simulator's event loop, lowering's rounds, validation's walk): GCC's
// flatten attribute inlines every call inside it, helpers of helpers included, which keeps each
// step a few dozen instructions (docs/results.md: validating the 1.57 M-action benchmark schedule
// went from 463 M to 286 M instructions).
// Sanitizer builds (MEGAPLAN_SANITIZED, set by CMake for AddressSanitizer, UndefinedBehaviorSanitizer
// and ThreadSanitizer) leave it out: instrumented, the flattened event loop alone took GCC 12 over
// seven minutes to compile, the CI's longest step, and its speed does not matter there.
#pragma once

#if defined(MEGAPLAN_SANITIZED)
#define MEGAPLAN_HOT_LOOP
#else
#define MEGAPLAN_HOT_LOOP [[gnu::flatten]]
#endif
