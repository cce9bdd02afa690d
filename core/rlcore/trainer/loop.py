"""The single controller's run: setup, the step loop, validation, checkpoints and metrics.

:class:`Trainer` owns everything around an algorithm's step: it builds the roles (engines on Ray or in
this process), the data loaders, the reward provider and the weight transport; it runs
``Algorithm.step`` once per training step, validates on schedule, saves and resumes checkpoints, and
feeds the metric sinks. The algorithm owns only its step (:mod:`rlcore.flows`).

The config handed to :class:`Trainer` must name model folders (``run.prepare_run`` resolves
``builtin:tiny``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from rlcore.api import Batch
from rlcore.cluster.roles import AdapterOffReference
from rlcore.config.specs import max_staleness, rollout_chunk_tokens, stream_over_sampling
from rlcore.flows import resolve_preset
from rlcore.flows.context import MemoryPlan, StepContext
from rlcore.flows.phases import generate, score, sync_weights
from rlcore.rollout.partial import PolicyClock, VersionedRollout
from rlcore.stream import STREAM_FILE, RolloutStream
from rlcore.telemetry.loggers import MetricsLogger, build_loggers, check_logger_names
from rlcore.telemetry.metrics import mean_by, throughput
from rlcore.telemetry.samples import SAMPLES_FILE, TrainedSamples
from rlcore.telemetry.timeline import TIMELINE_FILE, Timeline
from rlcore.trainer import checkpoint as ckpt
from rlcore.trainer.build import build_roles, load_tokenizer, seed_everything
from rlcore.trainer.checkpoint import TRAINED_ROLES
from rlcore.trainer.overlap import Produced, Producer

logger = logging.getLogger(__name__)


def _device_memory_separate(actor: Any) -> bool:
    """Whether the actor's devices have memory apart from the host's: where they do not (CPUs), the
    colocated roles' release/resume calls would free nothing, so the memory plan stays off."""
    return all(actor.group.call_all("memory_separate_from_host"))


