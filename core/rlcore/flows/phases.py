"""The phases an algorithm's step is made of, each one function over the :class:`StepContext`.

Every phase takes the step's batch, adds fields, and returns it; it times itself as
``timing/<phase>``, puts the roles' memory in the state it needs (:class:`MemoryPlan`), and records its
metrics in ``ctx.metrics``. The batch layout is the standard one (:mod:`rlcore.api.batch`).

=======================  ==========================================  ===================================
phase                    adds                                        roles
=======================  ==========================================  ===================================
``generate``             ``prompts, responses, input_ids,            rollout
                         attention_mask, position_ids,
                         response_mask, rollout_log_probs [B*n, .]``,
                         objects ``uid, response_text`` + prompt's
                         (with ``agent.enabled``: multi-turn
                         episodes, ``response_mask`` 0 on tool
                         tokens, objects ``agent_info``)
``score``                ``token_level_scores [B, R]``               reward provider (driver)
``compute_old_log_probs`` ``old_log_probs [B, R]`` (skipped when     actor
                         on-policy: :func:`needs_old_log_probs`)
``correct_off_policy``   ``rollout_is_weights [B, R]`` (``decoupled``,  (driver)
                         ``tis``) or ``old_log_probs`` :=
                         ``rollout_log_probs`` (``behaviour``)
``compute_ref_log_probs`` ``ref_log_prob [B, R]``                    reference
``compute_values``       ``values [B, R]``                           critic
``compute_advantages``   ``token_level_rewards, advantages,          (driver)
                         returns [B, R]``
``update_critic``        -                                           critic
``update_actor``         -                                           actor
``sync_weights``         -                                           actor -> rollout
=======================  ==========================================  ===================================
"""

from __future__ import annotations

import torch

from rlcore.algorithms import compute_advantage
from rlcore.algorithms.kl import apply_kl_penalty
from rlcore.api import Batch, Completion
from rlcore.config.specs import DTYPE_GAP, off_policy_correction, rollout_dtype_name, sync_check_bound
from rlcore.flows.context import StepContext
from rlcore.rollout.batching import completions_to_batch
from rlcore.rollout.sync_check import compare_log_probs
from rlcore.telemetry.metrics import prefixed

#: Prompt fields replaced by the generated batch's own (prompt + response layout).
_PROMPT_TENSORS = ("prompts", "prompt_mask", "attention_mask")
#: Tokens the post-sync check generates per probe prompt.
PROBE_TOKENS = 16


def prompt_token_ids(prompts: Batch) -> list[list[int]]:
    """Each row's prompt without its left padding (``prompts``/``prompt_mask [B, P]``)."""
    ids, mask = prompts["prompts"], prompts["prompt_mask"].bool()
    return [ids[i][mask[i]].tolist() for i in range(len(prompts))]


#: The data-row objects an agent program is given (rlcore.endpoint.programs), ``raw_prompt`` as ``prompt``.
_ROW_KEYS = ("data_source", "ground_truth", "reward_model", "extra_info", "index")


def prompt_rows(prompts: Batch) -> list[dict]:
    """Each prompt's data row for an agent program: ``prompt`` (the chat messages) and :data:`_ROW_KEYS`."""
    objects = prompts.objects
    return [
        {"prompt": objects.get("raw_prompt", [None] * len(prompts))[i]}
        | {k: objects[k][i] for k in _ROW_KEYS if k in objects}
        for i in range(len(prompts))
    ]


def generate(
    ctx: StepContext,
    prompts: Batch,
    *,
    n: int | None = None,
    temperature: float | None = None,
    phase: str = "generate",
) -> Batch:
    """Sample ``n`` (default ``rollout.n``) responses per prompt: ``B * n`` rows, prompt-major.

    Rows of one prompt share its ``uid`` (assigned here unless the prompts carry one) and its objects
    (``data_source``, ``ground_truth``, ``extra_info``, ``index`` ...).

    With ``agent.enabled`` every sample is a multi-turn episode with tools (:mod:`rlcore.agents`): the
    response holds model turns and tool observations, ``response_mask`` is 0 on the observations, each
    row's ``extra_info`` gains ``agent`` (turns, tool calls, the final turn's text) for reward functions,
    and ``agent/*`` metrics are recorded.
    """
    params = ctx.sampling_params(n=n, temperature=temperature)
    if "uid" not in prompts.objects:
        prompts.objects["uid"] = ctx.new_uids(len(prompts))
    agent = getattr(ctx.config, "agent", None)
    media = prompt_media(prompts)
    with ctx.phase(phase):
        ctx.memory.use("generate")
        if agent is not None and agent.enabled:
            model = ctx.config.model
            # Images go with every model turn of an episode (the keyword only when there are any).
            completions = ctx.rollout.run_episodes(
                prompt_token_ids(prompts),
                params,
                agent,
                model.tokenizer_path or model.path,
                rows=prompt_rows(prompts) if agent.uses_program else None,
                **({} if media is None else {"multi_modal": media}),
            )
        elif media is not None:
            completions = ctx.rollout.generate(prompt_token_ids(prompts), params, media)
        else:
            completions = ctx.rollout.generate(prompt_token_ids(prompts), params)
    return assemble_generated(ctx, prompts, completions)


