"""The Python package (python/paged) on the in-repo stories260K, against Hugging Face's golden outputs
(tests/golden/stories260K-greedy.json). ctest runs it (test `python`) with build/python on PYTHONPATH."""
import array
import json
import math
import os
import random
import re
import pathlib
import shutil
import threading
import time

import jsonschema
import pytest

from paged import LLM, BeamSearchParams, GuidedDecodingParams, LoRARequest, SamplingParams, StructuredOutputsParams

SRC = pathlib.Path(os.environ.get("PAGED_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
MODEL = str(SRC / "models" / "stories260K")
GOLDEN = json.loads((SRC / "tests" / "golden" / "stories260K-greedy.json").read_text())["cases"]
# A template of the test's own: BOS, then the messages' contents (stories260K has none).
CONCAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def llm():
    return LLM(model=MODEL, device="cpu", max_num_seqs=16)


def test_greedy_matches_golden_in_one_batch(llm):
    outputs = llm.generate([c["prompt"] for c in GOLDEN], SamplingParams(max_tokens=64, temperature=0))
    assert len(outputs) == len(GOLDEN)
    for out, case in zip(outputs, GOLDEN):
        assert out.prompt == case["prompt"]
        assert out.prompt_token_ids == case["prompt_ids"]
        assert len(out.outputs) == 1
        completion = out.outputs[0]
        assert completion.token_ids == case["greedy_ids"]
        # vLLM's text continues the prompt (decode(prompt + output) - decode(prompt)); HF's golden text decodes the
        # output alone, where SentencePiece drops the first token's leading space.
        assert completion.text in (case["greedy_text"], " " + case["greedy_text"])
        assert completion.finish_reason == ("length" if len(case["greedy_ids"]) == 64 else "stop")
        assert completion.logprobs is None


def test_token_prompts(llm):
    case = GOLDEN[1]
    out = llm.generate([{"prompt_token_ids": case["prompt_ids"]}], SamplingParams(max_tokens=10, temperature=0))[0]
    assert out.prompt_token_ids == case["prompt_ids"]
    assert out.outputs[0].token_ids == case["greedy_ids"][:10]
    assert out.outputs[0].finish_reason == "length"


def test_num_cached_tokens_counts_the_prefix_cache_hit(llm):
    # A prompt no other test sends, twice: the second finds its whole blocks (16 tokens each) cached, bar the last
    # token, which is computed.
    ids = [1] + [300 + (i * 37) % 200 for i in range(57)]
    first, = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0))
    second, = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (len(ids) - 1) // 16 * 16


def test_default_sampling_params_come_from_the_generation_config(tmp_path):
    # A copy of stories260K whose generation_config.json asks greedy decoding and 7 new tokens at most.
    import shutil
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "temperature": 0.0,
                                                              "max_new_tokens": 7}))
    llm = LLM(model=str(model), device="cpu", max_num_seqs=4)
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.max_tokens) == (0.0, 7)
    case = GOLDEN[0]
    out = llm.generate(case["prompt"])[0].outputs[0]
    assert out.token_ids == case["greedy_ids"][:7]  # greedy, and cut at 7
    vllm = LLM(model=str(model), device="cpu", max_num_seqs=4, generation_config="vllm")
    assert not hasattr(vllm.get_default_sampling_params(), "temperature")  # SamplingParams()'s own: nothing set
    with pytest.raises(ValueError):
        LLM(model=str(model), generation_config="mine")


def test_stop_string_cuts_the_text(llm):
    case = GOLDEN[0]
    cut = case["greedy_text"].index("Lily")
    params = SamplingParams(max_tokens=64, temperature=0, stop="Lily")
    completion = llm.generate(case["prompt"], params)[0].outputs[0]
    assert completion.text == case["greedy_text"][:cut]
    assert completion.finish_reason == "stop"


