"""paged from Python, in vLLM's shape:

    from paged import LLM, SamplingParams
    llm = LLM(model="models/stories260K")
    outputs = llm.generate(["Once upon a time"], SamplingParams(max_tokens=32, temperature=0))

Engine and sampling arguments take vLLM's names; they become the `paged` CLI's flags (block_size -> --block-size),
so they mean, and are checked, as on the command line: an unknown or unsupported one raises ValueError naming it.
"""
import json
import sys
import time

from . import _paged

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams", "RequestOutput",
           "CompletionOutput", "Logprob", "BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence", "LoRARequest"]

# vLLM's engine argument names that the CLI spells otherwise.
_ENGINE_ALIASES = {"num_gpu_blocks_override": "num_kv_blocks"}


def _flags(kwargs, aliases=None):
    """CLI flags of keyword arguments: name=value -> --name value; booleans as --name=true|false; a list as the
    flag repeated for `stop` and `bad_words`, else its items joined by commas; a dict as KEY:VALUE pairs joined by
    commas; None: the default (no flag)."""
    flags = []
    for key, value in kwargs.items():
        if value is None:
            continue
        name = "--" + (aliases or {}).get(key, key).replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"{name}={'true' if value else 'false'}")
        elif isinstance(value, dict):  # logit_bias: token id -> bias
            flags += [name, ",".join(f"{k}:{v}" for k, v in value.items())]
        elif isinstance(value, (list, tuple)):
            if key in ("stop", "bad_words"):
                for item in value:
                    flags += [name, str(item)]
            else:
                flags += [name, ",".join(str(item) for item in value)]
        else:
            flags += [name, str(value)]
    return flags


class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams: one of json (a schema, as a dict or JSON text), regex, choice (a list of
    strings), grammar (GBNF), structural_tag (JSON text or a dict: {"triggers", "structures"}) or json_object=True; for JSON, disable_any_whitespace or whitespace_pattern;
    disable_fallback and disable_additional_properties are taken and change nothing (one engine; an absent
    additionalProperties is false already). Any other argument raises TypeError."""

    _FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag", "disable_any_whitespace",
               "whitespace_pattern", "disable_fallback", "disable_additional_properties")

    def __init__(self, json=None, regex=None, choice=None, grammar=None, json_object=None, structural_tag=None,
                 disable_any_whitespace=False, whitespace_pattern=None, disable_fallback=False,
                 disable_additional_properties=False):
        self.json, self.regex, self.choice, self.grammar, self.json_object = json, regex, choice, grammar, json_object
        self.structural_tag = structural_tag
        self.disable_any_whitespace, self.whitespace_pattern = disable_any_whitespace, whitespace_pattern
        self.disable_fallback, self.disable_additional_properties = disable_fallback, disable_additional_properties

    def _flags(self):
        """The CLI's --guided-* flags, each as --name=value (a value may begin with "--")."""
        flags = []
        if self.json is not None:
            text = self.json if isinstance(self.json, str) else json.dumps(self.json)
            flags.append("--guided-json=" + text)
        if self.regex is not None:
            flags.append("--guided-regex=" + self.regex)
        if self.choice is not None:
            flags.append("--guided-choice=" + json.dumps(list(self.choice)))
        if self.grammar is not None:
            flags.append("--guided-grammar=" + self.grammar)
        if self.json_object:
            flags.append("--guided-json-object")
        if self.structural_tag is not None:  # vLLM's: the tag as JSON text (a dict is taken too)
            text = self.structural_tag if isinstance(self.structural_tag, str) else json.dumps(self.structural_tag)
            flags.append("--guided-structural-tag=" + text)
        if self.disable_any_whitespace and self.whitespace_pattern is not None:
            raise ValueError("disable_any_whitespace and whitespace_pattern are both given")
        if self.disable_any_whitespace:
            flags.append("--guided-whitespace-pattern=")
        elif self.whitespace_pattern is not None:
            flags.append("--guided-whitespace-pattern=" + self.whitespace_pattern)
        return flags

    def __repr__(self):
        return "StructuredOutputsParams(" + ", ".join(
            f"{k}={getattr(self, k)!r}" for k in self._FIELDS if getattr(self, k) not in (None, False)) + ")"


