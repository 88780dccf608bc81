// paged._paged, the Python extension under python/paged/__init__.py: an Engine built from engine flags and
// generating from sampling flags, both with the names and checks of the `paged` CLI (tools/cli.h), so that Python's
// keyword arguments mean what the command line's flags do. Outputs are returned as plain tuples; __init__.py shapes
// them as vLLM's RequestOutput. The GIL is released while the engine loads and generates; a generation looks at
// Python's signals about every 100 ms, so that Ctrl-C cancels it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <boost/json/parse.hpp>

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/engine.h"
#include "model/loader/generation_config.h"
#include "model/template/chat_template.h"
#include "tools/cli.h"

namespace py = pybind11;
using namespace paged;

namespace {

/// `flags` ("--name", "value", "--switch=true", ...) parsed as a command line after its subcommand.
cli::Args parse_flags(const std::vector<std::string>& flags) {
  std::vector<std::string> argv_text{"paged"};
  argv_text.insert(argv_text.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_text) argv.push_back(arg.data());
  return cli::Args(static_cast<int>(argv.size()), argv.data(), 1, cli::engine_switches());
}

/// Sampling parameters from sampling flags; UsageError naming a flag that is unknown or bad.
SamplingParams sampling_from_flags(const std::vector<std::string>& flags) {
  cli::Args args = parse_flags(flags);
  SamplingParams params = cli::sampling_params(args);
  args.reject_unknown();
  return params;
}

/// One generated sequence as Python sees it: (index, text, token_ids, cumulative_logprob, finish_reason,
/// logprobs: per token a list of (token_id, logprob, decoded_token), the sampled token first, then the alternatives).
using PyLogprob = std::tuple<TokenId, float, std::string>;
using PyCompletion =
    std::tuple<int, std::string, std::vector<TokenId>, double, std::string, std::vector<std::vector<PyLogprob>>>;
/// A prompt token scored (prompt_logprobs): (token_id, logprob, rank, decoded_token), the prompt's token first, then
/// the alternatives ranked 1, 2, ...
using PyPromptLogprob = std::tuple<TokenId, float, int, std::string>;
/// One request: (prompt, prompt_token_ids, completions, num_cached_tokens, prompt_logprobs: one list per prompt token
/// after the first; empty unless asked).
using PyRequestOutput = std::tuple<std::string, std::vector<TokenId>, std::vector<PyCompletion>, int,
                                   std::vector<std::vector<PyPromptLogprob>>>;

/// The engine with the model's chat template (loaded on first chat()).
class PyEngine {
 public:
  explicit PyEngine(const std::vector<std::string>& flags) {
    cli::Args args = parse_flags(flags);
    EngineConfig config = cli::engine_config(args);
    config.seed = cli::seed_flag(args);  // vLLM's LLM(seed=...): the seeds of requests that give none
    args.reject_unknown();
    py::gil_scoped_release unlocked;
    engine_ = std::make_unique<Engine>(std::move(config));
  }

  /// Generation from texts or token ids, in input order. `progress` (or None) is called with (finished prompts, all
  /// prompts, generated tokens) about every 100 ms and at the end. Ctrl-C (a pending KeyboardInterrupt, or any
  /// exception `progress` raises) cancels the batch: its requests are aborted and the exception propagates once
  /// every one ended.
  std::vector<PyRequestOutput> generate(const std::variant<std::vector<std::string>, std::vector<std::vector<TokenId>>>& prompts,
                                        const std::vector<std::string>& sampling_flags, const py::object& progress,
                                        int32_t lora) {
    SamplingParams params = sampling_from_flags(sampling_flags);
    params.lora = lora;
    std::vector<RequestOutput> outputs;
    bool python_error = false;  // the Python error indicator holds why the batch was cancelled
    const GenerateWatch watch = [&](const GenerateProgress& p) {
      py::gil_scoped_acquire locked;
      if (PyErr_CheckSignals() != 0) {  // runs Python's signal handlers: SIGINT raises KeyboardInterrupt
        python_error = true;
        return false;
      }
      if (progress.is_none()) return true;
      try {
        progress(p.finished, p.total, p.generated_tokens);
      } catch (py::error_already_set& e) {
        e.restore();
        python_error = true;
        return false;
      }
      return true;
    };
    try {
      py::gil_scoped_release unlocked;
      outputs = std::visit([&](const auto& p) { return engine_->generate(p, params, watch); }, prompts);
    } catch (const GenerationCancelled&) {
      if (!python_error) throw;
    }
    if (python_error) throw py::error_already_set();
    return convert(outputs);
  }

  /// Engine::load_lora with the GIL released: the adapter's id. ValueError for a bad adapter or a name taken.
  int32_t load_lora(const std::string& name, const std::string& path) {
    try {
      py::gil_scoped_release unlocked;
      return engine_->load_lora(name, path);
    } catch (const std::exception& e) {
      throw py::value_error(e.what());
    }
  }

