"""Token ids of tool messages, rendered by the chat template without re-tokenizing the history.

Re-rendering and re-tokenizing a whole conversation after every turn breaks multi-turn RL: a BPE
tokenizer need not split the model's sampled text back into the tokens it sampled, so the trained ids
would differ from the generated ones (and their rollout log-probs would belong to other tokens). An
episode therefore keeps the engine's ids for model turns and appends, after each, the ids of only what the
template puts *between* that turn and the next: :meth:`Observations.ids` renders the new tool
messages after a fixed stand-in conversation and tokenizes just the added text (the "delta"), including
the template's closing of the assistant turn and the next turn's generation prompt.

With the Qwen-style template of the tiny model, after a turn that ended with ``<|im_end|>``::

    "\\n<|im_start|>tool\\n579<|im_end|>\\n<|im_start|>assistant\\n"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.agents.tools import ToolResult

#: The stand-in conversation the delta is rendered after (its content never reaches the model).
_MARK = "RLCORE_TURN_MARK"
_BASE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK})
_TRUNCATED = " ...(truncated)"


class Observations:
    """Renders tool results as token ids for ``tokenizer`` (a Hugging Face tokenizer with a chat template).

    ``max_tokens``: a tool message's content is cut to this many tokens (``agent.max_tool_response_tokens``),
    with a note that it was cut.
    """

    def __init__(self, tokenizer: Any, max_tokens: int):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"the agent loop renders tool messages with the tokenizer's chat template, but this tokenizer "
                f"({type(tokenizer).__name__}) has none; use a chat model's tokenizer (model.tokenizer_path)"
            )
        self.tokenizer, self.max_tokens = tokenizer, int(max_tokens)
        prefix = self._render(list(_BASE), generation_prompt=False)
        cut = prefix.rfind(_MARK)
        if cut < 0:
            raise ValueError(
                "the chat template dropped the assistant message's content; cannot find turn ends"
            )
        #: What the template writes after an assistant message's content (``"<|im_end|>\n"``).
        self.turn_end = prefix[cut + len(_MARK) :]
        self._prefix = prefix
        eos = tokenizer.eos_token_id
        self.eos_ids = {int(eos)} if eos is not None else set()
        self._eos_text = tokenizer.decode([eos]) if eos is not None else ""

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def message(self, result: ToolResult) -> dict[str, Any]:
        """The tool message of ``result``, its content cut to ``max_tokens`` tokens."""
        return {"role": "tool", "name": result.name, "content": self.truncate(result.text)}

    def truncate(self, text: str) -> str:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= self.max_tokens:
            return text
        return self.tokenizer.decode(ids[: self.max_tokens]) + _TRUNCATED

    def ids(self, messages: Sequence[dict[str, Any]], last_turn: Sequence[int]) -> list[int]:
        """Token ids to append after a model turn ``last_turn`` (its token ids) so that the conversation
        goes on with ``messages`` (tool messages) and the next assistant turn's generation prompt.

        A turn that ended with the end-of-turn token already holds the start of the template's
        ``turn_end``; one stopped otherwise (a stop string) gets all of it.
        """
        full = self._render([*_BASE, *messages], generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError(
                "the chat template renders the earlier messages differently once tool messages follow; the "
                "agent loop cannot append observations without re-tokenizing the history with this template"
            )
        delta = full[len(self._prefix) :]
        closing = self.turn_end
        if last_turn and int(last_turn[-1]) in self.eos_ids and closing.startswith(self._eos_text):
            closing = closing[len(self._eos_text) :]
        return list(self.tokenizer.encode(closing + delta, add_special_tokens=False))
