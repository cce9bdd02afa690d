"""The episode record alone (no engine, no HTTP): how requests are matched against sampled turns."""

from __future__ import annotations

import pytest
from rlcore.api import Completion
from rlcore.endpoint.episodes import Episode, EpisodeLimit, Renderer
from rlcore.endpoint.messages import assistant_message, normalize_messages


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return Renderer(tokenizer)


def sample(tokenizer, text, eos=True):
    """A completion whose ids are NOT what encoding its text gives: one id per character, as a model may
    sample a string in other pieces than the tokenizer's merges."""
    (ids,) = zip(*(tokenizer.encode(ch, add_special_tokens=False) for ch in text), strict=True)
    ids = list(ids)
    assert ids != tokenizer.encode(text, add_special_tokens=False) and tokenizer.decode(ids) == text
    ids += [tokenizer.eos_token_id] if eos else []
    return Completion(
        prompt_ids=[], token_ids=ids, log_probs=[-0.5] * len(ids), finish_reason="stop", text=text
    )


def chat_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def turn(episode, messages, completion):
    msgs = normalize_messages(messages)
    prepared = episode.prepare(msgs, None)
    reply = normalize_messages([assistant_message(completion.text, "c", False)])
    episode.record(prepared, [completion], reply)
    return prepared


def new_episode(renderer, budget=200, max_turns=8):
    return Episode("e", renderer, budget=budget, max_model_len=512, max_turns=max_turns)


def conversation(tokenizer, turns):
    """Three requests of a chat, each sending the decoded text of the earlier replies back."""
    messages = [{"role": "user", "content": "what is 1 plus 2"}]
    return messages, [sample(tokenizer, t) for t in turns]


def test_echoed_turns_keep_their_sampled_ids(renderer, tokenizer):
    episode = new_episode(renderer)
    messages, samples = conversation(tokenizer, ["answer 3", "sum 3"])
    first = turn(episode, messages, samples[0])
    assert first.base.prompt == tuple(chat_ids(tokenizer, messages))
    messages += [{"role": "assistant", "content": "answer 3"}, {"role": "user", "content": "again"}]
    second = turn(episode, messages, samples[1])
    assert not second.edited
    # The second request continues the first's ids exactly; only the new messages were tokenized.
    assert second.ids()[: len(first.ids()) + len(samples[0].token_ids)] == first.ids() + samples[0].token_ids
    assert tokenizer.decode(second.context) == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    row = episode.completion([], {}, tokenizer.decode)
    a, b = samples[0].token_ids, samples[1].token_ids
    assert row.token_ids == a + list(second.context) + b
    assert row.response_mask == [1] * len(a) + [0] * len(second.context) + [1] * len(b)
    assert row.log_probs == [-0.5] * len(a) + [0.0] * len(second.context) + [-0.5] * len(b)
    assert row.info["history_edits"] == 0 and row.info["turns"] == 2


def test_an_edited_turn_splits_the_episode_and_is_counted(renderer, tokenizer):
    episode = new_episode(renderer)
    messages, samples = conversation(tokenizer, ["answer 3", "sum 3", "three"])
    turn(episode, messages, samples[0])
    messages += [{"role": "assistant", "content": "answer 3"}, {"role": "user", "content": "again"}]
    turn(episode, messages, samples[1])
    # The agent rewrites the second reply: the first is kept as sampled, the rest becomes context.
    messages += [{"role": "assistant", "content": "sum is 3"}, {"role": "user", "content": "ok"}]
    third = turn(episode, messages, samples[2])
    assert third.edited and len(third.base.turns) == 1
    expected = (
        "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\nsum is 3<|im_end|>\n<|im_start|>user\nok"
    )
    assert tokenizer.decode(third.context).startswith(expected)
    row = episode.completion([], {}, tokenizer.decode)
    a, c = samples[0].token_ids, samples[2].token_ids
    assert row.token_ids == a + list(third.context) + c
    assert row.response_mask == [1] * len(a) + [0] * len(third.context) + [1] * len(c)
    assert row.info["history_edits"] == 1 and row.info["dropped_tokens"] == len(samples[1].token_ids)