def prompt_media(prompts: Batch) -> list | None:
    """Each prompt's images (``multi_modal_data``, :mod:`rlcore.vision`), or None when no prompt has any."""
    media = prompts.objects.get("multi_modal_data")
    if media is None or not any((m or {}).get("image") for m in media):
        return None
    return list(media)


def assemble_generated(ctx: StepContext, prompts: Batch, completions: list[list[Completion]]) -> Batch:
    """The generated batch of ``prompts`` (``B`` rows, each carrying ``uid``) and their ``completions``
    (``B`` lists of ``n``): ``B * n`` rows, prompt-major, each with its prompt's objects and non-layout
    tensors, plus ``agent/*`` metrics for multi-turn episodes (what :func:`generate` returns)."""
    batch = completions_to_batch(completions, ctx.pad_token_id)
    texts = batch.objects["response_text"]
    flat = [c for group in completions for c in group]
    for i, c in enumerate(flat):
        if not texts[i] and c.token_ids:  # an engine without a tokenizer returns token ids only
            texts[i] = ctx.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    n = len(completions[0]) if completions else 1
    expanded = prompts.repeat(n, interleave=True)
    for key, values in expanded.objects.items():
        batch.objects.setdefault(key, values)
    for key, values in expanded.tensors.items():
        if key not in _PROMPT_TENSORS:
            batch.tensors.setdefault(key, values)
    if "agent_info" in batch.objects:
        _add_agent_info(ctx, batch)
    return batch


def _add_agent_info(ctx: StepContext, batch: Batch) -> None:
    """Each row's episode facts into its own copy of ``extra_info`` (rows of a prompt shared one), and
    ``agent/*`` metrics: turns, tool calls and tool errors per episode, the share of episodes per
    ``stop_reason``, and the share of tokens that are tool observations."""
    infos = batch.objects["agent_info"]
    extras = batch.objects.get("extra_info") or [None] * len(batch)
    batch.objects["extra_info"] = [
        {**(extra if isinstance(extra, dict) else {}), "agent": info}
        for extra, info in zip(extras, infos, strict=True)
    ]
    rows = max(len(infos), 1)
    metrics = {
        f"agent/{key}/mean": sum(float(i.get(key, 0)) for i in infos) / rows
        for key in ("turns", "tool_calls", "tool_errors")
    }
    if any("history_edits" in i for i in infos):  # agent programs (rlcore.endpoint)
        for key in ("requests", "history_edits", "dropped_tokens"):
            metrics[f"agent/{key}/mean"] = sum(float(i.get(key, 0)) for i in infos) / rows
        for reason in ("timeout", "error"):
            metrics[f"agent/stop_{reason}"] = sum(i.get("stop_reason") == reason for i in infos) / rows
    for reason in ("answer", "max_turns", "length", "budget"):
        metrics[f"agent/stop_{reason}"] = sum(i.get("stop_reason") == reason for i in infos) / rows
    width = batch["prompts"].shape[1]
    observed = batch["attention_mask"][:, width:].sum()
    metrics["agent/tool_token_fraction"] = float(
        (observed - batch["response_mask"].sum()) / observed.clamp(min=1)
    )
    ctx.record(metrics)


def score(ctx: StepContext, batch: Batch, *, phase: str = "score") -> Batch:
    """``token_level_scores [B, R]`` from the reward provider, plus its per-sample ``reward_extra_info``
    and metrics (``reward/errors`` ...)."""
    with ctx.phase(phase):
        scored = ctx.reward.score(batch)
    batch.tensors["token_level_scores"] = scored["token_level_scores"].to(torch.float32)
    if "reward_extra_info" in scored.objects:
        batch.objects["reward_extra_info"] = scored.objects["reward_extra_info"]
    ctx.record(scored.meta.get("metrics", {}))
    return batch


