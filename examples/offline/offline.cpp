// The README's offline example: greedy generation of 32 tokens after "Once upon a time", printing the generated ids
// on the first line and their text on the second. The model folder is the first argument (default: the in-repo
// stories260K, from the checkout's root).
#include <iostream>

#include <paged/actors/engine.h>

int main(int argc, char** argv) {
  paged::Engine engine({.model_dir = argc > 1 ? argv[1] : "models/stories260K"});
  auto out = engine.generate({"Once upon a time"}, paged::SamplingParams{.max_tokens = 32, .temperature = 0});
  for (paged::TokenId id : out[0].outputs[0].token_ids) std::cout << id << ' ';
  std::cout << '\n' << out[0].outputs[0].text << '\n';
}
