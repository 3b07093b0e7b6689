// Lowering: compute-only schedules become runnable ones. Sends and receives are inserted so that on
// every pair of ranks the receive order equals the send order (NCCL matches point-to-point calls
// in order): the sender places the receiver's RECV when it schedules the producing action, as
// torch.distributed.pipelining's _add_send_recv does. REDUCE_GRAD follows a stage's last weight
// gradient; OPTIM ends every rank. Stages on the same rank exchange nothing.
#pragma once

#include "core/schedule/schedule.h"

namespace megaplan {

// REQUIRES: !compute.lowered, and every action lies within the shape on its own rank. Throws SpecError("schedule", ...)
// when no rank can make progress (the compute order itself waits on something no rank will produce first).
PipelineSchedule lower_schedule(const PipelineSchedule& compute);

}  // namespace megaplan