def update_is_one_step(ctx: StepContext, batch: Batch) -> bool:
    """Whether :func:`update_actor` makes a single optimizer step over ``batch``: one epoch, one
    mini-batch holding every row (micro-batches inside that step do not matter: the weights do not
    change between them)."""
    actor = ctx.config.actor
    mini = actor.ppo_mini_batch_size
    return actor.ppo_epochs == 1 and (mini is None or mini * ctx.config.rollout.n >= len(batch))


def needs_old_log_probs(ctx: StepContext, batch: Batch) -> bool:
    """Whether the step must run :func:`compute_old_log_probs` before updating on ``batch``.

    Not when the update is on-policy (:func:`update_is_one_step`) and nothing reads old log-probs before
    it (a KL penalty in the reward does): the weights are then the same in the pass and in the update's
    forward, which computes the same function (train engines run no dropout, and both use the rollout's
    temperature), so :class:`~rlcore.algorithms.losses.ActorLoss` takes that forward's detached
    log-probs instead and one actor forward over the batch is saved. ``actor.recompute_old_log_probs:
    always`` keeps the pass.
    """
    if ctx.config.actor.recompute_old_log_probs == "always" or ctx.preset.use_kl_in_reward:
        return True
    correction = off_policy_correction(ctx.config)
    if correction == "behaviour":
        return False  # the ratio is centred on the rollout's own log-probs (correct_off_policy)
    if correction != "none" or is_stale(ctx, batch):
        return True  # the proximal policy: the actor's weights now, not those that sampled
    return not update_is_one_step(ctx, batch)


def is_stale(ctx: StepContext, batch: Batch) -> bool:
    """Whether any sample of ``batch`` was drawn under weights older than the actor's (``policy_version``
    older than ``ctx.version``)."""
    if "policy_version" not in batch:
        return False
    versions = batch["policy_version"][batch["response_mask"].bool()]
    return bool(versions.numel()) and int(versions.min()) < ctx.version


def compute_old_log_probs(ctx: StepContext, batch: Batch) -> Batch:
    """``old_log_probs [B, R]``: the actor's log-probs of the sampled tokens before this step's update.

    Also records how far the rollout's own log-probs are from them (``rollout/logprob_diff_*``): the
    same quantity the post-sync check measures, over the whole batch and for free. (When the pass is
    skipped, the actor loss records ``rollout/logprob_diff_mean`` from the update's forward.)
    """
    with ctx.phase("old_log_probs"):
        ctx.memory.use("train")
        out = ctx.actor.infer(batch, ("log_probs",))
    batch.tensors["old_log_probs"] = out["log_probs"]
    if "rollout_log_probs" in batch and bool(batch["response_mask"].any()):
        diff = compare_log_probs(batch["rollout_log_probs"], out["log_probs"], batch["response_mask"])
        ctx.record({k.replace("sync/", "rollout/"): v for k, v in diff.items()})
    return batch


def correct_off_policy(ctx: StepContext, batch: Batch) -> Batch:
    """The off-policy correction ``algorithm.off_policy`` chose (:mod:`rlcore.algorithms.off_policy`), and
    the staleness of the batch's samples.

    ``behaviour``: ``old_log_probs`` become the rollout's own (``rollout_log_probs``). ``decoupled``,
    ``tis``: ``rollout_is_weights [B, R]`` from the proximal (``old_log_probs``) and behaviour log-probs.
    Metrics: ``off_policy/is_*`` and, when the batch records ``policy_version``, ``off_policy/staleness_*``
    (against ``ctx.version``, the weights being updated).
    """
    from rlcore.algorithms.off_policy import importance_weights, staleness_metrics

    correction, algo = off_policy_correction(ctx.config), ctx.config.algorithm
    mask = batch["response_mask"]
    if "policy_version" in batch:
        ctx.record(staleness_metrics(batch["policy_version"], mask, ctx.version))
    if correction == "none":
        return batch
    if "rollout_log_probs" not in batch:
        raise ValueError(
            f"algorithm.off_policy={correction} needs the rollout's log-probs of the sampled tokens, and "
            f"rollout engine {ctx.config.rollout.engine!r} returned none; set algorithm.off_policy=none"
        )
    if correction == "behaviour":
        batch.tensors["old_log_probs"] = batch["rollout_log_probs"]
        return batch
    weights, metrics = importance_weights(
        batch["old_log_probs"],
        batch["rollout_log_probs"],
        mask,
        correction=correction,
        cap=algo.is_cap,
        level=algo.is_level,
    )
    batch.tensors["rollout_is_weights"] = weights
    ctx.record(metrics)
    return batch