# -- the run ---------------------------------------------------------------------------------------
class Trainer:
    """One training run in ``run_dir``. Construction does the whole setup (and resumes from a
    checkpoint as ``trainer.resume`` says); :meth:`fit` trains; :meth:`close` releases everything.

    ``history`` holds one record per logged step (``{"step": k, metric: value ...}``; step 0 holds the
    validation before training and the first weight sync).
    """

    def __init__(self, config: Any, run_dir: str | Path, *, console: Any = None, config_yaml: str = ""):
        from rlcore.config.auto import resolve_auto

        config, _ = resolve_auto(config)  # a config built in code may still say auto (load_config resolves)
        self.config, self.run_dir, self.config_yaml = config, Path(run_dir), config_yaml
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.resumed_from: Path | None = None
        #: the last checkpoint this trainer wrote (a restart after a worker's death resumes from it)
        self.last_saved: Path | None = None
        #: times the run restarted its workers after one died (set by ``run_training``; in the metrics)
        self.restarts = 0
        self.sinks: list[MetricsLogger] = []
        self._closers: list[Any] = []
        try:
            self._setup(console)
        except BaseException:
            self.close()
            raise

    # -- setup -----------------------------------------------------------------------------------
    def _setup(self, console: Any) -> None:
        from rlcore.agents.config import data_with_tools
        from rlcore.algorithms.kl import make_kl_controller
        from rlcore.cluster.roles import resolve_transport_name
        from rlcore.data import build_train_loader, build_val_loader
        from rlcore.plugins import registry
        from rlcore.sandbox import export_default

        cfg = self.config
        seed_everything(cfg.trainer.seed)
        # Before any worker starts: reward workers and Ray workers inherit RLCORE_SANDBOX.
        export_default(cfg.sandbox)
        check_logger_names(cfg.trainer.loggers)
        algorithm_cls = registry("algorithms").get(cfg.algorithm.name)
        self.preset = resolve_preset(cfg.algorithm, algorithm_cls)
        self.algorithm = algorithm_cls(self.preset, cfg)
        self.tokenizer = load_tokenizer(cfg)
        data = data_with_tools(cfg.data, cfg.agent)  # agent runs: prompts offer the tools
        self.train_loader = build_train_loader(data, self.tokenizer)
        self.val_loader = build_val_loader(data, self.tokenizer)
        self._batches = iter(self.train_loader)
        self.sft_examples = self._sft_examples()  # bad warm-up data fails before any engine starts
        self.reward = self._rule_reward()
        self._check_teacher(algorithm_cls)

        wanted = {*self.algorithm.roles, *self.preset.roles}
        extra = [r for r in ("critic", "reference", "teacher") if r in wanted]
        # A LoRA actor is its own reference: the base with the adapter off (no second model).
        adapter_reference = "reference" in extra and cfg.actor.lora.rank > 0
        if adapter_reference:
            extra.remove("reference")
        if cfg.reward_model.enabled:
            extra.append("reward_model")
        self.roles, rollout = build_roles(cfg, ["actor", *extra], self._closers.append)
        if cfg.reward_model.enabled:
            self.reward = self._model_reward(self.roles.pop("reward_model"))
        actor = self.roles["actor"]
        check = cfg.transport.check_prompts
        probes = min(max(check, actor.dp_size), len(self.train_loader.dataset)) if check > 0 else 0
        self.ctx = StepContext(
            config=cfg,
            preset=self.preset,
            actor=actor,
            rollout=rollout,
            reward=self.reward,
            tokenizer=self.tokenizer,
            pad_token_id=self.train_loader.pad_token_id,
            memory=MemoryPlan(
                cfg.trainer.placement != "split" and _device_memory_separate(actor),
                rollout,
                self.roles,
                cfg.trainer.release_train_in_rollout,
            ),
            transport=attrs.evolve(
                cfg.transport,
                name=resolve_transport_name(
                    cfg.transport.name, actor, rollout, colocated=cfg.trainer.placement != "split"
                ),
            ),
            next_prompts=self.next_prompts,
            critic=self.roles.get("critic"),
            reference=AdapterOffReference(actor) if adapter_reference else self.roles.get("reference"),
            teacher=self.roles.get("teacher"),
            kl_ctrl=make_kl_controller(**attrs.asdict(self.preset.kl_ctrl))
            if self.preset.use_kl_in_reward
            else None,
            probe_prompts=[self.train_loader.dataset[i]["input_ids"].tolist() for i in range(probes)],
            probe_media=probe_media(self.train_loader.dataset, probes),
            seed=cfg.trainer.seed,
        )
        self.resumed_from = self._checkpoint_to_resume()
        #: the resumed checkpoint's stream state (set by _load), applied once the stream is built
        self._stream_state: dict[str, Any] | None = None
        if self.resumed_from is not None:
            self._load(self.resumed_from)
        self.ctx.version = self.step  # one weight sync per step: the policy version the actor is at
        self._loader_state = self.train_loader.state_dict()  # as of the last trained batch (checkpoints)
        self.samples = TrainedSamples(self.run_dir / SAMPLES_FILE, keep_through=self.step)
        self.ctx.timeline = Timeline(self.run_dir / TIMELINE_FILE, self._role_ranks())
        self._overlap_setup()
        self.stream = self._stream_setup()
        if self.stream is not None and self._stream_state is not None:
            self.stream.load_state_dict(self._stream_state)
        self.sinks = build_loggers(
            cfg.trainer.loggers,
            self.run_dir,
            total_steps=cfg.trainer.total_steps,
            start_step=self.step,
            experiment_name=self.run_dir.name,
            config=_config_dict(cfg),
            history=self.history,
            console=console,
        )
        # The rollout starts from the model folder; the actor may hold a checkpoint's weights. Syncing now
        # also runs the post-sync check before any step depends on it.
        with self.ctx.detached() as first_sync:
            sync_weights(self.ctx)
        self._first_sync = dict(first_sync)

    def _role_ranks(self) -> dict[str, int]:
        ranks = {name: role.world_size for name, role in self.roles.items()}
        return {**ranks, "rollout": self.ctx.rollout.num_engines}

    def _overlap_setup(self) -> None:
        """For ``trainer.mode`` ``one_step_off`` and ``async``: check the run can overlap, and put the
        rollout behind the :class:`~rlcore.rollout.partial.PolicyClock` both threads share."""
        cfg = self.config.trainer
        self.clock: PolicyClock | None = None
        if cfg.mode in ("sync", "stream"):  # one control flow: no rollout thread
            return
        name = self.config.algorithm.name
        if not (
            callable(getattr(self.algorithm, "collect", None))
            and callable(getattr(self.algorithm, "learn", None))
        ):
            raise ValueError(
                f"trainer.mode={cfg.mode} runs generation ahead of training, which needs the algorithm's step "
                f"in two halves, collect(ctx, prompts) and learn(ctx, batch); algorithm {name!r} "
                f"({type(self.algorithm).__module__}) defines only step. Set trainer.mode=sync, or add them "
                "(docs/async.md)"
            )
        if self.ctx.memory.enabled:
            raise ValueError(
                f"trainer.mode={cfg.mode} generates while the actor trains, so the rollout needs devices of its "
                f"own, but trainer.placement={cfg.placement} time-shares them. Set trainer.placement=split "
                "(rollout.num_engines replicas on devices apart from the actor's; docs/async.md)"
            )
        self.clock = PolicyClock(self.step)
        self.ctx.rollout = VersionedRollout(
            self.ctx.rollout, self.clock, rollout_chunk_tokens(self.config), self.tokenizer
        )

    def _stream_setup(self) -> RolloutStream | None:
        """For ``trainer.mode: stream``: the rollout stream (:mod:`rlcore.stream`) over this run's prompts."""
        from rlcore.plugins import registry

        cfg = self.config
        if cfg.trainer.mode != "stream":
            return None
        for needed in ("learn", "score_generated", "keep_group"):
            if not callable(getattr(self.algorithm, needed, None)):
                raise ValueError(
                    f"trainer.mode=stream trains on groups the stream generated and scored, which needs the "
                    f"algorithm's learn(ctx, batch), score_generated(ctx, batch) and keep_group(ctx, group) "
                    f"(rlcore.flows.base.Flow has them); algorithm {cfg.algorithm.name!r} "
                    f"({type(self.algorithm).__module__}) lacks {needed}. Set trainer.mode=sync (docs/async.md)"
                )
        if self.preset.adv_estimator == "remax":
            raise ValueError(
                "trainer.mode=stream does not run ReMax: its greedy baseline is generated beside each batch, "
                "which the stream does not do. Set trainer.mode=sync"
            )
        dataset = self.train_loader.dataset

        def rows(indices: list[int]) -> list[Batch]:
            return [self.train_loader.collate([dataset[dataset.position(i)]]) for i in indices]

        agent = cfg.agent if cfg.agent.enabled else None
        return RolloutStream(
            batch_size=cfg.data.train_batch_size,
            over_sampling=stream_over_sampling(cfg),
            chunk_tokens=cfg.trainer.rollout_chunk_tokens,
            max_staleness=max_staleness(cfg),
            policy=registry("stream_policies").get(cfg.trainer.stream.policy)(),
            draw=self.next_prompts,
            rows=rows,
            finish=self.algorithm.score_generated,
            keep=self.algorithm.keep_group,
            agent=agent,
            log_path=self.run_dir / STREAM_FILE,
            origin=self.ctx.timeline.origin,
        )

    def _rule_reward(self) -> Any:
        """The ``reward.provider``; ``None`` when the reward model's score replaces it. A bad reward-model
        section fails here, before any engine starts."""
        from rlcore.plugins import registry

        cfg = self.config
        if cfg.reward_model.enabled:
            from rlcore.config.loader import invalid_config
            from rlcore.rewards.model_config import reward_model_problems

            problems = reward_model_problems(cfg)
            if problems:
                raise invalid_config(problems)
            if cfg.reward_model.combine == "replace":
                return None
        provider = registry("reward_providers").get(cfg.reward.provider)(cfg.reward)
        self._closers.append(provider)
        return provider

    def _check_teacher(self, algorithm_cls: type) -> None:
        """A distilling algorithm's ``teacher:`` section (folder, engine, the student's tokenizer), before any
        engine starts; a teacher named for an algorithm without one is an error too."""
        from rlcore.config.loader import invalid_config
        from rlcore.distill.checks import teacher_problems, unused_teacher_problem

        roles = tuple(getattr(algorithm_cls, "roles", ()))
        unused = unused_teacher_problem(self.config, roles)
        problems = [unused] if unused else []
        if "teacher" in roles:
            problems = teacher_problems(self.config, self.tokenizer)
        if problems:
            raise invalid_config(problems)

    def _model_reward(self, role: Any) -> Any:
        """The reward model's provider over its role (which is not a member of ``self.roles``: it neither
        trains nor checkpoints, and keeps its weights on its devices through every phase)."""
        from rlcore.rewards.model_provider import ModelRewardProvider

        return ModelRewardProvider(role, self.config.reward_model, self.tokenizer, rule=self.reward)

    def _sft_examples(self) -> list:
        cfg = self.config
        if cfg.trainer.warmup_sft_steps == 0:
            return []
        from rlcore.agents.config import data_with_tools
        from rlcore.trainer.sft import load_sft_examples
        from rlcore.vision import VisionInputs

        return load_sft_examples(
            cfg.sft.files,
            self.tokenizer,
            prompt_key=cfg.data.prompt_key,
            response_key=cfg.sft.response_key,
            apply_chat_template=cfg.data.apply_chat_template,
            max_prompt_length=cfg.data.max_prompt_length,
            max_response_length=cfg.sft.max_response_length,
            # As RL prompts are rendered: an agent run's warm-up prompts offer the same tools.
            chat_template_kwargs=data_with_tools(cfg.data, cfg.agent).apply_chat_template_kwargs,
            image_key=cfg.data.image_key,
            vision=VisionInputs.for_model(cfg.model.path),
        )

    def next_prompts(self) -> Batch:
        """The next training batch of prompts; a new epoch starts when one ends."""
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self.train_loader)
            return next(self._batches)

    # -- the loop --------------------------------------------------------------------------------
    def fit(self, num_steps: int | None = None) -> list[dict[str, Any]]:
        """Train up to ``trainer.total_steps`` (or ``num_steps`` more steps); returns the history."""
        total = self.config.trainer.total_steps
        stop = total if num_steps is None else min(total, self.step + num_steps)
        if self.step == 0 and not self.history:
            record = dict(self._first_sync)
            if self.config.trainer.val_before_train and self.val_loader is not None:
                record.update(self.validate())
            if self.sft_examples:
                record.update(self.warm_up())
            self._log(0, record)
        if self.clock is None:
            while self.step < stop:
                self.train_step()
        else:
            self._fit_overlapped(stop)
        return self.history

    def _fit_overlapped(self, stop: int) -> None:
        """Steps up to ``stop`` with the rollout thread generating ahead (:mod:`rlcore.trainer.overlap`)."""
        producer = Producer(
            self.algorithm,
            self.ctx.fork(),
            self.clock,
            first=self.step + 1,
            last=stop,
            max_staleness=max_staleness(self.config),
            next_prompts=self.next_prompts,
            loader_state=self.train_loader.state_dict,
        )
        producer.start()
        self._producer = producer
        last = time.perf_counter()
        try:
            while self.step < stop:
                start = time.perf_counter()
                produced = producer.take(
                    self.step + 1, self.config.trainer.rollout_wait_timeout_s, self.config.rollout.engine
                )
                self.train_step(produced, waited=time.perf_counter() - start, since=last)
                last = time.perf_counter()
        finally:
            producer.stop()

    def train_step(
        self, produced: Produced | None = None, *, waited: float = 0.0, since: float | None = None
    ) -> dict[str, Any]:
        """One step of the algorithm, then validation and a checkpoint when due.

        ``produced``: in the overlapping modes, the step's batch the rollout thread generated; the step
        then runs the algorithm's ``learn`` on it and syncs the weights (``waited``: seconds the trainer
        waited for it; ``since``: when the previous step ended, the start of this one's wall time).
        """
        cfg = self.config.trainer
        ctx = self.ctx
        if produced is None:
            prompts = None if self.stream is not None else self.next_prompts()
            self.step += 1
            ctx.begin_step(self.step)
        else:
            self.step += 1
            ctx.continue_step(self.step, produced.counter)
            self._loader_state = produced.loader_state
        ctx.version = self.step - 1
        ctx.memory.take_seconds()  # validation and the warm-up moved memory too: not this step's
        profiled = self._groups() if cfg.profile_step == self.step else []
        for group in profiled:
            group.call_all("profile_start")
        start = time.perf_counter() if since is None else since
        if self.stream is not None:
            # The stream's groups, then the update and the sync: the next step's rounds continue what is
            # in flight under the new weights (rlcore.stream).
            metrics = dict(self.algorithm.learn(ctx, self.stream.collect(ctx)))
            sync_weights(ctx)
            self._loader_state = self.train_loader.state_dict()  # what was drawn is the stream's to keep
        elif produced is None:
            metrics = dict(self.algorithm.step(ctx, prompts))
            self._loader_state = self.train_loader.state_dict()  # after any refills (DAPO) too
        else:
            ctx.record(produced.metrics)
            metrics = dict(self.algorithm.learn(ctx, produced.batch))
            if cfg.schedule == "lockstep":  # the batch sampled under the version this sync replaces
                due = min(self.step + max_staleness(self.config), self._producer.last)
                self._producer.wait_produced(due, cfg.rollout_wait_timeout_s)
            with self.clock.syncing():
                sync_weights(ctx)
            self.clock.advance(self.step)
            metrics["timing/wait_rollout"] = waited
        step_s = time.perf_counter() - start
        ctx.version = self.step
        for group in profiled:
            group.call_all("profile_stop", str(self.run_dir / "profile" / f"step{self.step}"))
        metrics.update(ctx.metrics)
        metrics.update(ctx.timer.metrics())
        metrics["timing/step"] = step_s
        if self.stream is not None and step_s > 0:
            # One pool: the rollout idles while the roles it shares the devices with train and sync.
            metrics["stream/rollout_idle_share"] = max(
                0.0, 1.0 - metrics.get("timing/generate", 0.0) / step_s
            )
        if ctx.trained is not None:
            self.samples.write(self.step, self.step - 1, ctx.trained)
        # Inside the phases' times (each phase moves memory as it starts): what colocation costs.
        metrics["timing/release_resume"] = ctx.memory.take_seconds()
        metrics.update(
            throughput(
                int(metrics.get("tokens/total", 0)),
                int(metrics.get("tokens/response", 0)),
                step_s,
                metrics.get("timing/generate"),
            )
        )
        metrics["train/epoch"] = float(self.train_loader.epoch)
        if self.restarts:
            metrics["faults/restarts"] = self.restarts
        if self.val_loader is not None and (
            (cfg.val_freq > 0 and self.step % cfg.val_freq == 0) or self.step == cfg.total_steps
        ):
            metrics.update(self.validate())
        record = self._log(self.step, metrics, sinks=False)
        if (cfg.save_freq > 0 and self.step % cfg.save_freq == 0) or (
            self.step == cfg.total_steps and cfg.save_freq != -1
        ):
            start = time.perf_counter()
            self.save()
            record["timing/save"] = time.perf_counter() - start
        for sink in self.sinks:
            sink.log(self.step, {k: v for k, v in record.items() if k != "step"})
        return record

    def _log(self, step: int, metrics: dict[str, Any], sinks: bool = True) -> dict[str, Any]:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        if sinks:
            for sink in self.sinks:
                sink.log(step, metrics)
        return record

    def _groups(self) -> list[Any]:
        """The worker groups of every role, the rollout's included (each once: colocated local
        backends may share one)."""
        groups = [role.group for role in [*self.roles.values(), self.ctx.rollout]]
        return list({id(g): g for g in groups}.values())

    def warm_up(self) -> dict[str, float]:
        """``trainer.warmup_sft_steps`` supervised steps of the actor on ``sft.files`` (a random policy
        learns the answer format RL then refines), a weight sync, and with a validation set
        ``val/reward_after_sft``. Metrics: ``sft/loss_first``, ``sft/loss`` (last step), ``sft/steps``,
        ``timing/sft``."""
        from rlcore.trainer.sft import SFTTrainer

        cfg = self.config
        start = time.perf_counter()
        sft = SFTTrainer(
            self.roles["actor"],
            self.sft_examples,
            batch_size=cfg.sft.batch_size,
            pad_token_id=self.ctx.pad_token_id,
            seed=cfg.trainer.seed,
        )
        self.ctx.memory.use("train")
        steps = sft.fit(cfg.trainer.warmup_sft_steps)
        with self.ctx.detached():
            sync_weights(self.ctx)
        metrics = {
            "sft/steps": float(len(steps)),
            "sft/loss_first": steps[0]["sft/loss"],
            "sft/loss": steps[-1]["sft/loss"],
            "timing/sft": time.perf_counter() - start,
        }
        if self.val_loader is not None:
            metrics["val/reward_after_sft"] = self.validate()["val/reward"]
        return metrics

    # -- validation ------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Generate for every validation prompt (``rollout.val_temperature``, ``rollout.val_n``
        responses), score, and report ``val/reward`` (mean over responses), ``val/reward/<data_source>``
        and ``val/response_length/mean``."""
        r = self.config.rollout
        scores: list[float] = []
        sources: list[str] = []
        lengths: list[float] = []
        start = time.perf_counter()
        with self.ctx.detached() as inner:
            for prompts in self.val_loader.full_pass():
                batch = generate(
                    self.ctx, prompts, n=r.val_n, temperature=r.val_temperature, phase="validate"
                )
                batch = score(self.ctx, batch, phase="validate")
                scores += batch["token_level_scores"].double().sum(-1).tolist()
                sources += [str(s) for s in batch["data_source"]]
                lengths += batch["response_mask"].sum(-1).double().tolist()
        metrics = {
            "val/reward": sum(scores) / len(scores),
            "val/response_length/mean": sum(lengths) / len(lengths),
            "timing/validate": time.perf_counter() - start,
        }
        metrics.update({f"val/reward/{src}": v for src, v in mean_by(sources, scores).items()})
        if inner.get("reward/errors"):
            metrics["val/reward_errors"] = inner["reward/errors"]
        return metrics

    # -- checkpoints -----------------------------------------------------------------------------
    def _checkpoint_to_resume(self) -> Path | None:
        resume = self.config.trainer.resume
        if resume == "disable":
            return None
        if resume == "auto":
            return ckpt.latest_checkpoint(self.run_dir)
        return ckpt.resolve_checkpoint(resume)

    def _state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            # The loader as it stood after the last trained batch's prompts: an overlapping run's rollout
            # thread has drawn further, and a resumed run regenerates those batches.
            "train_loader": self._loader_state,
            "rng": ckpt.rng_state(),
            "kl_coef": None if self.ctx.kl_ctrl is None else self.ctx.kl_ctrl.value,
            "history": [dict(r) for r in self.history],
            # The stream's prompts drawn but not trained: a resumed run generates them again first.
            "stream": None if self.stream is None else self.stream.state_dict(),
        }

    def save(self) -> Path:
        """Checkpoint the trained roles and the trainer state at the current step."""
        self.ctx.memory.use("train")  # engines save what they hold on their devices
        saves = {name: role.save_checkpoint for name, role in self.roles.items() if name in TRAINED_ROLES}
        path = ckpt.save_checkpoint(self.run_dir, self.step, saves, self._state(), self.config_yaml)
        logger.info("saved checkpoint %s", path)
        self.last_saved = path
        return path

    def _load(self, path: Path) -> None:
        state = ckpt.load_state(path)
        for name, role in self.roles.items():
            if name in TRAINED_ROLES:
                if not (path / name).exists():
                    raise ckpt.CheckpointError(
                        f"checkpoint {path} has no {name!r} folder, but this run trains a {name}: it was written "
                        "by a run with another algorithm. Set trainer.resume=disable or another trainer.experiment_name."
                    )
                role.load_checkpoint(str(path / name))
        self.step = int(state["step"])
        self.train_loader.load_state_dict(state["train_loader"])
        self._batches = iter(self.train_loader)
        ckpt.set_rng_state(state["rng"])
        if self.ctx.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.ctx.kl_ctrl.value = float(state["kl_coef"])
        self.history = [dict(r) for r in state["history"]]
        self._stream_state = state.get("stream")
        logger.info("resumed from %s at step %d", path, self.step)

    # -- teardown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Close metric sinks, the reward provider, every role and the placement (each once)."""
        for sink in self.sinks:
            _quietly(sink.close)
        self.sinks = []
        while self._closers:
            handle = self._closers.pop()
            _quietly(getattr(handle, "close", None) or getattr(handle, "shutdown", None) or handle.remove)


def _quietly(fn: Callable[[], Any]) -> None:
    """Teardown must not hide the error that ended a run."""
    try:
        fn()
    except Exception as exc:
        logger.warning("error during teardown (%s): %s", getattr(fn, "__qualname__", fn), exc)


def _config_dict(config: Any) -> dict[str, Any]:
    from rlcore.config import to_dict

    return to_dict(config)


def probe_media(dataset: Any, probes: int) -> list | None:
    """The images of the post-sync check's probe rows (the data's first ``probes``), or None when none
    has any: a vision model's check then covers its vision tower."""
    media = [dataset[i].get("multi_modal_data") for i in range(probes)]
    return media if any(media) else None
