"""The training run under Accelerate: only the main process prints and writes. A non-finite loss or weight
raises :class:`~vit5.train.TrainingDiverged` (nothing is written from those weights); SIGTERM / SIGINT /
SIGUSR1 checkpoint the exact position and raise :class:`~vit5.train.TrainingInterrupted` (a second signal
exits at once). See docs/training.md."""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from timm.utils import ModelEmaV3
from torch.utils.data import Dataset

from vit5 import ViT5, compile_blocks
from vit5.data import STOP_SIGNALS, BadImageWarning
from vit5.files import FolderLock, check_output_dir
from vit5.model.footprint import num_tokens, training_bytes
from vit5.model.vit import quiet_complex_fallback
from vit5.runtime import check_fits, fit_precision, missing_cpu_compiler, on_main
from vit5.train import rundir
from vit5.train.checkpointing import (
    CheckpointManager,
    EpochLayout,
    RandomStates,
    Resumable,
    TrainState,
    checkpoint_number,
    is_verified,
    list_checkpoints,
    save_model_dir,
)
from vit5.train.config import TrainConfig, config_record, flatten_config, tracker_names
from vit5.train.data import (
    RunData,
    bad_files,
    build_datasets,
    build_run_data,
    num_images,
    record_class_names,
)
from vit5.train.errors import TrainConfigError, TrainingDiverged, TrainingInterrupted
from vit5.train.loop import (
    LoopParts,
    LRSchedule,
    NonFiniteLoss,
    build_loss,
    build_optimizer,
    ema_horizon_warning,
    evaluate,
    optimizer_note,
    reduce_sums,
    schedule_clock,
    target_mixer,
    train_one_epoch,
)
from vit5.train.modeling import add_lora, build_model, describe, describe_given, merged_for_export
from vit5.train.rundir import (
    count,
    epoch_line,
    format_summary,
    plot_curves,
    write_metrics,
    write_summary,
)