# vLLM's earlier name for them (SamplingParams(guided_decoding=...)).
GuidedDecodingParams = StructuredOutputsParams


class SamplingParams:
    """vLLM's SamplingParams: n, best_of, use_beam_search, max_tokens (16), min_tokens, temperature (1.0), top_p,
    top_k, min_p, seed, repetition_penalty, presence_penalty, frequency_penalty, logit_bias (a dict of token id to
    bias), stop (a string or a list), stop_token_ids, allowed_token_ids, bad_words, ignore_eos, skip_special_tokens, logprobs, structured_outputs (a
    StructuredOutputsParams; also as guided_decoding, vLLM's earlier name). Any other argument raises ValueError."""

    def __init__(self, **kwargs):
        if isinstance(kwargs.get("stop"), str):
            kwargs["stop"] = [kwargs["stop"]]
        self._kwargs = dict(kwargs)
        structured = [kwargs.pop(k) for k in ("structured_outputs", "guided_decoding") if kwargs.get(k) is not None]
        if len(structured) > 1:
            raise ValueError("structured_outputs and guided_decoding are both given")
        for s in structured:
            if not isinstance(s, StructuredOutputsParams):
                raise ValueError("structured_outputs must be a StructuredOutputsParams")
        self._flags = _flags(kwargs) + (structured[0]._flags() if structured else [])
        _paged.check_sampling_flags(self._flags)

    def __getattr__(self, name):
        kwargs = self.__dict__.get("_kwargs", {})
        if name in kwargs:
            return kwargs[name]
        raise AttributeError(name)

    def __repr__(self):
        return "SamplingParams(" + ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items()) + ")"


class BeamSearchParams:
    """vLLM's BeamSearchParams for LLM.beam_search: beam_width, max_tokens, ignore_eos, temperature (0: the search
    ranks by the model's log-probabilities; another value raises ValueError), length_penalty (hypotheses rank by
    cumulative logprob / length^length_penalty), include_stop_str_in_output."""

    def __init__(self, beam_width, max_tokens, ignore_eos=False, temperature=0.0, length_penalty=1.0,
                 include_stop_str_in_output=False):
        self.beam_width, self.max_tokens, self.ignore_eos = beam_width, max_tokens, ignore_eos
        self.temperature, self.length_penalty = temperature, length_penalty
        self.include_stop_str_in_output = include_stop_str_in_output

    def _sampling_params(self):
        # The beams' logprobs hold the 2 x beam_width offers each step looked at (vLLM's), at most 20.
        return SamplingParams(use_beam_search=True, n=self.beam_width, max_tokens=self.max_tokens,
                              ignore_eos=self.ignore_eos, temperature=self.temperature,
                              length_penalty=self.length_penalty,
                              include_stop_str_in_output=self.include_stop_str_in_output,
                              logprobs=min(2 * self.beam_width, 20))


class BeamSearchSequence:
    """One hypothesis of a beam search (vLLM's): tokens (the prompt's, then the output's), logprobs (per output token
    a dict token id -> Logprob), cum_logprob, text (the tokens decoded, prompt included), finish_reason."""

    def __init__(self, tokens, logprobs, cum_logprob, text, finish_reason):
        self.tokens, self.logprobs, self.cum_logprob = tokens, logprobs, cum_logprob
        self.text, self.finish_reason = text, finish_reason

    def __repr__(self):
        return (f"BeamSearchSequence(tokens={self.tokens}, cum_logprob={self.cum_logprob!r}, text={self.text!r}, "
                f"finish_reason={self.finish_reason!r})")


class BeamSearchOutput:
    """A prompt's beam search result (vLLM's): sequences, the beam_width best hypotheses, best first."""

    def __init__(self, sequences):
        self.sequences = sequences

    def __repr__(self):
        return f"BeamSearchOutput(sequences={self.sequences!r})"


