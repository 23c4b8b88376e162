"""An LLM as the user: a language model (any local Hugging Face model directory, or a frozen
policy version of a run in the object store) plays the user the policy talks to.

Options (`env.options`, or a prompt row's `env_options`):
  user_model           the model directory, or `policy:RUN_ID@VERSION` (a policy version the
                       run published, read from the object store once per process;
                       `policy:RUN_ID` is its newest stored version when first read) (required)
  user_instructions    what the user is told before the dialogue; `{text}` and `{answer}` are
                       the prompt's (default: "You know the answer is {answer}. Answer the
                       assistant's questions about it without saying it.")
  user_max_new_tokens  the longest reply (default 24); a reply ends at its first newline
  user_temperature     0 (the default) decodes greedily, so an episode replays exactly
  patience             turns before the user leaves (reward 0; default env.max_turns)
The policy's line that the prompt's verifier accepts ends the episode with reward 1; any other
is answered by the user model, on one line of its own.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import Step
from rlstream.trainers.envs import Prompt, verify

INSTRUCTIONS = ("You know the answer is {answer}. Answer the assistant's questions about it "
                "without saying it.")  # fmt: skip
_lock = threading.Lock()  # one generation at a time per process: the model is shared


POLICY = "policy:"


@lru_cache(maxsize=4)
def user_model(spec: str):
    """(model, tokenizer) of a local model directory or a stored policy version, loaded once
    per process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = frozen_policy(spec) if spec.startswith(POLICY) else spec
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    return model, tok


def frozen_policy(spec: str) -> str:
    """`policy:RUN_ID@VERSION` (or `policy:RUN_ID`, the newest) -> a local copy of that policy
    version (a Hugging Face directory), from the object store of the stack in the environment.
    ValueError names the versions there are."""
    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.objectstore import ObjectStore, download_policy, stored_versions

    run_id, _, version = spec.removeprefix(POLICY).partition("@")
    store = ObjectStore(Endpoints.from_env())
    stored = stored_versions(store, run_id)
    if not stored:
        raise ValueError(f"user_model {spec!r}: run {run_id!r} has no policy versions stored")
    chosen = max(stored) if not version else int(version) if version.isdigit() else None
    if chosen not in stored:
        raise ValueError(f"user_model {spec!r}: write policy:{run_id}@VERSION with one of "
                         f"{', '.join(map(str, sorted(stored)))}")  # fmt: skip
    directory = Path(tempfile.mkdtemp(prefix="llm-user-"))
    atexit.register(shutil.rmtree, directory, True)
    return str(download_policy(store, stored[chosen], directory))


class LLMUser:
    def __init__(self, settings: EnvConfig):
        directory = settings.option("user_model")
        if not directory:
            raise ValueError('the llm-user environment needs env.options {"user_model": DIR}')
        self.directory = str(directory)
        self.instructions = settings.option("user_instructions", INSTRUCTIONS)
        self.max_new_tokens = int(settings.option("user_max_new_tokens", 24))
        self.temperature = float(settings.option("user_temperature", 0.0))
        self.patience = int(settings.option("patience", settings.max_turns))
        self.prompt: Prompt | None = None
        self.dialogue: list[str] = []

    async def reset(self, prompt: Prompt) -> str:
        self.prompt, self.dialogue = prompt, []
        return ""

    async def step(self, action: str) -> Step:
        line = action.strip()
        self.dialogue.append(f"assistant: {line}")
        if verify(line, self.prompt):
            return Step("", 1.0, True)
        if len(self.dialogue) >= self.patience:
            return Step("", 0.0, True, {"left": True})
        reply = await asyncio.to_thread(self.reply)
        self.dialogue.append(f"user: {reply}")
        return Step(reply + "\n", 0.0, False, {"user_model": self.directory})

    def reply(self) -> str:
        import torch

        model, tok = user_model(self.directory)
        p = self.prompt
        told = self.instructions.format(text=p.text, answer=p.answer)
        context = "\n".join([told, f"user: {p.text}", *self.dialogue, "user:"])
        ids = tok(context, return_tensors="pt").input_ids
        sampling = {"do_sample": True, "temperature": self.temperature} if self.temperature else {
            "do_sample": False}  # fmt: skip
        with _lock, torch.no_grad():
            out = model.generate(ids, max_new_tokens=self.max_new_tokens,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id,
                                 **sampling)  # fmt: skip
        text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        return text.strip().split("\n")[0].strip() or "..."

    async def close(self) -> None:
        self.prompt = None
