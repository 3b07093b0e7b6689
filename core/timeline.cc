#include "core/timeline.h"

namespace megaplan {

std::string to_string(TimelineStream stream) {
  switch (stream) {
    case TimelineStream::kCompute: return "compute";
    case TimelineStream::kSend: return "send";
    case TimelineStream::kReceive: return "receive";
    case TimelineStream::kDataParallel: return "data-parallel";
  }
  return "?";
}

}  // namespace megaplan