class Logprob:
    """One token's log-probability: logprob, rank (1: the most likely; None for a sampled token outside the
    alternatives asked for), decoded_token."""

    def __init__(self, logprob, rank, decoded_token):
        self.logprob, self.rank, self.decoded_token = logprob, rank, decoded_token

    def __repr__(self):
        return f"Logprob(logprob={self.logprob!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"


class CompletionOutput:
    """One generated sequence: index, text, token_ids, cumulative_logprob, logprobs (per token a dict token id ->
    Logprob, the sampled token and the alternatives; None unless asked for), finish_reason ("stop" | "length")."""

    def __init__(self, index, text, token_ids, cumulative_logprob, finish_reason, logprobs):
        self.index, self.text, self.token_ids = index, text, list(token_ids)
        self.cumulative_logprob, self.finish_reason, self.logprobs = cumulative_logprob, finish_reason, logprobs

    def __repr__(self):
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, token_ids={self.token_ids}, "
                f"cumulative_logprob={self.cumulative_logprob!r}, finish_reason={self.finish_reason!r})")


class RequestOutput:
    """One prompt's outputs: prompt, prompt_token_ids, prompt_logprobs (with SamplingParams(prompt_logprobs=k): None
    for the first token, then per token a dict token id -> Logprob, the prompt's token and k alternatives; else
    None), outputs (CompletionOutput, n of them), num_cached_tokens (its prompt tokens found in the prefix cache),
    finished."""

    def __init__(self, prompt, prompt_token_ids, outputs, num_cached_tokens=0, prompt_logprobs=None):
        self.prompt, self.prompt_token_ids, self.outputs = prompt, list(prompt_token_ids), outputs
        self.num_cached_tokens, self.prompt_logprobs = num_cached_tokens, prompt_logprobs
        self.finished = True

    def __repr__(self):
        return (f"RequestOutput(prompt={self.prompt!r}, prompt_token_ids={self.prompt_token_ids}, "
                f"outputs={self.outputs!r})")


def _prompt_logprobs(positions):
    """vLLM's prompt_logprobs: None for the first prompt token, then per token a dict token id -> Logprob of the
    prompt's token (with its rank) and the alternatives."""
    result = [None]
    for position in positions:
        entry = {}
        for tid, lp, rank, text in position:  # the prompt's token first: an alternative equal to it is itself
            entry.setdefault(tid, Logprob(lp, rank, text))
        result.append(entry)
    return result


def _logprobs(positions, asked):
    """vLLM's per-token dicts of (token_id, logprob, decoded_token) lists, the sampled token first."""
    if not asked:
        return None
    result = []
    for sampled, *alternatives in positions:
        entry = {tid: Logprob(lp, rank, text) for rank, (tid, lp, text) in enumerate(alternatives, 1)}
        if sampled[0] not in entry:
            entry = {sampled[0]: Logprob(sampled[1], None, sampled[2]), **entry}
        result.append(entry)
    return result


class LoRARequest:
    """vLLM's LoRARequest(lora_name, lora_int_id, lora_path): a PEFT LoRA adapter folder for generate's and chat's
    lora_request (an LLM built with enable_lora=True). The engine loads it on its first use; lora_int_id names it
    afterwards, so one id stands for one adapter."""

    def __init__(self, lora_name, lora_int_id, lora_path):
        if not isinstance(lora_name, str) or not lora_name:
            raise ValueError("lora_name must be a non-empty string")
        if not isinstance(lora_int_id, int) or lora_int_id < 1:
            raise ValueError("lora_int_id must be an integer >= 1")
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, str(lora_path)

    def __repr__(self):
        return f"LoRARequest(lora_name={self.lora_name!r}, lora_int_id={self.lora_int_id}, lora_path={self.lora_path!r})"