def compute_ref_log_probs(ctx: StepContext, batch: Batch) -> Batch:
    """``ref_log_prob [B, R]`` from the frozen reference policy."""
    with ctx.phase("ref_log_probs"):
        ctx.memory.use("train")
        out = ctx.reference.infer(batch, ("log_probs",))
    batch.tensors["ref_log_prob"] = out["log_probs"]
    return batch


def compute_values(ctx: StepContext, batch: Batch) -> Batch:
    """``values [B, R]`` from the critic, before its update (the GAE baseline and the clip centre)."""
    with ctx.phase("values"):
        ctx.memory.use("train")
        out = ctx.critic.infer(batch, ("values",))
    batch.tensors["values"] = out["values"]
    return batch


def compute_advantages(ctx: StepContext, batch: Batch) -> Batch:
    """``token_level_rewards`` (scores minus the KL penalty when the preset puts KL in the reward),
    then ``advantages``/``returns`` from the preset's estimator. ``reward_baselines [B]`` (ReMax) and
    ``values`` (GAE) are passed when the batch has them."""
    preset = ctx.preset
    with ctx.phase("advantages"):
        rewards = batch["token_level_scores"]
        if preset.use_kl_in_reward:
            rewards, kl_metrics = apply_kl_penalty(
                rewards,
                batch["old_log_probs"],
                batch["ref_log_prob"],
                batch["response_mask"],
                ctx.kl_ctrl,
                preset.kl_penalty,
            )
            ctx.record(kl_metrics)
        batch.tensors["token_level_rewards"] = rewards
        advantages, returns = compute_advantage(
            preset.adv_estimator,
            token_level_rewards=rewards,
            response_mask=batch["response_mask"],
            index=batch.get("uid"),
            values=batch.get("values"),
            reward_baselines=batch.get("reward_baselines"),
            gamma=preset.gamma,
            lam=preset.lam,
            norm_adv_by_std_in_grpo=preset.norm_adv_by_std_in_grpo,
        )
    batch.tensors["advantages"], batch.tensors["returns"] = advantages, returns
    return batch


def _train(ctx: StepContext, role, batch: Batch, loss, epochs: int, phase: str) -> dict[str, float]:
    mini = ctx.config.actor.ppo_mini_batch_size
    # ppo_mini_batch_size counts prompts; every prompt carries rollout.n responses.
    size = None if mini is None else mini * ctx.config.rollout.n
    with ctx.phase(phase):
        ctx.memory.use("train")
        metrics = role.train(
            batch, loss, mini_batch_size=size, epochs=epochs, shuffle_seed=ctx.sampling_seed(stream=7)
        )
    metrics = prefixed(role.name, metrics)
    ctx.record(metrics)
    return metrics


def update_critic(ctx: StepContext, batch: Batch, loss) -> dict[str, float]:
    """``critic.ppo_epochs`` passes of the value loss over the batch."""
    return _train(ctx, ctx.critic, batch, loss, ctx.config.critic.ppo_epochs, "update_critic")


def update_actor(ctx: StepContext, batch: Batch, loss) -> dict[str, float]:
    """``actor.ppo_epochs`` passes of the policy loss over the batch. A batch without ``old_log_probs``
    (:func:`needs_old_log_probs` said the pass was redundant) must make a single optimizer step: after
    the first, the update's own log-probs are no longer the old policy's."""
    if "old_log_probs" not in batch and not update_is_one_step(ctx, batch):
        actor = ctx.config.actor
        raise ValueError(
            f"update_actor: the batch has no old_log_probs, but actor.ppo_epochs={actor.ppo_epochs} and "
            f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} (x rollout.n={ctx.config.rollout.n}) "
            f"make several optimizer steps over its {len(batch)} rows; run compute_old_log_probs first "
            "(needs_old_log_probs says when)"
        )
    from rlcore.telemetry.samples import trained_rows

    ctx.trained = trained_rows(batch)
    return _train(ctx, ctx.actor, batch, loss, ctx.config.actor.ppo_epochs, "update_actor")


def check_due(ctx: StepContext) -> bool:
    """Whether the sync at the end of step ``ctx.step`` (0: the initial one) runs the post-sync check:
    the first two syncs, then every ``transport.check_interval`` steps."""
    return bool(ctx.probe_prompts) and (ctx.step <= 1 or ctx.step % ctx.config.transport.check_interval == 0)