  /// The prompt text of a conversation (`messages_json`: OpenAI messages as JSON) by the model's chat template, or
  /// by `template_source` when non-empty (with the model's special tokens, as a server's request template);
  /// `extra_json`: a JSON object of further template variables (tools, chat_template_kwargs' keys); with
  /// `continue_final` the text continues the final message (ChatTemplate::continue_final_message).
  std::string render_chat(const std::string& messages_json, const std::string& template_source,
                          bool add_generation_prompt, const std::string& extra_json, bool continue_final) {
    if (!model_template_loaded_) {
      model_template_ = ChatTemplate::load(engine_->config().model_dir);
      model_template_loaded_ = true;
    }
    std::optional<ChatTemplate> own;
    if (!template_source.empty())
      own = model_template_ ? model_template_->with_source(template_source)
                            : ChatTemplate::with_tokenizer_tokens(template_source, engine_->tokenizer());
    else if (!model_template_)
      throw std::invalid_argument("the model has no chat template: pass chat_template");
    const ChatTemplate& chat_template = own ? *own : *model_template_;
    const boost::json::value messages = boost::json::parse(messages_json);
    if (!messages.is_array()) throw std::invalid_argument("messages must be a list of {role, content}");
    const boost::json::value extra = boost::json::parse(extra_json.empty() ? "{}" : extra_json);
    if (!extra.is_object()) throw std::invalid_argument("chat_template_kwargs must be a dict");
    return continue_final ? chat_template.continue_final_message(messages.as_array(), extra.as_object())
                          : chat_template.apply(messages.as_array(), add_generation_prompt, extra.as_object());
  }

  /// The model's generation_config.json sampling defaults (vLLM's get_diff_sampling_param): the fields it sets, by
  /// SamplingParams' names (max_new_tokens as max_tokens).
  py::dict sampling_defaults() const {
    py::dict out;
    for_each_default(read_sampling_defaults(engine_->config().model_dir),
                     [&](const char* name, auto value) { out[name] = value; });
    return out;
  }

  /// Token ids of `text` (`add_special`: BOS and the like, as the tokenizer's config asks).
  std::vector<TokenId> encode(const std::string& text, bool add_special) const {
    return engine_->tokenizer().encode(text, add_special);
  }

  /// The text of `ids` (Hugging Face's decode).
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
    return engine_->tokenizer().decode(ids, skip_special_tokens);
  }

 private:
  std::vector<PyRequestOutput> convert(const std::vector<RequestOutput>& outputs) const {
    const Tokenizer& tok = engine_->tokenizer();
    auto piece = [&](TokenId id) { return tok.decode(std::span<const TokenId>(&id, 1), false); };
    std::vector<PyRequestOutput> result;
    for (const RequestOutput& out : outputs) {
      std::vector<PyCompletion> completions;
      for (const CompletionOutput& c : out.outputs) {
        std::vector<std::vector<PyLogprob>> logprobs;
        for (const SampledToken& s : c.logprobs) {
          std::vector<PyLogprob> position{{s.token, s.logprob, piece(s.token)}};
          for (const auto& [id, logprob] : s.top_logprobs) position.emplace_back(id, logprob, piece(id));
          logprobs.push_back(std::move(position));
        }
        completions.emplace_back(c.index, c.text, c.token_ids, c.cumulative_logprob, c.finish_reason,
                                 std::move(logprobs));
      }
      std::vector<std::vector<PyPromptLogprob>> prompt_logprobs;
      for (const PromptLogprob& scored : out.prompt_logprobs) {
        std::vector<PyPromptLogprob> position{{scored.token, scored.logprob, scored.rank, piece(scored.token)}};
        int rank = 0;
        for (const auto& [id, logprob] : scored.top_logprobs) position.emplace_back(id, logprob, ++rank, piece(id));
        prompt_logprobs.push_back(std::move(position));
      }
      result.emplace_back(out.prompt, out.prompt_token_ids, std::move(completions), out.num_cached_tokens,
                          std::move(prompt_logprobs));
    }
    return result;
  }

  std::unique_ptr<Engine> engine_;
  std::optional<ChatTemplate> model_template_;  // the model's, once model_template_loaded_
  bool model_template_loaded_ = false;
};

}  // namespace

PYBIND11_MODULE(_paged, m) {
  m.doc() = "paged's engine; use the paged package (LLM, SamplingParams) rather than this module";
  // A flag the engine does not know or a bad value (cli::UsageError) is the caller's mistake: ValueError, as are
  // requests the engine refuses (InvalidRequest, a std::invalid_argument, which pybind11 maps to ValueError).
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const cli::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::vector<std::string>&>(), py::arg("flags"))
      .def("generate", &PyEngine::generate, py::arg("prompts"), py::arg("sampling_flags"),
           py::arg("progress") = py::none(), py::arg("lora") = 0)
      .def("load_lora", &PyEngine::load_lora, py::arg("name"), py::arg("path"))
      .def("render_chat", &PyEngine::render_chat, py::arg("messages_json"), py::arg("template_source"),
           py::arg("add_generation_prompt"), py::arg("extra_json") = "", py::arg("continue_final") = false)
      .def("encode", &PyEngine::encode, py::arg("text"), py::arg("add_special"))
      .def("decode", &PyEngine::decode, py::arg("ids"), py::arg("skip_special_tokens"))
      .def("sampling_defaults", &PyEngine::sampling_defaults);
  m.def("check_sampling_flags", [](const std::vector<std::string>& flags) { sampling_from_flags(flags); },
        py::arg("flags"), "Raises ValueError naming a sampling flag that is unknown or has a bad value.");
}
