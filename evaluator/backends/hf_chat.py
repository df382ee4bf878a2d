"""A `Chat` on Hugging Face transformers (`HF.chat`): a generate job's calls, a batch's lines
with the same knobs generated as one batch, streamed text, log-probabilities, answers held to a
JSON Schema (evaluator/structured.py), a chat's function calls read out of its text
(evaluator/function_calls.py), rollouts with the python tool (evaluator/tool_rollouts.py), and
grading models' answers."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evaluator.backends.base import Decoding
from evaluator.backends.chat_base import (
    Chat,
    Choice,
    Deltas,
    ModelPath,
    answer_schema,
    judge_params,
    rows,
    template_messages,
)
from evaluator.backends.hf_generate import cut_at_stop, eos_ids, generate
from evaluator.logprobs import Token, kept_tokens, token_logprobs

if TYPE_CHECKING:
    from mathrl.specs import GenerateSpec
    from runtime.sink import Sink


class HFChat(Chat):
    """A causal LM and its tokenizer on transformers, in this process, loaded at its first use (a
    call a warm engine answers needs none; `HF.chat`), answering chats or plain prompts: `answer`
    generates for prompts; `call`, `calls`, `here` and `judge` are `Chat`'s. One call at
    a time on the model (`lock`: a batch's lines past a warm engine's context come from its threads)."""

    def __init__(self, path: ModelPath, dtype: str = "auto"):
        self.path, self.dtype = path, dtype
        self._model: Any = None
        self._tokenizer: Any = None
        self.lock = threading.RLock()

    def prepare(self) -> None:
        if self._model is not None:  # (loaded: no lock, which a streaming call's generating thread can't take)
            return
        with self.lock:  # a batch's threads: loaded once
            self._load()

    def _load(self) -> None:
        if self._model is None:
            from evaluator.models import load_model, load_tokenizer

            path = self.path if isinstance(self.path, str) else self.path()
            self._tokenizer = load_tokenizer(path)
            self._model = load_model(path, self.dtype)

    @property
    def model(self) -> Any:
        self.prepare()
        return self._model

    @property
    def tokenizer(self) -> Any:
        self.prepare()
        return self._tokenizer

    def prompt(
        self, messages: Sequence[Mapping[str, Any]] | None, text: str | None = None, tools: list[Any] | None = None
    ) -> str:
        """The text the model continues: the chat through its chat template (with `tools`, the schemas it
        renders), or `text` as it is."""
        if messages is None:
            return text or ""
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]  # (a tool message's fields too)
        extra = {"tools": tools} if tools else {}
        return str(self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **extra))

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False).input_ids)

    def answer(
        self,
        prompts: list[str],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int = 1,
        stop: list[str] | None = None,
        seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
        logprobs: int | None = None,
        schema: dict[str, Any] | None = None,
    ) -> list[list[Choice]]:
        """Each prompt's `n` choices; with `logprobs`, each one's tokens' and that many most likely
        alternatives' log-probabilities; with `schema`, each a JSON text it admits (evaluator/structured.py)."""
        decoding = Decoding(max_tokens, tuple(stop or ()), temperature, top_p, n, seed)
        out = generate(
            self.model, self.tokenizer, prompts, decoding, should_stop=should_stop, constrain=self.constraint(schema)
        )
        choices = [[Choice(g.text, "length" if g.truncated else "stop", g.tokens) for g in gens] for gens in out]
        if logprobs is not None:
            stops = eos_ids(self.model, self.tokenizer)
            for prompt, gens, made in zip(prompts, out, choices, strict=True):
                for g, c in zip(gens, made, strict=True):
                    c.logprobs = self.logprobs(prompt, kept_tokens(self.tokenizer, g.ids, stops, g.text), logprobs)
        return choices

    def constraint(self, schema: dict[str, Any] | None) -> Callable[[], Any] | None:
        """What holds an answer to `schema` (None: nothing)."""
        if schema is None:
            return None
        from evaluator.structured import constraint

        return constraint(self.model, self.tokenizer, schema, eos_ids(self.model, self.tokenizer))

    def logprobs(self, prompt: str, ids: list[int], top: int) -> list[Token]:
        """The log-probabilities of a completion's tokens `ids` after `prompt` (evaluator/logprobs.py)."""
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        return token_logprobs(self.model, self.tokenizer, prompt_ids, ids, top)

    def stream(
        self,
        prompt: str,
        on_text: Callable[[str], None],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: list[str] | None = None,
        seed: int = 0,
        logprobs: int | None = None,
        schema: dict[str, Any] | None = None,
    ) -> Choice:
        """One completion, its text passed to `on_text` piece by piece while it is generated
        (never past a stop string, which is cut as `answer` cuts it); its log-probabilities, asked
        for, once it is whole."""
        import torch
        from transformers import TextIteratorStreamer

        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.model.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": eos_ids(self.model, self.tokenizer),
            "streamer": streamer,
        }
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if (constrain := self.constraint(schema)) is not None:
            kwargs["logits_processor"] = [constrain()]
        result: dict[str, Any] = {}

        def run() -> None:
            torch.manual_seed(seed)
            try:
                with torch.inference_mode():
                    result["ids"] = self.model.generate(**enc, **kwargs)
            except BaseException as exc:  # re-raised below, after the streamer is drained
                result["error"] = exc
                streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        text, sent = "", 0
        hold = max((len(s) for s in stop or []), default=0)  # what may still turn out to start a stop string
        for piece in streamer:
            text += piece
            cut, stopped = cut_at_stop(text, stop)
            safe = len(cut) if stopped else max(sent, len(cut) - hold)
            if safe > sent:
                on_text(cut[sent:safe])
                sent = safe
        thread.join()
        if "error" in result:
            raise result["error"]
        cut, stopped = cut_at_stop(text, stop)
        if len(cut) > sent:
            on_text(cut[sent:])
        new = result["ids"][0, enc["input_ids"].shape[1] :].tolist()
        stops = eos_ids(self.model, self.tokenizer)
        ended = next((j for j, t in enumerate(new) if t in stops), None)
        tokens = ended + 1 if ended is not None else len(new)
        choice = Choice(cut, "stop" if stopped or ended is not None else "length", tokens)
        if logprobs is not None:
            choice.logprobs = self.logprobs(prompt, kept_tokens(self.tokenizer, new, stops, cut), logprobs)
        return choice

    def call(self, spec: GenerateSpec, sink: Sink, deltas: Deltas) -> list[dict[str, Any]]:
        """One call's choices; with functions, each choice's calls read out of its text."""
        from evaluator.function_calls import check_template, read_calls

        with self.lock:
            functions = [t.model_dump(exclude_none=True) for t in spec.function_tools or []]
            if functions:
                check_template(self.tokenizer)
            prompt = self.prompt(template_messages(spec), spec.prompt, functions or None)
            options: dict[str, Any] = {
                "max_tokens": spec.max_tokens,
                "temperature": spec.temperature,
                "top_p": spec.top_p,
                "stop": spec.stop,
                # no seed: a draw of its own, as OpenAI's repeated calls differ (0 made every call's answer the same)
                "seed": spec.seed if spec.seed is not None else secrets.randbits(31),
                "logprobs": spec.logprobs,
                "schema": answer_schema(spec),
            }
            if spec.stream and spec.n == 1:
                choices = [self.stream(prompt, lambda text: deltas.add(0, text), **options)]
            else:
                choices = self.answer([prompt], n=spec.n, should_stop=sink.should_stop, **options)[0]
                if spec.stream:  # several choices: each one's text comes whole, when all are done
                    for i, c in enumerate(choices):
                        deltas.add(i, c.text)
            made = rows(prompt, self.prompt_tokens(prompt), 0, choices)
            for row in made if functions and spec.tool_choice != "none" else []:
                row["completion"], tool_calls = read_calls(self.tokenizer, row["completion"], functions)
                if tool_calls:
                    row["data"].update(tool_calls=tool_calls, finish_reason="tool_calls")
            return made

    def calls(self, specs: list[GenerateSpec], sink: Sink) -> list[list[dict[str, Any]]]:
        first = specs[0]
        with self.lock:
            prompts = [self.prompt(template_messages(c), c.prompt) for c in specs]
            choices = self.answer(
                prompts,
                max_tokens=first.max_tokens,
                temperature=first.temperature,
                top_p=first.top_p,
                n=first.n,
                stop=first.stop,
                seed=first.seed if first.seed is not None else secrets.randbits(31),
                should_stop=sink.should_stop,
                logprobs=first.logprobs,
                schema=answer_schema(first),
            )
            return [rows(p, self.prompt_tokens(p), 0, c) for p, c in zip(prompts, choices, strict=True)]

    def here(self) -> HFChat:
        return self

    def judge(self, chats: Sequence[list[dict[str, str]]], params: Mapping[str, Any]) -> list[str]:
        p = judge_params(params)
        with self.lock:
            out = self.answer(
                [self.prompt(chat) for chat in chats],
                max_tokens=int(p["max_completions_tokens"]),
                temperature=float(p["temperature"]),
                top_p=float(p["top_p"]),
                seed=int(p["seed"]),
            )
        return [gens[0].text for gens in out]
