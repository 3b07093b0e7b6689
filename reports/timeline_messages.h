// The pipeline's messages on a timeline: each SEND slice with the RECV slice it pairs with, by
// core's pairing rule (matching_receive), for the Chrome trace's flow arrows and the HTML report's.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "core/timeline.h"

namespace megaplan {

// (send, receive) as indices into `slices`; a send whose receive is absent is left out.
std::vector<std::pair<std::size_t, std::size_t>> message_pairs(const std::vector<const TimelineSlice*>& slices);

}  // namespace megaplan