def sync_weights(ctx: StepContext) -> dict[str, float]:
    """Push the actor's weights to every rollout engine, then, when :func:`check_due` (and always at this
    process's first sync, the initial one), run the post-sync check: the rollout samples
    :data:`~rlcore.rollout.sync_check.PROBE_SAMPLES` responses to each probe prompt and the actor scores
    the same tokens. The first check measures the pair's floor (``ctx.sync_floor``: both hold the same
    weights); under ``transport.max_logprob_diff: auto`` later checks are bound by it
    (:func:`~rlcore.config.specs.sync_check_bound`), the first by the dtype's cap. A trimmed mean
    |difference| above the bound, or a gap with the shape of a known mistake whatever its size
    (:func:`~rlcore.rollout.sync_check.shape_mistake`: argmax, temperature), stops the run
    (:class:`~rlcore.rollout.sync_check.WeightSyncMismatch`,
    naming both engines' plugins, floor, bound and value, and the mistake the gap matches)."""
    from rlcore.cluster.roles import sync_weights as push
    from rlcore.rollout.sync_check import (
        PROBE_SAMPLES,
        SyncFloor,
        check_against_floor,
        diagnose,
        gap_shape,
        shape_mistake,
    )

    with ctx.phase("sync_weights"):
        ctx.memory.use("sync")
        metrics = push(ctx.actor, ctx.rollout, ctx.transport, rollout_dtype_name(ctx.config))
        if ctx.probe_prompts and (check_due(ctx) or ctx.sync_floor is None):
            ctx.memory.use("check")
            params = ctx.sampling_params(
                n=PROBE_SAMPLES, max_tokens=min(PROBE_TOKENS, ctx.config.rollout.max_response_length)
            )
            if ctx.probe_media is not None:
                completions = ctx.rollout.generate(ctx.probe_prompts, params, ctx.probe_media)
            else:
                completions = ctx.rollout.generate(ctx.probe_prompts, params)
            probe = completions_to_batch(completions, ctx.pad_token_id)
            if ctx.probe_media is not None:
                probe.objects["multi_modal_data"] = [m for m in ctx.probe_media for _ in range(params.n)]
            if bool(probe["response_mask"].any()):
                trainer = ctx.actor.infer(probe, ("log_probs",))
                args = (probe["rollout_log_probs"], trainer["log_probs"], probe["response_mask"])
                found = compare_log_probs(*args)
                first = ctx.sync_floor is None
                if first:  # both sides hold the same weights: the pair's own floor
                    ctx.sync_floor = SyncFloor(
                        found["sync/logprob_diff_trimmed"], int(found["sync/probe_tokens"])
                    )
                floor = ctx.sync_floor
                bound = sync_check_bound(ctx.config, None if first else floor.value)
                found["sync/floor"] = floor.value
                if bound is not None:
                    found["sync/bound"] = bound
                shape = gap_shape(*args)
                found["sync/gap_above_share"] = shape["above_share"]
                found["sync/gap_slope"] = shape["slope"]
                metrics.update(found)
                if bound is not None:
                    cfg = ctx.config
                    filtered = params.top_p < 1.0 or params.top_k > 0
                    mistake = shape_mistake(
                        shape,
                        value=found["sync/logprob_diff_trimmed"],
                        temperature=params.temperature,
                        filtered=filtered,
                        quantized=cfg.rollout.quantization is not None,
                    )
                    check_against_floor(
                        found,
                        *args,
                        floor=None if first else floor,
                        bound=bound,
                        mistake=mistake,
                        diagnosis=diagnose(
                            shape,
                            temperature=params.temperature,
                            filtered=filtered,
                            rollout_dtype=rollout_dtype_name(cfg),
                            train_dtype=cfg.model.dtype,
                            dtype_gap=DTYPE_GAP,
                            value=found["sync/logprob_diff_trimmed"],
                            quantized=cfg.rollout.quantization is not None,
                        ),
                        train_engine=_label("train_engines", cfg.engine),
                        rollout_engine=_label("rollout_engines", cfg.rollout.engine),
                    )
    ctx.record(metrics)
    return metrics


def _label(kind: str, name: str) -> str:
    """An engine as messages name it: with the plugin that registered it."""
    from rlcore.plugins import registry

    entries = registry(kind)
    return entries.entry(name).label if name in entries else repr(name)
