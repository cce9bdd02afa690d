"""The python tool inside episodes, with programs that attack the machine: an infinite loop, a fork bomb, a
10 GiB allocation, a network call and a write outside the scratch directory. Each comes back to the model
as a tool message saying what went wrong, the episodes finish, and the worker's tools still work after."""

import json
import os

from rlcore.agents.episode import AgentLoop, EpisodeLimits
from rlcore.agents.observations import Observations
from rlcore.agents.tools import build_tools
from rlcore.api import Completion, SamplingParams

ATTACKS = {
    "loop": "while True:\n    pass",
    "fork": "import os\nwhile True:\n    os.fork()",
    "memory": "x = bytearray(10 * 2**30)\nprint(len(x))",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('connected')",
    "write": "open({path!r}, 'w').write('pwned')\nprint('written')",
    "fine": "print(sum(range(10)))",
}


class ProgramEngine:
    """Turn 0 of the episode whose prompt ends with ``<name>`` calls python with ``ATTACKS[name]``; turn 1
    answers ``done``."""

    def __init__(self, tokenizer, programs, names):
        self.tokenizer, self.programs, self.names = tokenizer, programs, names

    async def agenerate(self, prompt, params):
        text = self.tokenizer.decode(list(prompt))
        name = next(n for n in self.names if f"run {n}<|im_end|>" in text)
        if text.count("<|im_start|>assistant") == 1:
            body = json.dumps({"name": "python", "arguments": {"code": self.programs[name]}})
            reply = f"<tool_call>{body}</tool_call>"
        else:
            reply = "done"
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        return [Completion(list(prompt), ids, [-0.5] * len(ids), "stop")]


def test_attacks_become_tool_errors_and_the_episodes_finish(tokenizer, tmp_path):
    outside = tmp_path / "outside.txt"
    programs = {k: v.format(path=str(outside)) for k, v in ATTACKS.items()}
    names = list(programs)
    tools = build_tools(["python"], {"python": {"limits": {"wall_s": 3, "cpu_s": 2, "memory_mib": 512}}})
    loop = AgentLoop(
        ProgramEngine(tokenizer, programs, names),
        tokenizer,
        tools,
        EpisodeLimits(max_turns=3, max_model_len=4096),
        Observations(tokenizer, 64),
    )
    prompts = []
    for name in names:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"run {name}"}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    try:
        groups = loop.run(prompts, SamplingParams(max_tokens=1500))
        again = loop.run(prompts[-1:], SamplingParams(max_tokens=1500))  # the tool still works after
    finally:
        loop.close()
    replies = {}
    for name, (c,) in zip(names, groups, strict=True):
        assert c.info["stop_reason"] == "answer" and c.info["final_text"] == "done", name
        zeros = [t for t, m in zip(c.token_ids, c.response_mask, strict=True) if m == 0]
        replies[name] = tokenizer.decode(zeros)
    assert "Error: the program ran out of time" in replies["loop"]
    assert replies["fork"].startswith("\n<|im_start|>tool\nError:")
    assert "Error:" in replies["memory"] and "MemoryError" in replies["memory"]
    assert "Error:" in replies["network"] and "connected" not in replies["network"]
    assert "Error:" in replies["write"] and not outside.exists() and not os.path.exists(outside)
    assert "<|im_start|>tool\n45\n" in replies["fine"]
    assert "45" in tokenizer.decode(
        [t for t, m in zip(again[0][0].token_ids, again[0][0].response_mask, strict=True) if m == 0]
    )
    errors = sum(c.info["tool_errors"] for (c,) in groups)
    assert errors == 5
