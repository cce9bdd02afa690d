"""An OpenAI-compatible chat endpoint in front of a rollout engine, recording every episode token by token.

An agent program written against the ``openai`` client (or any HTTP client of the chat-completions API)
runs unchanged during rollout: it is given a ``base_url`` and an ``api_key``, and each request it sends is
served by the rollout engine. The endpoint keeps, per episode, the token ids and log-probs it sampled and
matches every new request's messages against them, so the trained sequence is exactly what was sampled
(the text the agent sends back is never tokenized again).

============================  ==========================================================================
module                        holds
============================  ==========================================================================
:mod:`.messages`              OpenAI messages normalised for matching; a sampled turn as an assistant message
:mod:`.episodes`              one episode's record: branches of token ids, the match of a request against them
:mod:`.protocol`              request parsing (with the errors a client sees) and response/stream JSON
:mod:`.server`                the HTTP server (aiohttp) on its own event-loop thread, its auth and routes
:mod:`.programs`              agent programs (``module:function`` or a command), many at once with a timeout
:mod:`.reward`                the ``agent`` reward provider: the value each agent program returned
============================  ==========================================================================

See docs/agents.md, "Agent programs".
"""