def test_allowed_token_ids_bad_words_and_logit_bias(llm):
    case = GOLDEN[0]
    # Greedy within Hugging Face's own greedy tokens is Hugging Face's greedy text.
    within = SamplingParams(max_tokens=64, temperature=0, allowed_token_ids=sorted(set(case["greedy_ids"])))
    assert llm.generate(case["prompt"], within)[0].outputs[0].token_ids == case["greedy_ids"]
    # A bad word changes the text where the word came first; a -100 bias on its one token does the same.
    cut = case["greedy_text"].index("Lily")
    banned = llm.generate(case["prompt"], SamplingParams(max_tokens=64, temperature=0, bad_words=["Lily"]))[0]
    text = banned.outputs[0].text
    assert text[:cut] == case["greedy_text"][:cut] and not text[cut:].startswith("Lily")
    # logit_bias: the first greedy token pushed down is not chosen first; pushed up, another token is.
    first = case["greedy_ids"][0]
    down = llm.generate(case["prompt"], SamplingParams(max_tokens=4, temperature=0, logit_bias={first: -100}))[0]
    assert down.outputs[0].token_ids[0] != first
    up = llm.generate(case["prompt"], SamplingParams(max_tokens=1, temperature=0, logit_bias={"7": 100}))[0]
    assert up.outputs[0].token_ids == [7]
    with pytest.raises(ValueError, match="allowed-token-ids"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="bad words"):
        llm.generate("Once", SamplingParams(bad_words=["  "]))


def test_prompt_logprobs_score_the_prompt(llm):
    # Hugging Face's greedy continuation after its prompt, as one prompt: each continuation token is the likeliest.
    case = GOLDEN[0]
    ids = case["prompt_ids"] + case["greedy_ids"][:16]
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))[0]
    scored = out.prompt_logprobs
    assert scored[0] is None and len(scored) == len(ids)
    for position, token in enumerate(ids[1:], 1):
        entry = scored[position]
        assert token in entry and 2 <= len(entry) <= 3
        assert entry[token].logprob <= 0 and entry[token].rank >= 1
        by_rank = [lp.logprob for lp in sorted(entry.values(), key=lambda lp: lp.rank)]
        assert by_rank == sorted(by_rank, reverse=True)
        if position >= len(case["prompt_ids"]):
            assert entry[token].rank == 1
    assert llm.generate(case["prompt"], SamplingParams(max_tokens=1))[0].prompt_logprobs is None


def test_beam_search(llm):
    case = GOLDEN[0]
    # A beam of width 1 is greedy: Hugging Face's greedy tokens after the prompt.
    one = llm.beam_search([case["prompt"]], BeamSearchParams(beam_width=1, max_tokens=32, ignore_eos=True))[0]
    assert len(one.sequences) == 1
    assert one.sequences[0].tokens == case["prompt_ids"] + case["greedy_ids"][:32]
    # Its text decodes the whole sequence, the prompt included (vLLM's).
    greedy = llm.generate(case["prompt"], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    assert case["prompt"] in one.sequences[0].text and one.sequences[0].text.endswith(greedy.outputs[0].text)
    # Width 3: three hypotheses, best first by cumulative logprob / length, each token's logprob in its dict.
    out = llm.beam_search([{"prompt": case["prompt"]}, {"prompt_token_ids": GOLDEN[1]["prompt_ids"]}],
                          BeamSearchParams(beam_width=3, max_tokens=16))
    assert len(out) == 2
    for result, prompt_ids in zip(out, [case["prompt_ids"], GOLDEN[1]["prompt_ids"]]):
        assert len(result.sequences) == 3
        scores = [s.cum_logprob / len(s.tokens) for s in result.sequences if s.finish_reason == "length"]
        assert scores == sorted(scores, reverse=True)
        for s in result.sequences:
            assert s.tokens[:len(prompt_ids)] == prompt_ids
            output = s.tokens[len(prompt_ids):]
            assert len(s.logprobs) == len(output) and all(len(d) >= 6 for d in s.logprobs)
            assert math.isclose(sum(d[t].logprob for d, t in zip(s.logprobs, output)), s.cum_logprob, abs_tol=1e-3)
    with pytest.raises(ValueError, match="temperature"):
        llm.beam_search(["Once"], BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.5))


