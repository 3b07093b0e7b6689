// stream_of: the one rule that puts each action kind on a timeline stream.
#include <catch2/catch.hpp>

#include "core/schedule/action.h"
#include "core/timeline.h"

using megaplan::ActionKind;
using megaplan::TimelineStream;

TEST_CASE("stream_of puts compute, sends, receives and REDUCE_GRAD on their own streams", "[timeline]") {
  for (ActionKind kind : {ActionKind::kForward, ActionKind::kBackward, ActionKind::kBackwardInput,
                          ActionKind::kBackwardWeight, ActionKind::kOverlapForwardBackward, ActionKind::kOptimizer}) {
    INFO(megaplan::action_kind_token(kind));
    CHECK(megaplan::stream_of(kind) == TimelineStream::kCompute);
  }
  CHECK(megaplan::stream_of(ActionKind::kSendForward) == TimelineStream::kSend);
  CHECK(megaplan::stream_of(ActionKind::kSendBackward) == TimelineStream::kSend);
  CHECK(megaplan::stream_of(ActionKind::kRecvForward) == TimelineStream::kReceive);
  CHECK(megaplan::stream_of(ActionKind::kRecvBackward) == TimelineStream::kReceive);
  CHECK(megaplan::stream_of(ActionKind::kReduceGrad) == TimelineStream::kDataParallel);
  static_assert(megaplan::stream_of(ActionKind::kReduceGrad) == TimelineStream::kDataParallel);
}

TEST_CASE("every stream has a name", "[timeline]") {
  CHECK(megaplan::to_string(TimelineStream::kCompute) == "compute");
  CHECK(megaplan::to_string(TimelineStream::kSend) == "send");
  CHECK(megaplan::to_string(TimelineStream::kReceive) == "receive");
  CHECK(megaplan::to_string(TimelineStream::kDataParallel) == "data-parallel");
  CHECK(megaplan::kTimelineStreamCount == 4);
}
