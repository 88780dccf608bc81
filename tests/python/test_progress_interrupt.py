"""LLM.generate's progress bar (use_tqdm, on stderr when it is a terminal) and Ctrl-C: SIGINT sent to a process in
the middle of a long generate ends it promptly with KeyboardInterrupt, and the engine serves the next batch."""
import io
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from paged import LLM, SamplingParams

SRC = pathlib.Path(os.environ.get("PAGED_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
MODEL = str(SRC / "models" / "stories260K")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture(scope="module")
def llm():
    return LLM(model=MODEL, device="cpu", max_num_seqs=4)


def test_progress_bar_on_a_terminal(llm, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    prompts = ["Once upon a time"] * 6
    outputs = llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    text = terminal.getvalue()
    assert "Processed prompts: 100%" in text
    assert "| 6/6 [" in text
    assert text.endswith("\n")
    tokens = float(text.rsplit(", ", 1)[1].split(" tok/s")[0])
    assert tokens > 0
    assert [len(o.outputs[0].token_ids) for o in outputs] == [40] * 6


def test_no_progress_bar_off_a_terminal_or_when_not_asked(llm, monkeypatch):
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    llm.generate(["Once upon a time"], SamplingParams(max_tokens=4))
    assert plain.getvalue() == ""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    llm.generate(["Once upon a time"], SamplingParams(max_tokens=4), use_tqdm=False)
    assert terminal.getvalue() == ""


def test_an_exception_in_the_progress_callback_cancels_the_batch(llm):
    calls = []

    def progress(finished, total, tokens):
        calls.append((finished, total, tokens))
        raise ValueError("stop here")

    with pytest.raises(ValueError, match="stop here"):
        llm._engine.generate(["Once upon a time"] * 64, ["--max-tokens", "400", "--ignore-eos=true"], progress)
    assert calls and calls[0][1] == 64
    # The engine is idle again and serves the next batch.
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5


CHILD = r"""
import sys, time
from paged import LLM, SamplingParams
llm = LLM(model=sys.argv[1], device="cpu", max_num_seqs=8)
print("generating", flush=True)
start = time.monotonic()
try:
    llm.generate(["Once upon a time"] * 2000, SamplingParams(max_tokens=480, ignore_eos=True), use_tqdm=False)
    print("finished without an interrupt", flush=True)
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {time.monotonic() - start:.2f} s", flush=True)
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    print(f"next batch: {len(out[0].outputs[0].token_ids)} tokens", flush=True)
    raise
"""


def test_sigint_mid_generate_raises_keyboard_interrupt_promptly():
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", CHILD, MODEL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "generating"
        time.sleep(1.0)  # well inside the batch (2000 x 480 tokens take minutes here)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
        waited = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
    assert "KeyboardInterrupt after" in out, (out, err)
    assert "next batch: 6 tokens" in out, (out, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err  # the traceback's last line: it propagated
    assert child.returncode != 0
    assert waited < 10.0, waited