def test_logprobs_agree_with_golden_logits(llm):
    case = GOLDEN[0]
    completion = llm.generate(case["prompt"], SamplingParams(max_tokens=4, temperature=0, logprobs=3))[0].outputs[0]
    assert len(completion.logprobs) == 4
    for token, position in zip(completion.token_ids, completion.logprobs):
        assert len(position) == 3 and position[token].rank == 1
        assert all(position[token].logprob >= lp.logprob for lp in position.values())
        assert position[token].logprob <= 0
    # Log-softmax differences are logit differences: the first position against Hugging Face's top logits.
    top = case["last_logits_top5"]
    first = completion.logprobs[0]
    for tid, value in zip(top["ids"][:3], top["values"][:3]):
        assert first[tid].logprob - first[top["ids"][0]].logprob == pytest.approx(value - top["values"][0], abs=1e-3)
    assert first[top["ids"][0]].decoded_token == ","
    assert completion.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in
                                                              zip(completion.token_ids, completion.logprobs)), abs=1e-4)


def test_sampling_seed_and_n(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=3)
    first = llm.generate("Once upon a time", params)[0]
    again = llm.generate("Once upon a time", params)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert all(len(c.token_ids) == 12 or c.finish_reason == "stop" for c in first.outputs)
    other = llm.generate("Once upon a time", SamplingParams(max_tokens=12, temperature=1.0, seed=8, n=3))[0]
    assert [c.token_ids for c in other.outputs] != [c.token_ids for c in first.outputs]
    assert params.seed == 7 and params.n == 3


def test_engine_seed_makes_unseeded_requests_repeat():
    # vLLM's LLM(seed=...): requests without a seed draw theirs from a generator started there, in order.
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    prompts = ["Once upon a time", "The little dog"]
    def run(**seed):
        engine = LLM(model=MODEL, device="cpu", **seed)
        return [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    first = run(seed=3)
    assert first == run(seed=3)
    assert first != run(seed=4)
    assert all(len(t) == 16 for t in first)


def test_chat_renders_the_template(llm):
    case = GOLDEN[0]
    out = llm.chat([{"role": "user", "content": case["prompt"]}], SamplingParams(max_tokens=8, temperature=0),
                   chat_template=CONCAT_TEMPLATE)[0]
    assert out.prompt == "<s>" + case["prompt"]
    assert out.prompt_token_ids == case["prompt_ids"]
    assert out.outputs[0].token_ids == case["greedy_ids"][:8]


def test_chat_tools_kwargs_and_continue_final_message(llm):
    # vLLM's LLM.chat arguments reach the template: tools and chat_template_kwargs as variables.
    template = ("{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ greeting }}|"
                "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon"}]
    out = llm.chat(conversation[:1], SamplingParams(max_tokens=2, temperature=0), chat_template=template, tools=tools,
                   chat_template_kwargs={"greeting": "hello"})[0]
    assert out.prompt == "[get_weather]hello|user:Hi;assistant:"
    # continue_final_message: the prompt ends inside the final (assistant) message, and greedy goes on from there
    # as it would from that text given whole.
    cont = llm.chat(conversation, SamplingParams(max_tokens=6, temperature=0), chat_template=template,
                    add_generation_prompt=False, continue_final_message=True)[0]
    assert cont.prompt == "|user:Hi;assistant:Once upon"
    same = llm.generate([{"prompt_token_ids": cont.prompt_token_ids}], SamplingParams(max_tokens=6, temperature=0))[0]
    assert cont.outputs[0].token_ids == same.outputs[0].token_ids
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(conversation, chat_template=template, continue_final_message=True)
    with pytest.raises(TypeError, match="chat_template_kwargs"):
        llm.chat(conversation[:1], chat_template=template, chat_template_kwargs=["x"])