class Trainer:
    """One training run of ``cfg``, continuing from checkpoint ``resume`` (``RUN/checkpoints/ckpt-*``)
    or in a new run directory; ``train_set`` / ``val_set`` (with ``class_names``; an
    ``IterableDataset`` that batches itself and has ``set_epoch(epoch, consumed)``) replace the
    config's data and ``model`` its model. The hooks are how other drivers (the depth benchmark, the
    register study) train without a loop of their own: ``on_update(loss)`` after every optimizer step
    (its mean loss), ``on_epoch_end(row)`` after every epoch with its ``metrics.csv`` row, and
    ``on_validate(model)``, the caller's validation of the raw model in place of the val set's (its
    columns join the row)."""

    def __init__(
        self,
        cfg: TrainConfig,
        resume: Path | None = None,
        train_set: Dataset | None = None,
        val_set: Dataset | None = None,
        model: ViT5 | None = None,
        on_update: Callable[[float], None] | None = None,
        on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
        on_validate: Callable[[torch.nn.Module], dict[str, Any]] | None = None,
    ) -> None:
        self.on_update = on_update
        self.on_epoch_end = on_epoch_end
        self.on_validate = on_validate
        self.fitted = False  # the header is printed by the first fit
        self.cfg = cfg
        trackers = tracker_names(cfg.run.log_with)
        self.session_start = time.perf_counter()
        on_cpu = cfg.run.cpu or not torch.cuda.is_available()
        precision, precision_note = fit_precision(cfg.run.mixed_precision, on_cpu)
        no_compiler = missing_cpu_compiler() if cfg.model.compile and on_cpu else ""
        if no_compiler:
            raise TrainConfigError(
                f"model.compile={str(cfg.model.compile).lower()} needs a C++ compiler for "
                f"torch.compile on a CPU, and torch finds none ({no_compiler}): install one "
                "(apt-get install g++) or set model.compile=false"
            )
        self.precision = precision
        # what this machine changes or slows down, printed in the header
        found = (precision_note, optimizer_note(cfg.optim.name, on_cpu))
        self.machine_notes = [note for note in found if note]
        acc = self.accelerator = Accelerator(
            mixed_precision="no" if precision == "fp32" else precision,
            gradient_accumulation_steps=cfg.optim.accum_steps,
            # Accelerate sets up multi-CPU (gloo) only with cpu=True
            cpu=on_cpu,
            # the trackers, and the logging folder TensorBoard needs up front (_start_tracking moves it)
            **(dict(log_with=trackers, project_dir=cfg.run.output_dir) if trackers else {}),
        )
        self.tracking = False  # trackers started
        self._step_losses: list[float] = []  # losses since the last logged step
        if not acc.is_main_process:
            warnings.filterwarnings("ignore", category=BadImageWarning)
        _check_distributed(acc, cfg)
        # fail before any work when the run's folder cannot be written (read-only, a file, disk full)
        folder = (
            resume.parent.parent if resume is not None else Path(cfg.run.output_dir).expanduser()
        )
        option = "run directory" if (folder / rundir.CONFIG_FILE).exists() else "run.output_dir"
        on_main(acc, lambda: check_output_dir(folder, option))
        set_seed(cfg.run.seed, device_specific=True)  # seed + rank, as the official code

        if train_set is None or val_set is None:
            train_set, val_set, _ = build_datasets(cfg, acc)
        class_names = list(train_set.class_names)  # type: ignore[attr-defined]
        cfg = self.cfg = record_class_names(cfg, class_names, resume)
        # the model (and its checkpoint) is checked before any loader worker starts
        if model is None:
            model, self.model_description, self.load_report = build_model(
                cfg.model, len(class_names)
            )
        else:
            self.model_description = describe_given(model)
            self.load_report = None
        model.pretrained_cfg["label_names"] = class_names  # saved in config.json (timm's key)
        if cfg.model.lora.enabled:
            model = add_lora(model, cfg.model.lora)
            self.model_description += f"; {describe(model, cfg.model.lora)}"
        self.data: RunData = build_run_data(cfg, acc, train_set, val_set)
        _check_memory(acc, cfg, model)
        self.raw_model = model.to(acc.device)
        self.ema = None
        if cfg.ema.enabled:
            self.ema = ModelEmaV3(self.raw_model, decay=cfg.ema.decay, use_warmup=cfg.ema.warmup)
        micro = len(self.data.train_loader)
        if micro < cfg.optim.accum_steps:
            raise TrainConfigError(
                f"each process gets {micro} full batches of data.batch_size={cfg.data.batch_size} per epoch, "
                f"fewer than optim.accum_steps={cfg.optim.accum_steps}; lower data.batch_size"
            )
        self.batches_per_epoch = micro // cfg.optim.accum_steps * cfg.optim.accum_steps
        self.updates_per_epoch = self.batches_per_epoch // cfg.optim.accum_steps
        self.global_batch = cfg.data.batch_size * acc.num_processes * cfg.optim.accum_steps
        self.peak_lr = cfg.optim.peak_lr(self.global_batch)  # computed once, here
        optimizer = build_optimizer(self.raw_model, cfg.optim, self.peak_lr, on_cpu=on_cpu)
        self.schedule = LRSchedule(optimizer, cfg.schedule, self.updates_per_epoch)
        compiled = self.raw_model
        if cfg.model.compile is True:
            quiet_complex_fallback()
            compiled = torch.compile(self.raw_model)
        if cfg.model.compile == "regional":  # in place: the raw model's blocks run compiled
            compile_blocks(self.raw_model)
        self.model, self.optimizer = acc.prepare(compiled, optimizer)

        self.state = TrainState()
        self.resumed_from = resume
        self.forked_from = None
        self.fork_note = ""
        self.resume_exact: bool | None = None
        self.resume_warning = ""
        # the processes that wrote an elastic resume's checkpoint
        self.resumed_elastic: int | None = None
        self.lock: FolderLock | None = None
        # the newest complete checkpoint of this run directory
        self.last_checkpoint: Path | None = None
        # a checkpoint whose weights have not yet given a finite loss
        self.pending: Path | None = None
        self.stop_signal: int | None = None  # the first stop signal received (this process)
        if resume is None:
            self.run_dir, self.lock = rundir.create_run_dir(acc, cfg)
        else:
            self.run_dir, self.last_checkpoint = self._continue_or_fork(resume)
        samples = num_images(self.data.train_set) * cfg.aug.repeated_aug
        layout = EpochLayout(
            cfg.data.batch_size, cfg.optim.accum_steps, self.batches_per_epoch, samples
        )
        parts = Resumable(self.raw_model, self.optimizer, self.ema, self.state)
        folder = self.run_dir / rundir.CHECKPOINTS
        keep = cfg.checkpoint.keep_last
        record = config_record(cfg)
        self.checkpoints = CheckpointManager(acc, folder, keep, parts, record, layout)
        try:
            if resume is not None:  # the original: errors name it and the last good one of its run
                self._restore(resume)
            if acc.is_main_process:
                rundir.write_config(self.run_dir, cfg, note=self.fork_note)
        except BaseException:
            self.close()
            if self.forked_from is not None and acc.is_main_process:  # a fork that never started
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        self.parts = LoopParts(
            accelerator=acc,
            model=self.model,
            raw_model=self.raw_model,
            optimizer=self.optimizer,
            schedule=self.schedule,
            criterion=build_loss(cfg.loss),
            mixer=target_mixer(cfg.aug, len(class_names), cfg.loss.smoothing),
            ema=self.ema,
            loader=self.data.train_loader,
            batch_size=cfg.data.batch_size,
            clock=lambda state: schedule_clock(state, self.updates_per_epoch, self.global_batch),
            clip_grad=cfg.optim.clip_grad,
            progress=cfg.run.progress,
            stop_requests=self._stop_requests,
        )
        self._wall_base = self.state.wall_seconds

    def _restore(self, checkpoint: Path) -> None:
        configured = [
            {k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups
        ]
        restored = self.checkpoints.load(checkpoint, self.cfg.checkpoint.allow_inexact_resume)
        self.resume_exact = restored.exact
        self.resume_warning = restored.warning
        self.resumed_elastic = restored.elastic_from
        # the config as run wins over the saved groups' settings (weight decay, betas, eps, layer decay,
        # this run's peak lr); the moments are kept
        for group, settings in zip(self.optimizer.param_groups, configured):
            group.update(settings)
        clock = schedule_clock(self.state, self.updates_per_epoch, self.global_batch)
        self.schedule.start(clock, self.state.epoch)
        if not is_verified(checkpoint):  # its weights are checked by the first step's loss
            self.pending = self.last_checkpoint

    def _continue_or_fork(self, checkpoint: Path) -> tuple[Path, Path]:
        """Lock the checkpoint's run to continue it, or fork a new run when newer checkpoints exist."""
        run_dir = checkpoint.parent.parent
        acc = self.accelerator
        number = checkpoint_number(checkpoint)
        newer = [
            c.name for c in list_checkpoints(checkpoint.parent) if checkpoint_number(c) > number
        ]
        if not newer:
            self.lock = rundir.lock_run_dir(acc, run_dir)
            return run_dir, checkpoint
        new_dir, copy, self.lock = rundir.fork_run_dir(acc, run_dir, checkpoint)
        self.forked_from = checkpoint
        self.fork_note = (
            f"forked from {checkpoint}: {run_dir} has newer checkpoints ({', '.join(newer)}),\n"
            f"which stay untouched; this run continues from {checkpoint.name} in {new_dir}"
        )
        return new_dir, copy

    def close(self) -> None:
        """Stop the data workers (persistent ones would outlive the run with a copy of its lock), let go of
        the distributed wrapper and release the run directory; :meth:`fit` ends with it, call it for a
        Trainer never fitted.

        The wrapper (DDP) holds the process group. While it is reachable (a Trainer sits in reference
        cycles, so a dropped one too, until a garbage collection), ``destroy_process_group`` only
        unlists the group: its communication threads run on into the interpreter's exit, which they
        can abort ("terminate called without an active exception", pytorch/pytorch#190489). The
        unwrapped model still evaluates; its gradients are no longer averaged over processes."""
        if hasattr(self, "data"):  # the next iteration of a loader starts new workers
            for loader in (self.data.train_loader, self.data.val_loader):
                iterator = getattr(loader, "_iterator", None)
                if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                    iterator._shutdown_workers()
                loader._iterator = None  # type: ignore[attr-defined]
        if hasattr(self, "model"):
            self.model = self.accelerator.unwrap_model(self.model)
            self.accelerator.free_memory()  # its list of prepared models held the wrapper too
        if hasattr(self, "parts"):
            self.parts.model = self.model
        if self.lock is not None:
            self.lock.release()

    # ------------------------------------------------------------------------------ running
    def fit(self, until: int | None = None) -> dict[str, Any]:
        """Train to ``schedule.epochs``; return the summary (also written to the run directory). Raises
        ``TrainingDiverged`` or ``TrainingInterrupted`` (after a checkpoint at the position reached).
        ``until``: stop after that epoch instead and return its row, the run kept open for the next
        ``fit`` (the register study trains its twins in turns)."""
        if not self.fitted:
            self._print_header()
        self.fitted = True
        paused = False
        try:
            self._start_tracking()
            with self._stop_signals():
                result = self._train(until or self.cfg.schedule.epochs)
            paused = self.state.epoch < self.cfg.schedule.epochs
            return result
        finally:
            if not paused:
                self._end()

    def _end(self) -> None:
        """Finish the trackers and :meth:`close`."""
        if self.tracking:  # not accelerator.end_training: it destroys the caller's process group
            for tracker in self.accelerator.trackers:
                tracker.finish()
            self.accelerator.trackers.clear()
            self.tracking = False
        self.close()

    def _start_tracking(self) -> None:
        """Trackers through Accelerate (huggingface.co/docs/accelerate/usage_guides/tracking) logging under
        ``RUN/logs/``: the config, ``train/loss``, ``train/lr`` and each epoch's row as ``epoch/<column>``."""
        acc = self.accelerator
        logs = self.run_dir / "logs"
        name = self.run_dir.name
        if not acc.log_with or self.tracking:
            return
        acc.project_configuration.logging_dir = str(logs)
        if acc.is_main_process:
            logs.mkdir(parents=True, exist_ok=True)
        flat = flatten_config(self.cfg)
        hparams = {
            k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flat.items()
        }
        init_kwargs = {"wandb": {"name": name, "dir": str(logs)}, "mlflow": {"run_name": name}}
        acc.init_trackers(self.cfg.run.tracker_project, config=hparams, init_kwargs=init_kwargs)
        self.tracking = True

    @contextmanager
    def _stop_signals(self) -> Iterator[None]:
        """The first stop signal is acted on after the optimizer step; a second one ends the process."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be set from the main thread
            return

        def request(signum: int, frame: object) -> None:
            if self.stop_signal is not None:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self.stop_signal = signum

        previous = {signum: signal.signal(signum, request) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _train(self, until: int) -> dict[str, Any]:
        cfg = self.cfg
        acc = self.accelerator
        state = self.state
        epochs = cfg.schedule.epochs
        try:
            while state.epoch < min(until, epochs):
                epoch = state.epoch
                loss, images, seconds = train_one_epoch(
                    self.parts, state, epoch, epochs, self._after_update
                )
                state.train_seconds += seconds
                state.images_seen += images
                row: dict[str, Any] = dict(
                    epoch=epoch + 1, updates=state.num_updates, lr=self.schedule.lr
                )
                row |= dict(
                    train_loss=loss,
                    train_images_per_s=images / max(seconds, 1e-9),
                    epoch_seconds=seconds,
                )
                if (epoch + 1) % cfg.run.eval_every_epochs == 0 or epoch + 1 == epochs:
                    row.update(self._validate())
                row["bad_files"] = len(bad_files(acc, self.data.train_set, self.data.val_set))
                state.history.append(row)
                state.epoch = epoch + 1
                state.batch = 0
                state.epoch_samples = 0
                self.schedule.after_epoch(epoch)
                self._after_epoch(row)
                if state.epoch < epochs:  # after the last epoch the run completes instead
                    self._stop_if_requested(after_step=False)
        except NonFiniteLoss as e:
            raise self._diverged(str(e)) from e
        return self._finish() if state.epoch >= epochs else state.history[-1]

    def _validate(self) -> dict[str, Any]:
        """The row's validation columns, leaving the random generators as they were, so training
        draws the same whether it validates or not."""
        generators = RandomStates.capture()
        hook = self.on_validate
        out = self._evaluate_both() if hook is None else hook(self.raw_model)
        generators.restore()
        return out

    def _evaluate_both(self) -> dict[str, Any]:
        """Validate raw and EMA weights (a non-finite loss is a divergence)."""
        raw = evaluate(self.model, self.data.val_loader, self.accelerator)
        if raw.count == 0:
            raise RuntimeError("the validation set is empty on every process")
        out: dict[str, Any] = dict(
            val_loss=raw.loss, val_top1=raw.top1, val_top5=raw.top5, val_images=raw.count
        )
        if self._ema_matters():
            ema = evaluate(self.ema.module, self.data.val_loader, self.accelerator)
            out.update(ema_val_loss=ema.loss, ema_top1=ema.top1, ema_top5=ema.top5)
        bad = {
            k: out[k]
            for k in ("val_loss", "ema_val_loss")
            if k in out and not math.isfinite(out[k])
        }
        if bad:
            where = f"after epoch {self.state.epoch + 1} (optimizer step {self.state.num_updates})"
            raise self._diverged(", ".join(f"{k} is {v}" for k, v in bad.items()) + f" {where}")
        return out

    def _ema_matters(self) -> bool:
        """Whether to validate the EMA now: once past its horizon ``1 / (1 - decay)`` updates (before,
        without warmup, it mostly holds the starting weights), from the start with timm's warmup (it
        follows the run), and at the last epoch (the summary's EMA score)."""
        if self.ema is None:
            return False
        last = self.state.epoch + 1 == self.cfg.schedule.epochs
        past_horizon = self.state.num_updates * (1 - self.cfg.ema.decay) >= 1
        return self.cfg.ema.warmup or last or past_horizon

    def _after_epoch(self, row: dict[str, Any]) -> None:
        cfg = self.cfg
        acc = self.accelerator
        state = self.state
        improved = row.get("val_top1") is not None and row["val_top1"] > state.best_top1
        if improved:
            state.best_top1 = row["val_top1"]
            state.best_epoch = row["epoch"]
            if cfg.checkpoint.save_best:
                self._check_weights()
                self._save_model_dir(self.run_dir / rundir.BEST, row)
        if acc.is_main_process:
            write_metrics(state.history, self.run_dir / rundir.METRICS_CSV)
            plot_curves(
                state.history,
                self.run_dir / rundir.CURVES_PNG,
                title=f"{self.run_dir.name}: {self.model_description}",
            )
            acc.print(epoch_line(row, cfg.schedule.epochs))
        if self.tracking:
            numbers = {f"epoch/{k}": v for k, v in row.items() if isinstance(v, (int, float))}
            acc.log(
                {k: v for k, v in numbers.items() if not isinstance(v, bool)},
                step=state.num_updates,
            )
        if state.epoch % cfg.checkpoint.every_epochs == 0 or state.epoch == cfg.schedule.epochs:
            validated = row.get("val_loss") is not None
            self._save_checkpoint(
                f"finite validation loss after epoch {state.epoch}" if validated else None
            )
        if self.on_epoch_end is not None:
            self.on_epoch_end(row)

    def _after_update(self, end_of_epoch: bool, loss: float, lr: float) -> None:
        """After each step: the hook, trackers, confirm the pending checkpoint, a mid-epoch save, a
        requested stop."""
        if self.on_update is not None:
            self.on_update(loss)
        self._step_losses += [loss] if self.tracking else []
        if self.tracking and self.state.num_updates % self.cfg.run.log_every_steps == 0:
            mean = math.fsum(self._step_losses) / len(self._step_losses)
            self.accelerator.log({"train/loss": mean, "train/lr": lr}, step=self.state.num_updates)
            self._step_losses.clear()
        if self.pending is not None:
            self.checkpoints.confirm(
                self.pending, f"finite training loss at optimizer step {self.state.num_updates}"
            )
            self.pending = None
        if end_of_epoch:
            return  # the epoch end saves (and stops) after validation
        every = self.cfg.checkpoint.every_steps
        if every and self.state.num_updates % every == 0:
            self._save_checkpoint()
        self._stop_if_requested()

    def _save_checkpoint(self, validated: str | None = None) -> None:
        """A checkpoint of finite weights: good at once if ``validated`` (how), else pending the next loss."""
        self._check_weights()
        self.state.wall_seconds = self._wall_base + time.perf_counter() - self.session_start
        self.last_checkpoint = self.checkpoints.save(self.state.num_updates)
        if validated is not None:
            self.checkpoints.confirm(self.last_checkpoint, validated)
            self.pending = None
        else:
            self.pending = self.last_checkpoint

    def _check_weights(self) -> None:
        """Raise :class:`TrainingDiverged` when a raw or EMA weight is NaN / inf (one host sync)."""
        modules = [self.raw_model] + ([self.ema.module] if self.ema is not None else [])
        flags = [torch.isfinite(p).all() for m in modules for p in m.parameters()]
        if flags and not bool(torch.stack(flags).all()):
            raise self._diverged(
                f"a weight is not finite after optimizer step {self.state.num_updates} "
                f"(epoch {self.state.epoch + 1})"
            )

    def _stop_requests(self) -> list[float]:
        return [float(self.stop_signal == signum) for signum in STOP_SIGNALS]

    def _stop_if_requested(self, after_step: bool = True) -> None:
        """Stop when any process received a stop signal: checkpoint the exact position. Every process
        must stop at the same step: after a step they read the requests the step's loss check summed,
        after an epoch's validation they sum them (a collective)."""
        flags = self._stop_requests()
        if self.accelerator.num_processes > 1:
            flags = self.parts.stops if after_step else reduce_sums(self.accelerator, flags)
        received = [signum for signum, flag in zip(STOP_SIGNALS, flags, strict=True) if flag]
        if not received:
            return
        state = self.state
        if (
            self.last_checkpoint is None
            or checkpoint_number(self.last_checkpoint) != state.num_updates
        ):
            self._save_checkpoint()
        name = signal.Signals(received[0]).name
        raise TrainingInterrupted(
            f"stopped by {name} at epoch {state.epoch + 1}, batch {state.batch} (optimizer step "
            f"{state.num_updates}); saved {self.last_checkpoint}. Resume with "
            f"`vit5 train --resume {self.run_dir}`",
            received[0],
        )

    # ------------------------------------------------------------------------------ reporting
    def _print_header(self) -> None:
        cfg = self.cfg
        acc = self.accelerator
        data = self.data
        lines = [
            f"run directory  {self.run_dir}",
            f"model          {self.model_description}",
            *([f"pretrained     {self.load_report}"] if self.load_report else []),
            f"data           {cfg.data.dataset}: {num_images(data.train_set)} train / "
            f"{num_images(data.val_set)} val images, {self.raw_model.num_classes} classes, "
            + ("no augmentation" if cfg.aug.train == "none" else f"{cfg.aug.train} augmentation")
            + (
                f"; each epoch trains on all but {dropped} samples (less than one batch of "
                f"{acc.num_processes * cfg.data.batch_size} over all processes), the last of its shard order"
                if (dropped := getattr(data.train_set, "dropped", 0))
                else ""
            ),
            f"processes      {acc.num_processes} x {acc.device}"
            + (f" ({acc.distributed_type.value})" if acc.num_processes > 1 else "")
            + f", mixed precision {self.precision}",
            f"batch          {cfg.data.batch_size} per process x {acc.num_processes} x "
            f"{cfg.optim.accum_steps} accumulation = {self.global_batch}; {self.updates_per_epoch} optimizer "
            "steps per epoch",
            f"optimizer      {cfg.optim.name}, peak lr {self.peak_lr:.2e}, "
            f"weight decay {cfg.optim.weight_decay}, {count(cfg.schedule.epochs, 'epoch')}",
        ]
        state = self.state
        epochs = cfg.schedule.epochs
        if self.resumed_from is not None:
            where = f"epoch {state.epoch + 1}, batch {state.batch}, step {state.num_updates}"
            lines.append(f"resumed        from {self.resumed_from} ({where})")
        if self.fork_note:
            lines.append("forked         " + self.fork_note.replace("\n", "\n               "))
        notes = [*data.notes, *self.machine_notes]
        lines += [f"note           {note}" for note in notes]
        lines += [
            self.resume_warning,
            ema_horizon_warning(cfg.ema, self.updates_per_epoch * epochs),
        ]
        if state.epoch >= epochs:
            lines.append(
                f"nothing to train: all {count(epochs, 'epoch')} done (raise schedule.epochs)"
            )
        acc.print("\n".join(line for line in lines if line))

    def _save_model_dir(self, directory: Path, row: dict[str, Any]) -> None:
        model = self.model
        ema = self.ema
        if self.cfg.model.lora.enabled:  # a plain ViT-5 checkpoint: the adapters merged in
            model, ema = merged_for_export(self.raw_model, self.ema, self.cfg.model.lora)
        # a name read from the environment: its ${oc.env:}
        recorded = config_record(self.cfg)["run"]["name"]
        run = recorded if recorded != self.cfg.run.name else self.run_dir.name
        extra = dict(run=run, epoch=row["epoch"], num_updates=self.state.num_updates)
        extra |= {k: row.get(k) for k in ("val_top1", "ema_top1")}
        save_model_dir(self.accelerator, model, ema, directory, extra)

    def _finish(self) -> dict[str, Any]:
        acc = self.accelerator
        state = self.state
        last = state.history[-1]
        self._check_weights()
        self._save_model_dir(self.run_dir / rundir.FINAL, last)
        bad = bad_files(acc, self.data.train_set, self.data.val_set)
        ema_values = [r["ema_top1"] for r in state.history if r.get("ema_top1") is not None]
        wall = self._wall_base + time.perf_counter() - self.session_start
        summary = dict(
            status="completed",
            run_dir=str(self.run_dir),
            model=self.model_description,
            epochs=state.epoch,
            updates=state.num_updates,
            images_seen=state.images_seen,
            best_top1=state.best_top1 if state.best_epoch > 0 else None,
            best_epoch=state.best_epoch,
            final_top1=last.get("val_top1"),
            final_top5=last.get("val_top5"),
            val_images=last.get("val_images"),
            ema_top1=last.get("ema_top1"),
            best_ema_top1=max(ema_values) if ema_values else None,
            wall_seconds=wall,
            train_seconds=state.train_seconds,
            train_images_per_s=state.images_seen / max(state.train_seconds, 1e-9),
            num_processes=acc.num_processes,
            resumed_from=str(self.resumed_from) if self.resumed_from is not None else None,
            forked_from=str(self.forked_from) if self.forked_from is not None else None,
            resume_exact=self.resume_exact,
            resume_note=self.resume_warning or None,
            resumed_from_processes=self.resumed_elastic,
            bad_files=len(bad),
            bad_file_paths=bad,
            config=config_record(self.cfg),
        )
        if acc.is_main_process:
            write_summary(self.run_dir, summary)
            acc.print(format_summary(summary))
        acc.wait_for_everyone()
        return summary

    def _diverged(self, what: str) -> TrainingDiverged:
        """The error for a divergence, after setting aside the checkpoint not yet verified (written from the
        weights that diverged), so that `--resume RUN` finds the newest good one."""
        moved = ""
        if self.pending is not None:
            aside = self.checkpoints.set_aside(self.pending)
            moved = f" {self.pending.name} (written from these weights) was moved to {aside}."
            self.pending = None
        checkpoints = list_checkpoints(self.run_dir / rundir.CHECKPOINTS)
        good = next((c for c in reversed(checkpoints) if is_verified(c)), None)
        keep = "No checkpoint of this run is known good, so start it again"
        if good is not None:
            keep = f"The last good checkpoint is {good}; resume with `vit5 train --resume {self.run_dir}`"
        return TrainingDiverged(
            f"training diverged: {what}. Nothing was saved after it.{moved} {keep} after lowering optim.lr, "
            f"setting optim.clip_grad (e.g. 1.0) or lengthening schedule.warmup_epochs."
        )


def _check_memory(acc: Accelerator, cfg: TrainConfig, model: torch.nn.Module) -> None:
    """Refuse a run whose weights, optimizer states and kept activations (a lower bound) cannot fit."""
    bytes_per_value = 4 if acc.mixed_precision == "no" else 2
    batch = cfg.data.batch_size
    need = training_bytes(
        model.cfg, batch, bytes_per_value, cfg.model.grad_checkpointing, cfg.ema.enabled
    )
    check_fits(
        need,
        acc.device,
        f"training {cfg.model.name} at {cfg.model.img_size}px ({num_tokens(model.cfg):,} tokens per image) "
        f"with data.batch_size={batch}",
        "lower data.batch_size or model.img_size, set model.grad_checkpointing=true, or use a smaller model",
    )


def _check_distributed(acc: Accelerator, cfg: TrainConfig) -> None:
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != acc.num_processes:
        raise TrainConfigError(
            f"launched as {launched} processes but Accelerate runs {acc.num_processes}; each would train "
            f"alone. Launch with `accelerate launch --multi_gpu --num_processes N -m vit5 train` "
            f"or `torchrun --nproc_per_node N -m vit5 train`"
        )
    if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise TrainConfigError(
            f"{acc.distributed_type.value} is not supported: vit5 writes training checkpoints in its own "
            "format (safetensors, JSON and weights-only tensors, so that --resume never runs pickled code), "
            "which holds full, unsharded model and optimizer states. Train with DDP (accelerate launch "
            "--multi_gpu or torchrun), which fits every ViT-5 preset on current GPUs"
        )
