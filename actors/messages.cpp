#include "actors/messages.h"

namespace paged {

namespace {

const caf::atom_value executor_error_category = caf::atom("executor");

}  // namespace

std::string to_string(ExecutorError code) {
  switch (code) {
    case ExecutorError::invalid_step: return "invalid step";
    case ExecutorError::invalid_swap: return "invalid swap order";
    case ExecutorError::refused: return "refused";
    case ExecutorError::runner_failed: return "the runner failed";
    case ExecutorError::invalid_result: return "invalid step result";
  }
  return "executor error " + std::to_string(static_cast<int>(code));
}

caf::error make_error(ExecutorError code, std::string message) {
  return {static_cast<uint8_t>(code), executor_error_category, caf::make_message(std::move(message))};
}

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<SampledToken>("paged.SampledToken");
  cfg.add_message_type<std::vector<SampledToken>>("paged.SampledTokens");
  cfg.add_message_type<SeqOutput>("paged.SeqOutput");
  cfg.add_message_type<std::vector<SeqOutput>>("paged.SeqOutputs");
  cfg.add_message_type<ComputedKv>("paged.ComputedKv");
  cfg.add_message_type<std::vector<ComputedKv>>("paged.ComputedKvs");
  cfg.add_message_type<PlanLimits>("paged.PlanLimits");
  cfg.add_message_type<StepPlan>("paged.StepPlan");
  cfg.add_message_type<StepResult>("paged.StepResult");
  cfg.add_message_type<ChunkPromptLogprobs>("paged.ChunkPromptLogprobs");
  cfg.add_message_type<std::vector<BlockPair>>("paged.BlockPairs");
  cfg.add_message_type<DiskOrder>("paged.DiskOrder");
  cfg.add_message_type<std::vector<DiskOrder>>("paged.DiskOrders");
  cfg.add_message_type<std::vector<uint64_t>>("paged.U64s");
  cfg.add_message_type<std::vector<SeqId>>("paged.SeqIds");
  cfg.add_message_type<std::vector<TokenId>>("paged.TokenIds");
  cfg.add_message_type<KvSnapshot>("paged.KvSnapshot");
  cfg.add_message_type<NcclUniqueId>("paged.NcclUniqueId");
  cfg.add_message_type<RankReady>("paged.RankReady");
  cfg.add_message_type<PackedStep>("paged.PackedStep");
  cfg.add_message_type<PackedResult>("paged.PackedResult");
  cfg.add_message_type<WorkerInfo>("paged.WorkerInfo");
  cfg.add_error_category(executor_error_category, [](uint8_t code, caf::atom_value, const caf::message& context) {
    std::string text = to_string(static_cast<ExecutorError>(code));
    if (context.match_elements<std::string>()) text += ": " + context.get_as<std::string>(0);
    return text;
  });
}

}  // namespace paged