def test_a_changed_prompt_starts_over(renderer, tokenizer):
    episode = new_episode(renderer)
    messages, samples = conversation(tokenizer, ["answer 3", "sum 3"])
    turn(episode, messages, samples[0])
    changed = [{"role": "system", "content": "be brief"}, *messages]
    changed += [{"role": "assistant", "content": "answer 3"}, {"role": "user", "content": "again"}]
    second = turn(episode, changed, samples[1])
    assert second.edited and not second.base.parts
    row = episode.completion([], {}, tokenizer.decode)
    assert row.prompt_ids == chat_ids(tokenizer, changed)
    assert row.response_mask == [1] * len(samples[1].token_ids)


def test_resending_an_earlier_state_branches_without_an_edit(renderer, tokenizer):
    episode = new_episode(renderer)
    messages, samples = conversation(tokenizer, ["answer 3", "sum 3"])
    turn(episode, messages, samples[0])
    retry = turn(episode, messages, samples[1])  # the same messages again: a second try at turn 0
    assert not retry.edited and not retry.base.parts
    row = episode.completion([], {}, tokenizer.decode)
    assert row.token_ids == samples[1].token_ids and row.info["history_edits"] == 0


def test_the_next_request_continues_the_choice_it_sends_back(renderer, tokenizer):
    episode = new_episode(renderer)
    messages = [{"role": "user", "content": "what is 1 plus 2"}]
    a, b, c = (sample(tokenizer, t) for t in ("answer 3", "sum 3", "three"))
    prepared = episode.prepare(normalize_messages(messages), None)
    replies = [normalize_messages([assistant_message(x.text, "c", False)])[0] for x in (a, b)]
    episode.record(prepared, [a, b], replies)
    messages += [{"role": "assistant", "content": "sum 3"}, {"role": "user", "content": "again"}]
    nxt = turn(episode, messages, c)
    assert not nxt.edited and nxt.base.turns[0].ids == tuple(b.token_ids)


def test_budget_and_turn_limits_refuse_the_request(renderer, tokenizer):
    episode = new_episode(renderer, budget=12)
    messages, samples = conversation(tokenizer, ["answer 3"])
    turn(episode, messages, samples[0])
    messages += [{"role": "assistant", "content": "answer 3"}, {"role": "user", "content": "again"}]
    with pytest.raises(EpisodeLimit, match="rollout.max_response_length=12") as info:
        episode.prepare(normalize_messages(messages), None)
    assert info.value.reason == "budget" and episode.limit == "budget"
    episode = new_episode(renderer, max_turns=1)
    turn(episode, conversation(tokenizer, [])[0], samples[0])
    with pytest.raises(EpisodeLimit, match="agent.max_turns=1"):
        episode.prepare(normalize_messages(messages), None)


def test_a_template_that_drops_earlier_turns_is_an_edit_not_a_silent_retokenization(tokenizer):
    class Forgetful:  # renders only the last assistant message, as reasoning templates do with thoughts
        def __init__(self, tok):
            self.tok, self.chat_template, self.eos_token_id = tok, "x", tok.eos_token_id

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def apply_chat_template(self, messages, **kw):
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            kept = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i == last]
            return self.tok.apply_chat_template(kept, **kw)

    episode = new_episode(Renderer(Forgetful(tokenizer)))
    messages, samples = conversation(tokenizer, ["answer 3", "sum 3", "three"])
    turn(episode, messages, samples[0])
    messages += [{"role": "assistant", "content": "answer 3"}, {"role": "user", "content": "again"}]
    assert not turn(episode, messages, samples[1]).edited
    messages += [{"role": "assistant", "content": "sum 3"}, {"role": "user", "content": "ok"}]
    assert turn(episode, messages, samples[2]).edited
