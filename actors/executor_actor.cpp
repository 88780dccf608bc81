#include "actors/actors.h"

namespace paged {

caf::behavior executor_actor(caf::event_based_actor* /*self*/, std::shared_ptr<ModelRunner> runner) {
  return {
      [runner](step_atom, const StepMsg& msg) -> StepResult { return runner->execute(*msg.batch); },
      [runner](swap_out_atom, const std::vector<BlockPair>& pairs) -> bool {
        runner->swap_out(pairs);
        return true;
      },
      [runner](swap_in_atom, const std::vector<BlockPair>& pairs) -> bool {
        runner->swap_in(pairs);
        return true;
      },
  };
}

}  // namespace paged
