#include "actors/messages.h"

namespace paged {

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<SampledToken>("paged.SampledToken");
  cfg.add_message_type<std::vector<SampledToken>>("paged.SampledTokens");
  cfg.add_message_type<SeqOutput>("paged.SeqOutput");
  cfg.add_message_type<std::vector<SeqOutput>>("paged.SeqOutputs");
  cfg.add_message_type<ComputedKv>("paged.ComputedKv");
  cfg.add_message_type<std::vector<ComputedKv>>("paged.ComputedKvs");
  cfg.add_message_type<PlanSeq>("paged.PlanSeq");
  cfg.add_message_type<std::vector<PlanSeq>>("paged.PlanSeqs");
  cfg.add_message_type<PlanLimits>("paged.PlanLimits");
  cfg.add_message_type<StepPlan>("paged.StepPlan");
  cfg.add_message_type<StepResult>("paged.StepResult");
  cfg.add_message_type<std::vector<BlockPair>>("paged.BlockPairs");
  cfg.add_message_type<std::vector<SeqId>>("paged.SeqIds");
  cfg.add_message_type<std::vector<TokenId>>("paged.TokenIds");
  cfg.add_message_type<NcclUniqueId>("paged.NcclUniqueId");
  cfg.add_message_type<RankReady>("paged.RankReady");
  cfg.add_message_type<WireStep>("paged.WireStep");
  cfg.add_message_type<WorkerInfo>("paged.WorkerInfo");
}

}  // namespace paged