def test_gil_released_while_generating(llm):
    done = threading.Event()
    took = []

    def work():
        start = time.monotonic()
        llm.generate([c["prompt"] for c in GOLDEN] * 16, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
        took.append(time.monotonic() - start)
        done.set()

    worker = threading.Thread(target=work)
    last, longest = time.monotonic(), 0.0
    worker.start()
    while not done.is_set():
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    worker.join()
    assert took[0] > 0.05, "the batch is too short to tell"
    assert longest < took[0] / 2, f"this thread stalled {longest:.3f} s of the engine's {took[0]:.3f} s"


def test_errors_raise_with_the_engines_message(llm):
    with pytest.raises(ValueError, match="--no-such-arg"):
        LLM(model=MODEL, no_such_arg=1)
    with pytest.raises(ValueError, match="--block-size"):
        LLM(model=MODEL, device="cpu", block_size=0)
    with pytest.raises(RuntimeError):
        LLM(model=str(SRC / "no-such-model"), device="cpu")
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("Once", SamplingParams(logit_bias={1: 1000.0}))
    with pytest.raises(ValueError, match="--logit-bias"):
        SamplingParams(logit_bias={"x": 1.0})
    with pytest.raises(ValueError, match="temperature"):
        llm.generate("Once", SamplingParams(temperature=-1))
    with pytest.raises(ValueError):
        llm.generate([{"prompt_token_ids": [1, 10 ** 6]}])
    with pytest.raises(ValueError, match="chat template"):
        llm.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(TypeError):
        llm.generate([1, 2])
    # The engine is unharmed.
    assert llm.generate(GOLDEN[0]["prompt"], SamplingParams(max_tokens=3, temperature=0))[0].outputs[0].token_ids \
        == GOLDEN[0]["greedy_ids"][:3]


def test_structured_outputs(llm):
    """vLLM's SamplingParams(structured_outputs=StructuredOutputsParams(...)) at temperature 1 over seeds: a schema's
    answers parse and jsonschema (an independent validator) finds them valid; regex and choice answers match;
    disable_any_whitespace writes the compact form; guided_decoding (vLLM's earlier name) works the same."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                                "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}},
              "required": ["name", "age"]}
    for seed in range(4):
        out = llm.generate("Once upon a time", SamplingParams(
            max_tokens=200, temperature=1, seed=seed, structured_outputs=StructuredOutputsParams(json=schema)))[0]
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
        compact = llm.generate("Once upon a time", SamplingParams(
            max_tokens=200, temperature=1, seed=seed,
            guided_decoding=GuidedDecodingParams(json=json.dumps(schema), disable_any_whitespace=True)))[0]
        text = compact.outputs[0].text
        assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
        regex = llm.generate("Once upon a time", SamplingParams(
            max_tokens=40, temperature=1, seed=seed, structured_outputs=StructuredOutputsParams(regex=r"(Tom|Sue) [a-z]{2,6}\.")))[0]
        assert re.fullmatch(r"(Tom|Sue) [a-z]{2,6}\.", regex.outputs[0].text)
        choice = llm.generate("The cat was", SamplingParams(
            max_tokens=10, temperature=1, seed=seed, structured_outputs=StructuredOutputsParams(choice=["happy", "sad"])))[0]
        assert choice.outputs[0].text in ("happy", "sad")
    with pytest.raises(ValueError, match="unknown type 'strin'"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "strin"})))
    with pytest.raises(ValueError, match="only one of"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a", choice=["b"]))
    with pytest.raises(ValueError, match="applies to --guided-json"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a", whitespace_pattern=" "))
    with pytest.raises(TypeError):
        StructuredOutputsParams(structural_tags="{}")


def test_ngram_speculation_keeps_the_outputs():
    # vLLM's speculative_config: greedy outputs are HF's, seeded samples those of decoding without it.
    spec = LLM(model=MODEL, device="cpu", max_num_seqs=16,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                                   "prompt_lookup_min": 1})
    greedy = spec.generate([c["prompt"] for c in GOLDEN], SamplingParams(max_tokens=64, temperature=0))
    for out, case in zip(greedy, GOLDEN):
        assert out.outputs[0].token_ids == case["greedy_ids"]
    plain = LLM(model=MODEL, device="cpu", max_num_seqs=16)
    sampled = SamplingParams(max_tokens=48, temperature=0.8, top_p=0.9, seed=5, frequency_penalty=0.3, n=2)
    want = plain.generate([c["prompt"] for c in GOLDEN], sampled)
    got = spec.generate([c["prompt"] for c in GOLDEN], sampled)
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in want]
    with pytest.raises(ValueError, match="ngram"):
        LLM(model=MODEL, device="cpu", speculative_config={"method": "eagle", "num_speculative_tokens": 2})


def test_structural_tag(llm):
    # Free text in which every " the" opens {"n": int} then ".": each structure in the answers is valid.
    tag = {"triggers": [" the"], "structures": [{"begin": " the", "end": ".", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}]}
    params = SamplingParams(n=6, max_tokens=120, temperature=1.0, seed=3,
                            structured_outputs=StructuredOutputsParams(structural_tag=tag))
    found = 0
    for completion in llm.generate(["Once upon a time"], params)[0].outputs:
        text = completion.text
        at = text.find(" the")
        while at >= 0:
            m = re.match(r"(\{[^{}]*\})\.", text[at + 4:])
            if m is None:
                assert completion.finish_reason == "length", text  # cut inside its last structure
                break
            assert isinstance(json.loads(m.group(1))["n"], int)
            found += 1
            at = text.find(" the", at + 4 + len(m.group(0)))
    assert found >= 3
    with pytest.raises(ValueError, match="starts with no trigger"):
        llm.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(
            structural_tag={"triggers": ["<f="], "structures": [{"begin": "<g>", "end": "", "schema": {}}]})))


def _read_safetensors(path):
    raw = pathlib.Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32"
        values = array.array("f")
        values.frombytes(raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
        out[name] = (e["shape"], values)
    return out


def _write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = values.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    pathlib.Path(path).write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def _lora_and_merged(tmp, rank=4, alpha=8.0, seed=1):
    """A PEFT adapter of stories260K's attention projections, and the checkpoint with it merged (W + alpha/r B A),
    written here in pure Python."""
    rng = random.Random(seed)
    base = _read_safetensors(pathlib.Path(MODEL) / "model.safetensors")
    adapter, merged = {}, dict(base)
    for name, (shape, w) in base.items():
        if not re.search(r"self_attn\.(q|k|v|o)_proj\.weight$", name):
            continue
        out, inp = shape
        module = name[:-len(".weight")]
        a = array.array("f", [rng.uniform(-1, 1) / math.sqrt(inp) for _ in range(rank * inp)])
        b = array.array("f", [0.5 * rng.uniform(-1, 1) / math.sqrt(rank) for _ in range(out * rank)])
        adapter[f"base_model.model.{module}.lora_A.weight"] = ([rank, inp], a)
        adapter[f"base_model.model.{module}.lora_B.weight"] = ([out, rank], b)
        scale = alpha / rank
        merged[name] = (shape, array.array("f", [w[o * inp + i] + scale * sum(b[o * rank + j] * a[j * inp + i]
                                                                                for j in range(rank))
                                                 for o in range(out) for i in range(inp)]))
    lora_dir, merged_dir = tmp / "adapter", tmp / "merged"
    lora_dir.mkdir()
    _write_safetensors(lora_dir / "adapter_model.safetensors", adapter)
    (lora_dir / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": alpha}))
    shutil.copytree(MODEL, merged_dir, ignore=shutil.ignore_patterns("model.safetensors"))
    _write_safetensors(merged_dir / "model.safetensors", merged)
    return lora_dir, merged_dir


def test_lora_request_runs_the_adapter(tmp_path):
    # vLLM's LLM(enable_lora=True) with generate(..., lora_request=LoRARequest(name, id, path)): the adapter's outputs
    # are the merged checkpoint's; without it the base model's.
    lora_dir, merged_dir = _lora_and_merged(tmp_path)
    prompts = [c["prompt"] for c in GOLDEN]
    params = SamplingParams(max_tokens=32, temperature=0, logprobs=1)
    want = LLM(model=str(merged_dir), device="cpu").generate(prompts, params)
    llm = LLM(model=MODEL, device="cpu", enable_lora=True, max_lora_rank=8)
    request = LoRARequest("stories-attn", 1, str(lora_dir))
    got = llm.generate(prompts, params, lora_request=request)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
    base = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in base] == [c["greedy_ids"][:32] for c in GOLDEN]
    again = llm.generate(prompts[:1], params, lora_request=LoRARequest("stories-attn", 1, str(lora_dir)))
    assert again[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="lora_int_id 1 is the adapter"):
        llm.generate(prompts[:1], params, lora_request=LoRARequest("other", 1, str(tmp_path)))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.generate(prompts[:1], params, lora_request=LoRARequest("bad", 2, str(tmp_path)))
    with pytest.raises(ValueError, match="enable_lora"):
        LLM(model=MODEL, device="cpu").generate(prompts[:1], params, lora_request=request)