class _ProgressBar:
    """A tqdm-like bar of a batch on `stream`: "Processed prompts:  40%|████      | 4/10 [00:01<00:02, 3.1 it/s,
    512.0 tok/s]", redrawn in place at most 10 times a second, ended with a newline."""

    WIDTH = 20

    def __init__(self, stream):
        self._stream, self._start, self._drawn = stream, time.monotonic(), 0.0

    def update(self, finished, total, tokens, final=False):
        now = time.monotonic()
        if not final and now - self._drawn < 0.1:
            return
        self._drawn = now
        elapsed = max(now - self._start, 1e-9)
        fraction = finished / total if total else 1.0
        eighths = int(fraction * self.WIDTH * 8)
        bar = "█" * (eighths // 8) + ("" if eighths % 8 == 0 else " ▏▎▍▌▋▊▉"[eighths % 8])
        rate = finished / elapsed
        clock = lambda s: f"{int(s) // 60:02d}:{int(s) % 60:02d}"
        left = clock((total - finished) / rate) if rate > 0 else "?"
        self._stream.write(f"\rProcessed prompts: {100 * fraction:3.0f}%|{bar:<{self.WIDTH}}| {finished}/{total} "
                           f"[{clock(elapsed)}<{left}, {rate:.2f} it/s, {tokens / elapsed:.1f} tok/s]")
        if final:
            self._stream.write("\n")
        self._stream.flush()


class LLM:
    """vLLM's offline LLM: LLM(model=DIR, **engine_args) with vLLM's engine argument names (device, block_size,
    num_gpu_blocks_override, swap_space, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens,
    max_model_len, enable_prefix_caching, preemption_mode, tensor_parallel_size, quantization, load_format,
    speculative_config={"method": "ngram", ...}, seed (the seeds of requests that give none drawn from a generator
    started there), ...; the `paged` CLI's engine flags). Raises ValueError for an unknown argument, RuntimeError for a bad model.
    `generation_config`: "auto" (vLLM's default: without sampling_params, generate and chat sample with the model's
    generation_config.json defaults, get_default_sampling_params) or "vllm" (SamplingParams()'s own)."""

    def __init__(self, model, generation_config="auto", **engine_args):
        if generation_config not in ("auto", "vllm"):
            raise ValueError(f"generation_config must be 'auto' or 'vllm', got {generation_config!r}")
        if isinstance(engine_args.get("speculative_config"), dict):  # vLLM's: {"method": "ngram", ...}
            engine_args["speculative_config"] = json.dumps(engine_args["speculative_config"])
        self._engine = _paged.Engine(_flags({"model": model, **engine_args}, _ENGINE_ALIASES))
        self._generation_config = generation_config
        self._enable_lora = bool(engine_args.get("enable_lora"))
        self._loras = {}  # lora_int_id -> (lora_name, lora_path, the engine's id)

    def _lora_id(self, lora_request):
        """The engine's id of a LoRARequest's adapter (0: none), loading it on its first use."""
        if lora_request is None:
            return 0
        if not isinstance(lora_request, LoRARequest):
            raise TypeError("lora_request must be a LoRARequest")
        if not self._enable_lora:
            raise ValueError("lora_request needs an LLM built with enable_lora=True")
        key = lora_request.lora_int_id
        if key in self._loras:
            name, path, engine_id = self._loras[key]
            if (name, path) != (lora_request.lora_name, lora_request.lora_path):
                raise ValueError(f"lora_int_id {key} is the adapter {name!r} ({path}) already")
            return engine_id
        engine_id = self._engine.load_lora(lora_request.lora_name, lora_request.lora_path)
        self._loras[key] = (lora_request.lora_name, lora_request.lora_path, engine_id)
        return engine_id

    def get_default_sampling_params(self):
        """The SamplingParams of a call without any: the model's generation_config.json temperature, top_p, top_k,
        min_p, repetition_penalty and max_new_tokens (as max_tokens) over SamplingParams()'s (vLLM's)."""
        defaults = self._engine.sampling_defaults() if self._generation_config == "auto" else {}
        return SamplingParams(**defaults)

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None):
        """RequestOutput for each prompt, in order. `prompts`: a string, a list of strings, or of vLLM's token
        prompts ({"prompt_token_ids": [...]}). The engine runs them as one batch, the GIL released. `use_tqdm`: a
        progress bar on stderr while it runs, when stderr is a terminal. `lora_request`: a LoRARequest whose adapter
        runs every prompt. Ctrl-C cancels the batch (its requests end, their KV blocks are freed) and raises
        KeyboardInterrupt; the engine stays usable."""
        lora = self._lora_id(lora_request)
        params = sampling_params if sampling_params is not None else self.get_default_sampling_params()
        if not isinstance(params, SamplingParams):
            raise TypeError("sampling_params must be one SamplingParams (one for every prompt)")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if all(isinstance(p, dict) for p in prompts) and prompts:
            for p in prompts:
                if set(p) != {"prompt_token_ids"}:
                    raise ValueError(f"a token prompt has the key prompt_token_ids only, got {sorted(p)}")
            inputs = [list(p["prompt_token_ids"]) for p in prompts]
        elif all(isinstance(p, str) for p in prompts):
            inputs = prompts
        else:
            raise TypeError("prompts must be strings or {'prompt_token_ids': [...]} dicts, all of one kind")
        bar = _ProgressBar(sys.stderr) if use_tqdm and sys.stderr is not None and sys.stderr.isatty() else None
        progress = None if bar is None else bar.update
        raw = self._engine.generate(inputs, params._flags, progress, lora)
        if bar is not None:
            bar.update(len(inputs), len(inputs), sum(len(c[2]) for _, _, cs, _, _ in raw for c in cs), final=True)
        return self._outputs(raw, params)

    def beam_search(self, prompts, params, use_tqdm=False):
        """vLLM's LLM.beam_search: a BeamSearchOutput for each prompt (a string, {"prompt": text} or
        {"prompt_token_ids": [...]}), with params a BeamSearchParams; the searches run as one batch."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError("params must be a BeamSearchParams")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        inputs = []  # every prompt as token ids (text as generate would tokenize it)
        for p in prompts:
            if isinstance(p, dict) and set(p) == {"prompt"}:
                p = p["prompt"]
            inputs.append({"prompt_token_ids": self._engine.encode(p, True)} if isinstance(p, str) else p)
        results = []
        for output in self.generate(inputs, params._sampling_params(), use_tqdm=use_tqdm):
            sequences = []
            for c in output.outputs:
                tokens = output.prompt_token_ids + c.token_ids
                sequences.append(BeamSearchSequence(tokens, c.logprobs, c.cumulative_logprob,
                                                    self._engine.decode(tokens, False), c.finish_reason))
            results.append(BeamSearchOutput(sequences))
        return results

    def chat(self, messages, sampling_params=None, use_tqdm=True, chat_template=None, add_generation_prompt=True,
             continue_final_message=False, tools=None, chat_template_kwargs=None, lora_request=None):
        """Generation after a conversation (a list of {"role", "content"}; or a list of such conversations), its
        prompt rendered by the model's chat template (or `chat_template`, a Jinja source); `use_tqdm` as generate's.
        vLLM's: `tools` (OpenAI function tools) and `chat_template_kwargs` (a dict) go to the template as variables;
        `continue_final_message` (with add_generation_prompt False) leaves the prompt inside the final message for
        the model to go on with."""
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be True")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise TypeError("chat_template_kwargs must be a dict")
        extra = dict(chat_template_kwargs or {})
        if tools is not None:
            extra["tools"] = list(tools)
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [self._engine.render_chat(json.dumps(c), chat_template or "", add_generation_prompt,
                                            json.dumps(extra), continue_final_message)
                   for c in conversations]
        ids = [{"prompt_token_ids": self._engine.encode(p, False)} for p in prompts]
        outputs = self.generate(ids, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)
        for output, prompt in zip(outputs, prompts):
            output.prompt = prompt
        return outputs

    def _outputs(self, raw, params):
        asked = params._kwargs.get("logprobs") is not None
        prompt_asked = params._kwargs.get("prompt_logprobs") is not None
        return [RequestOutput(prompt, prompt_ids,
                              [CompletionOutput(i, text, ids, cum, reason, _logprobs(lps, asked))
                               for i, text, ids, cum, reason, lps in completions], cached,
                              _prompt_logprobs(scored) if prompt_asked else None)
                for prompt, prompt_ids, completions, cached, scored in raw]
