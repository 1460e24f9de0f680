"""Stage 1: LR tuning, one Optuna study per size (and per r unless ``tune_per_r: false``), run by Ray Tune.

Each study is one Tune experiment: ``OptunaSearch`` (TPE over log-LR seeded per study from ``tune.seed`` and
the study's name, :func:`study_seed`; metric and mode given to ``OptunaSearch`` itself, ``docs/ray_tune.md`` §1)
proposes LRs, or a Tune grid over ``tune.lr_values`` (:func:`lr_grid`) tries each listed LR once, and an
ASHA scheduler prunes on the validation loss reported at token milestones (time attribute: the milestone index
1..num_milestones). Trials train the grid's model on a short budget (tokens/param ratio, paper App. D). The
resulting table is :mod:`loopscale.sweep.lr_table`; the Optuna mirror callback is in :mod:`loopscale.sweep.callbacks`.

What survives a killed driver, and how (Tune's restore behaviour: ``docs/ray_tune.md`` §2):

* The sampler's study lives inside ``OptunaSearch`` and is checkpointed with Tune's experiment state, so after
  ``Tuner.restore`` the sampler and the trial list agree. A trial suggested after the last snapshot is lost
  by Tune and re-suggested (same LR: the seeded sampler state is restored); its run id (a hash of the run,
  LR included) finds the checkpoint or the finished result the lost trial left, so no LR is trained to
  completion twice.
* The persistent study (``<out>/tune_lr/optuna.db``, SQLite; ``optuna.load_study`` and optuna-dashboard open
  it) is written only by the driver, from a Tune callback, one finished trial at a time (COMPLETE, PRUNED or
  FAIL, with its milestone values), deduplicated by LR. It therefore never holds a RUNNING trial, and a
  resumed study ends with exactly ``num_samples`` finished trials (with ``lr_values``: one per value of
  :func:`lr_grid`).
* A driver killed while Tune copied its state to the storage path can leave a state file empty or truncated;
  ``Tuner.restore`` then half-restores and waits forever or runs too few trials. Such an experiment
  (:func:`loopscale.sweep.grid.tune_state_problem`) is not restored: its state files are set aside and the study
  goes on in a new experiment, which meets the finished and interrupted LRs through their run ids as above. Past
  TPE's random start-up trials its proposals may then differ, which can add finished trials; none is lost.
* Ray 2.60 does not save the scheduler with the experiment. :class:`PersistentASHA` keeps its rung records
  and decisions keyed by LR in a JSON file next to the experiment and reloads it, so a restored study makes
  the same stop decisions as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import warnings
from pathlib import Path

from loopscale.cluster.options import Interrupted
from loopscale.cluster.storage import join as uri_join
from loopscale.cluster.storage import remove as remove_uri
from loopscale.sweep import _seams
from loopscale.sweep.callbacks import _mirror_cls, optuna_storage
from loopscale.sweep.grid import fit_tuner, set_aside_tune_state, tune_state_problem, unfinished_trials
from loopscale.sweep.lr_table import DIVERGED_LOSS, _lr_table_schema, _plot, _smooth
from loopscale.sweep.workspace import RunWorkspace, event_metrics, tune_checkpoint_from

METRIC = "val_loss"
TIME_ATTR = "milestone"


def _lr_key(lr: float) -> str:
    return repr(float(lr))


# --- the ASHA scheduler with persistent rungs -----------------------------------------------------------


_ASHA_CLS = None


def __getattr__(name: str):
    # PersistentASHA subclasses Ray's ASHAScheduler; it is built on first use so importing this module does not
    # import Ray. Pickle (Tune's tuner.pkl) finds it again through this hook.
    if name == "PersistentASHA":
        return _persistent_asha_cls()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _persistent_asha_cls():
    global _ASHA_CLS
    if _ASHA_CLS is not None:
        return _ASHA_CLS
    from ray.tune.schedulers import ASHAScheduler

    class PersistentASHA(ASHAScheduler):
        """``ASHAScheduler`` (one bracket) whose rungs and decisions persist in ``state_path`` (JSON).

        Records are keyed by the trial's LR (``config["lr"]``), not by Tune's trial id, so a trial re-created
        under a new id after a restore meets its own records. A result at a rung this LR has already passed gets
        the recorded decision back; otherwise the decision is ASHA's: stop when the value is worse than the
        (1 - 1/reduction_factor) quantile of the values recorded at that rung (Li et al. 2020, as Ray's
        ``_Bracket.on_result``). ``time_attr`` results >= ``max_t`` stop the trial.
        """

        def __init__(
            self,
            state_path: str,
            *,
            time_attr: str,
            metric: str,
            mode: str,
            max_t: int,
            grace_period: int,
            reduction_factor: float,
        ):
            super().__init__(
                time_attr=time_attr,
                metric=metric,
                mode=mode,
                max_t=max_t,
                grace_period=grace_period,
                reduction_factor=reduction_factor,
                brackets=1,
            )
            self._state_path = state_path
            self._rung_ms = [m for m, _ in self._brackets[0]._rungs]  # descending
            self._state: dict | None = None

        def _load(self) -> dict:
            if self._state is None:
                from loopscale.cluster.storage import read_json_or_aside

                self._state = read_json_or_aside(self._state_path) or {
                    "rungs": {},
                    "decisions": {},
                    "history": {},
                }
            return self._state

        def _save(self) -> None:
            from loopscale.cluster.storage import write_text_atomic

            write_text_atomic(str(Path(self._state_path)), json.dumps(self._state, sort_keys=True))

        def on_trial_add(self, tune_controller, trial):
            super().on_trial_add(tune_controller, trial)

        def on_trial_remove(self, tune_controller, trial):
            self._trial_info.pop(trial.trial_id, None)

        def _decide(self, trial, result: dict) -> str:
            from ray.tune.schedulers import TrialScheduler

            if self._time_attr not in result or self._metric not in result:
                return TrialScheduler.CONTINUE
            st = self._load()
            key = _lr_key(trial.config["lr"])
            t = int(result[self._time_attr])
            value = float(result[self._metric])
            st["history"].setdefault(key, {})[str(t)] = value
            action = TrialScheduler.CONTINUE
            if t >= self._max_t:
                action = TrialScheduler.STOP
            else:
                for m in self._rung_ms:
                    if t < m:
                        continue
                    rung = st["rungs"].setdefault(str(m), {})
                    dkey = f"{key}@{m}"
                    if key in rung:
                        action = (
                            st["decisions"].get(dkey, TrialScheduler.CONTINUE)
                            if t == m
                            else TrialScheduler.CONTINUE
                        )
                        break
                    import numpy as np

                    vals = list(rung.values())
                    reward = self._metric_op * value
                    if vals:
                        cutoff = np.nanpercentile(vals, (1 - 1 / self._reduction_factor) * 100)
                        if reward < cutoff:
                            action = TrialScheduler.STOP
                    rung[key] = reward
                    st["decisions"][dkey] = action
                    break
            self._save()
            if action == TrialScheduler.STOP:
                self._num_stopped += 1
            return action

        def on_trial_result(self, tune_controller, trial, result):
            return self._decide(trial, result)

        def on_trial_complete(self, tune_controller, trial, result):
            self._trial_info.pop(trial.trial_id, None)

        def state(self) -> dict:
            """The persisted state: rungs {milestone: {lr: reward}}, decisions {lr@milestone: action},
            history {lr: {milestone: val_loss}}."""
            return self._load()

    PersistentASHA.__module__ = __name__
    PersistentASHA.__qualname__ = "PersistentASHA"
    _ASHA_CLS = PersistentASHA
    return PersistentASHA


# --- the search space (picklable define-by-run) ---------------------------------------------------------


class LRSpace:
    """Define-by-run space for ``OptunaSearch``: suggests ``lr`` log-uniform in [lr_min, lr_max] and returns the
    constant part of the trial config. With ``lr_values`` (a grid study, no sampler) its categorical
    :meth:`distribution` is what the Optuna record of each trial carries."""

    def __init__(self, constants: dict, lr_min: float, lr_max: float, lr_values: list[float] | None):
        self.constants = constants
        self.lr_min, self.lr_max, self.lr_values = lr_min, lr_max, lr_values

    def __call__(self, trial) -> dict:
        if self.lr_values:
            trial.suggest_categorical("lr", list(self.lr_values))
        else:
            trial.suggest_float("lr", self.lr_min, self.lr_max, log=True)
        return dict(self.constants)

    def distribution(self):
        import optuna

        if self.lr_values:
            return optuna.distributions.CategoricalDistribution(list(self.lr_values))
        return optuna.distributions.FloatDistribution(self.lr_min, self.lr_max, log=True)


# --- the trainable --------------------------------------------------------------------------------------


def _cell_with_lr(base: dict, lr: float):
    from loopscale.sweep.spec import Cell

    d = json.loads(json.dumps(base))
    d["run"]["lr"] = float(lr)
    return Cell.from_dict(d)


def lr_trainable(config: dict) -> None:
    """Ray Tune trainable of one LR trial: trains the study's cell at ``config["lr"]`` on the short budget and
    reports ``val_loss`` at milestones 1..M (``milestone`` = tokens / milestone_tokens). The last milestone
    is reported only after the result is saved, so a stop there cannot lose it. A run id that already
    finished replays its recorded milestones instead of training."""
    from ray import tune

    cell = _cell_with_lr(config["base"], config["lr"])
    rid = cell.run_id
    storage_uri = config["storage"]
    mtok = float(config["milestone_tokens"])
    M = int(config["num_milestones"])
    ws = RunWorkspace(storage_uri, rid)
    done = ws.result()

    def milestone(tokens: float) -> int:
        return int(round(tokens / mtok))

    if done is None:
        from loopscale.model.train import train_run

        ws.prepare_resume()
        for m, val, tokens, step in _milestones_passed(ws.dir, milestone, M):
            # an earlier attempt passed these milestones (its checkpoint says so): reported again, since a stop
            # between its checkpoint and its report kept one from the scheduler, which then skipped that rung for
            # this LR; a rung it has recorded answers with the recorded decision, a missing one is judged now
            tune.report({TIME_ATTR: m, METRIC: val, "tokens": tokens, "replayed": True,
                         **({"step": int(step)} if step is not None else {})})  # fmt: skip

        def callback(event: dict) -> None:
            _seams.maybe_fail(config.get(_seams.CONFIG_KEY), storage_uri, rid, int(event.get("step") or 0))
            if event.get("checkpoint_path"):
                ws.push()
            if event.get("val_loss") is None:
                return
            m = milestone(float(event["tokens"]))
            if m < 1 or m >= M:
                return
            ckpt, stage = tune_checkpoint_from(event.get("checkpoint_path"))
            try:
                met = event_metrics(event)
                met.update({TIME_ATTR: m, METRIC: float(event["val_loss"])})
                tune.report(met, checkpoint=ckpt)
            finally:
                if stage is not None:
                    shutil.rmtree(stage, ignore_errors=True)

        res = train_run(cell.run_config(checkpoint_dir=str(ws.dir)), callback=callback).to_dict()
        done = json.loads(json.dumps(res, default=str))
        ws.save_result(done)
        _seams.mark_trained(config.get(_seams.CONFIG_KEY), storage_uri, rid)
    else:
        for pt in done.get("curve") or []:
            if pt.get("val_loss") is None:
                continue
            m = milestone(float(pt["tokens"]))
            if 1 <= m < M:
                tune.report({TIME_ATTR: m, METRIC: float(pt["val_loss"]), "tokens": pt["tokens"], "replayed": True,
                             **({"step": int(pt["step"])} if pt.get("step") is not None else {})})  # fmt: skip
    final = done.get("final_val_loss")
    # the step of the last point of its curve (a diverged run's stop), else of the run as defined: the trackers log
    # every report at its step (without one, the final loss was logged at the previous milestone's step)
    curve = done.get("curve") or []
    tune.report(
        {
            TIME_ATTR: M,
            METRIC: float(final) if final is not None and math.isfinite(final) else DIVERGED_LOSS,
            "tokens": done.get("D"),
            "step": int(curve[-1]["step"] if curve and curve[-1].get("step") is not None else done.get("steps") or 0),
            "status": done.get("status", "ok"),
            UNHEALTHY_KEY: unhealthy_reason(done) or "",
        }
    )


def _milestones_passed(ckpt_dir: Path, milestone, M: int) -> list[tuple[int, float, float, int | None]]:
    """``(milestone, val_loss, tokens, step)`` of the validation points in the curve of the newest readable checkpoint in
    ``ckpt_dir`` (milestones 1..M-1; none without a checkpoint)."""
    from loopscale.model.train import CheckpointError, latest_checkpoint, load_checkpoint

    path = latest_checkpoint(ckpt_dir)
    if path is None:
        return []
    try:
        curve = load_checkpoint(path).get("curve") or []
    except (CheckpointError, OSError):  # torn or foreign: the trainer moves it aside and starts over
        return []
    out = []
    for pt in curve:
        if pt.get("val_loss") is not None and 1 <= milestone(float(pt["tokens"])) < M:
            out.append((milestone(float(pt["tokens"])), float(pt["val_loss"]), pt["tokens"], pt.get("step")))
    return out


UNHEALTHY_KEY = "unhealthy"
"""Final-report key of an LR trial: why it must not be chosen ("" for a healthy trial)."""


def unhealthy_reason(result: dict) -> str | None:
    """Why an LR trial's finished run (``RunResult.to_dict()``) must never be chosen, or None when it is healthy.

    * diverged: a NaN/inf or exploding training loss (the trainer's status ``diverged``), or a non-finite
      validation loss;
    * did not learn: the trainer's status ``did_not_learn`` (its final loss not below ln V, or its model collapsed
      to one prediction: :data:`loopscale.model.train.DID_NOT_LEARN`), a validation loss not below the start level
      ln V (the loss of the uniform prediction an untrained model starts at), or a loss that did not go below its
      value at the first milestone (a flat curve: the run collapsed to a constant prediction, whatever the LR; or
      a rising one: it got worse after the first milestone, unstable at that LR, even when its end is below a
      healthy trial's).
    """
    if result.get("status") == "diverged":
        return f"diverged at step {result.get('diverged_step')} (NaN/inf or exploding training loss)"
    if result.get("status") == "did_not_learn":  # the trainer's own verdict (loss not below ln V, or a collapse)
        why = [w for w in result.get("warnings") or [] if "did_not_learn" in w]
        return "did not learn: " + (why[0] if why else "the trainer's status did_not_learn")
    vals = [pt["val_loss"] for pt in result.get("curve") or [] if pt.get("val_loss") is not None]
    final = result.get("final_val_loss")
    if final is None or not all(math.isfinite(v) for v in [*vals, final]):
        return "diverged (non-finite validation loss)"
    start = math.log(int(result.get("vocab_size") or 0) or 1)
    if final >= start:
        return f"did not learn: validation loss {final:.4f} is not below the start level ln V = {start:.4f}"
    if len(vals) >= 2 and not final < vals[0] * (1 - 1e-6):
        shape = ("a rising curve: the loss got worse after the first milestone, training is unstable at this LR"
                 if final > vals[0] * (1 + 1e-3) else "a flat curve")  # fmt: skip
        return (
            f"did not learn: validation loss {final:.4f} at the end is not below {vals[0]:.4f} at the first "
            f"milestone ({shape})"
        )
    return None


def _lr_trial_dirname(trial) -> str:
    return f"lr_{trial.trial_id}"


def _lr_trial_name(trial) -> str:
    """An LR trial's name, which MLflow and TensorBoard show (every study of a command logs into one MLflow
    experiment): ``lr_<LR>_size<S>_r<R>_<trial id>``, e.g. ``lr_0.0742_size16_r2_22c25335``. Tune's default,
    ``lr_trainable_<trial id>``, told neither the LR nor the study."""
    cfg = trial.config or {}
    base = cfg.get("base") or {}
    lr = cfg.get("lr")
    shown = f"{float(lr):.4g}" if isinstance(lr, int | float) else "x"
    return f"lr_{shown}_size{base.get('size')}_r{base.get('r')}_{trial.trial_id}"


# --- one study ----------------------------------------------------------------------------------------


def study_plan(
    spec,
    size: int,
    r: int,
    tune_dir: Path,
    storage_path: str,
    *,
    experiment: str,
    track: tuple = (),
    only_lrs: list[float] | None = None,
):
    """Pure assembly of one study: the base cell, the budget, the space, scheduler and Tuner pieces.

    Returns a dict with ``trainable``, ``param_space`` (with ``lr_values``: a ``tune.grid_search`` over
    :func:`lr_grid`, each value tried once; else None and ``OptunaSearch`` proposes), ``tune_config``,
    ``run_config``, ``space``, ``scheduler``, ``study_name``, ``budget_tokens``, ``milestone_tokens`` and
    ``experiment`` (Tune's experiment name; no Ray is started). ``track``: parsed ``--track`` targets, whose Ray
    logger callbacks join the run config (:mod:`loopscale.sweep.tracking`). ``only_lrs``: the study's experiment
    for these LRs alone (each tried once, no sampler), named ``<experiment>_again`` and sharing the study's rung
    records and Optuna study: the LRs whose trials Tune could not restore, trained again from their own
    checkpoints (:func:`_run_study`)."""
    import optuna
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from loopscale.model.accounting import n_once, n_rec
    from loopscale.sweep import tracking

    ts = spec.tune
    base, steps, every = tuning_budget(spec, size, r)
    cfg, B, M = base.run.model, spec.training.batch_tokens, ts.num_milestones
    run = base.run_config(
        tokens=steps * B,
        target_flops=None,
        lr_data_factor=1.0,  # the trials train at D_ref itself: the LR they find is the one transferred from
        eval_every_steps=every,
        checkpoint_every_steps=every,
        eval_tokens=ts.eval_tokens or spec.training.eval_tokens,
        seed=spec.seeds_for(min(spec.r))[0],
    )
    base_d = dataclasses.replace(base, run=run, budget=None).to_dict()
    name = study_name(spec.name, size, r)
    constants = {
        "base": base_d,
        "storage": storage_path,
        "milestone_tokens": every * B,
        "num_milestones": M,
        _seams.CONFIG_KEY: _seams.from_env(),
    }
    space = LRSpace(constants, ts.lr_min, ts.lr_max, ts.lr_values)
    param_space, search, num_samples = None, None, ts.num_samples
    if only_lrs:
        param_space, num_samples = {**constants, "lr": tune.grid_search(sorted(set(only_lrs)))}, 1
    elif ts.lr_values:
        # a finite set: each value of it tried exactly once (a sampler repeats some values and misses others)
        param_space, num_samples = {**constants, "lr": tune.grid_search(lr_grid(ts))}, 1
    else:
        sampler = optuna.samplers.TPESampler(seed=study_seed(ts.seed, name))
        search = OptunaSearch(space=space, metric=METRIC, mode="min", sampler=sampler)
    scheduler = _persistent_asha_cls()(
        str(tune_dir / "asha" / f"{experiment}.json"),
        time_attr=TIME_ATTR,
        metric=METRIC,
        mode="min",
        max_t=M,
        grace_period=ts.grace_milestones,
        reduction_factor=ts.reduction_factor,
    )
    resources = {"cpu": float(spec.resources.cpus)}
    if spec.resources.gpus:
        resources["gpu"] = float(spec.resources.gpus)
    db = f"sqlite:///{(tune_dir / 'optuna.db').resolve()}"
    mirror = _mirror_cls()(db, name, space, M, str(tune_dir / "asha" / f"{experiment}.json"))
    tune_config = tune.TuneConfig(
        search_alg=search,
        scheduler=scheduler,
        num_samples=num_samples,
        max_concurrent_trials=ts.max_concurrent,
        reuse_actors=True,
        trial_name_creator=_lr_trial_name,
        trial_dirname_creator=_lr_trial_dirname,
    )
    run_config = tune.RunConfig(
        name=f"{experiment}_again" if only_lrs else experiment,
        storage_path=storage_path,
        verbose=0,
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        callbacks=[
            mirror,
            *tracking.callbacks(track, tune_dir.parent, experiment, f"loopscale-{spec.name}-tune-lr"),
        ],
    )
    return dict(
        trainable=tune.with_resources(lr_trainable, resources),
        param_space=param_space,
        tune_config=tune_config,
        run_config=run_config,
        space=space,
        scheduler=scheduler,
        mirror=mirror,
        study_name=name,
        experiment=run_config.name,
        storage_url=db,
        budget_tokens=steps * B,
        milestone_tokens=every * B,
        N_unique=n_once(cfg) + n_rec(cfg),
        N_usage=n_once(cfg) + r * n_rec(cfg),
    )


def lr_grid(tune_spec) -> list[float]:
    """The LRs a study with ``tune.lr_values`` tries, each once: all distinct values, sorted, when ``num_samples``
    covers them; else ``num_samples`` of them spread evenly over the sorted list, its smallest and largest included
    (7 values, 5 samples: the 1st, 3rd, 4th, 5th and 7th).

    Raises:
        ValueError: no ``lr_values``.
    """
    values = sorted(set(tune_spec.lr_values or []))
    if not values:
        raise ValueError("lr_grid needs tune.lr_values")
    k = tune_spec.num_samples
    if k >= len(values):
        return values
    if k == 1:
        return [values[len(values) // 2]]
    return [values[round(i * (len(values) - 1) / (k - 1))] for i in range(k)]


def trials_per_study(tune_spec) -> int:
    """Trials one LR study runs: one per LR of :func:`lr_grid` with ``lr_values``, else ``num_samples``."""
    return len(lr_grid(tune_spec)) if tune_spec.lr_values else tune_spec.num_samples


MIN_RUNG_STEPS = 48
"""A first ASHA rung after fewer optimizer steps than this (``tune.grace_milestones`` x the steps per milestone) is
said before the tuning starts (:func:`early_rung_warning`): so early, the trials rank by how fast their first steps
descend, which favours the highest LRs (:data:`_EARLY_RUNG_MEASURED`)."""

_EARLY_RUNG_MEASURED = (
    "measured with loopscale's trainer on the smoke preset's model and AdamW at d = 16, r = 4, seven LRs from 1e-4 "
    "to 0.1 trained 128 steps: the LR best at the end, 0.01, ranked third of the seven at every step to 38, "
    "between third and first up to 46, and first at every step from 47 on; docs/bench_cpu/lr_rank_by_step_smoke.json"
)


def early_rung_warning(spec) -> str | None:
    """With ``lr: tune``: a warning when ASHA first compares a study's trials after fewer than :data:`MIN_RUNG_STEPS`
    optimizer steps (``tune.grace_milestones`` x the steps per milestone of :meth:`SweepSpec.tuning_steps`), naming
    the study where that comes soonest; None when no study does, when ASHA compares only at the last milestone
    (``grace_milestones`` = ``num_milestones``) or a study runs one trial. ASHA stops a trial whose loss at a rung is
    worse than the (1 - 1/``reduction_factor``) quantile of those recorded there, and a few steps in, the LR that
    ends best can sit mid-field (:data:`_EARLY_RUNG_MEASURED`)."""
    if spec.lr != "tune":
        return None
    ts = spec.tune
    if ts.grace_milestones >= ts.num_milestones or trials_per_study(ts) < 2:
        return None
    per_milestone = {key: spec.tuning_steps(*key)[1] for key in study_keys(spec)}
    early = {k: per for k, per in per_milestone.items() if ts.grace_milestones * per < MIN_RUNG_STEPS}
    if not early:
        return None
    (size, r), per = min(early.items(), key=lambda kv: (kv[1], kv[0]))
    n = ts.grace_milestones * per
    which = f"{len(early)} of {len(per_milestone)} LR studies" if len(per_milestone) > 1 else "the LR study"
    return (f"ASHA first compares the trials of {which} after fewer than {MIN_RUNG_STEPS} optimizer steps (size "
            f"{size}, r {r}: after {n} step{'s' * (n != 1)}, tune.grace_milestones = {ts.grace_milestones} x {per} "
            f"step{'s' * (per != 1)} per milestone) and stops the worse trials there (tune.reduction_factor = "
            f"{ts.reduction_factor:g}). That early, trials rank by how fast their first steps descend, which favours "
            f"the highest LRs ({_EARLY_RUNG_MEASURED}), so the LR that would end best may be stopped. Raise "
            f"tune.grace_milestones (set to tune.num_milestones, {ts.num_milestones}, ASHA stops no trial early) or "
            "tune.tokens / tune.tokens_per_param")  # fmt: skip


def study_keys(spec) -> list[tuple[int, int]]:
    """``(size, r)`` of every LR study of ``spec``, in the order tune-lr runs them: one per size and r, or with
    ``tune.tune_per_r: false`` one per size at the largest r."""
    rs = sorted(spec.r) if spec.tune.tune_per_r else [max(spec.r)]
    return [(s, r) for s in spec.all_sizes() for r in rs]


def tuning_tokens_asked(spec, cfg, r: int) -> float:
    """The tokens an LR trial of model ``cfg`` at ``r`` is asked to train: ``tune.tokens``, or ``tune.tokens_per_param
    * (N_once + r N_rec)`` (paper App. D), before :func:`tuning_budget` rounds them to whole steps per milestone."""
    from loopscale.model.accounting import n_once, n_rec

    ts = spec.tune
    return ts.tokens if ts.tokens is not None else ts.tokens_per_param * (n_once(cfg) + r * n_rec(cfg))


def tuning_budget(spec, size: int, r: int):
    """The base cell of the (size, r) study and its budget: ``(cell, steps, steps_per_milestone)``. The budget is
    :func:`tuning_tokens_asked`, in whole steps of the training batch, rounded up to a whole number of steps per
    milestone (at least one step per milestone). The base cell is the ``baseline`` model of (size, r), whose LR every
    variant's runs of (size, r) train with, also when the spec's ``variants`` do not list ``baseline``."""
    if not any(v.name == "baseline" for v in spec.variants):
        spec = spec.model_copy(update={"variants": [{"name": "baseline"}]})
    lr_tab = {(s, rr): 1.0 for s in spec.all_sizes() for rr in spec.r}
    cells = [
        c for c in spec.cells(lr_table=lr_tab) if c.size == size and c.r == r and c.variant == "baseline"
    ]
    steps, every = spec.tuning_steps(size, r)
    return cells[0], steps, every


class TuneInterrupted(Interrupted):
    """The driver was stopped (SIGINT) before every study finished; rerun with ``--resume``."""


def _run_study(
    spec, size: int, r: int, tune_dir: Path, storage_path: str, resume: bool, track: tuple = ()
) -> dict:
    import optuna
    from ray import tune

    experiment = f"tune_lr_{study_name(spec.name, size, r)}"
    plan = study_plan(spec, size, r, tune_dir, storage_path, experiment=experiment, track=track)
    optuna.create_study(
        study_name=plan["study_name"],
        storage=optuna_storage(plan["storage_url"]),
        direction="minimize",
        load_if_exists=True,
    )
    exp_uri = uri_join(storage_path, experiment)
    restorable = resume and tune.Tuner.can_restore(exp_uri)
    torn = tune_state_problem(exp_uri) if restorable else None
    if restorable and not torn:
        tuner = tune.Tuner.restore(
            exp_uri, trainable=plan["trainable"], resume_unfinished=True, resume_errored=True
        )
        from loopscale.sweep import console, tracking

        if note := tracking.check_restored(tuner, tuple(track), experiment):
            console.current().say(note, err=True)
    else:
        if torn:
            # the study goes on in a new experiment: the seeded sampler proposes the same LRs in the same order
            # while it samples at random (TPE's first 10 trials; later ones may differ), finished LRs replay their
            # saved results, interrupted ones continue from their checkpoints, and the rung records (keyed by LR)
            # are kept, so ASHA decides as it did
            set_aside_tune_state(exp_uri)
            from loopscale.sweep import console

            console.current().say(
                f"tune-lr: Tune's saved state of size {size}, r {r} is unreadable ({torn}: the driver was stopped "
                "while Tune copied it); the study goes on in a new experiment in the same folder (its old state "
                "files are kept as *.unreadable-*)",
                err=True,
            )
        else:  # a fresh start, on any storage: an earlier attempt's folder (never restored) is not mixed into it
            remove_uri(exp_uri)
            Path(tune_dir / "asha" / f"{experiment}.json").unlink(missing_ok=True)
        tuner = _new_tuner(plan)
    lost = _fit_study(tuner, plan, exp_uri, size, r)
    if lost:
        # a driver killed between Tune's snapshot and its checkpoint retention left trials whose restore failed
        # (the snapshot named a deleted checkpoint: docs/ray_tune.md section 2); their LRs go on from their own
        # checkpoints in a fresh experiment beside the study's, with its rung records and Optuna study, once
        # each: a study keeps its trials (it had ended 7 of 8 with one FAIL)
        from loopscale.sweep import console

        many = len(lost) != 1
        console.current().say(
            f"tune-lr: Tune could not restore {len(lost)} trial{'s' * many} of size {size}, r {r} (the saved state "
            f"named a checkpoint already deleted); LR{'s' * many} " + ", ".join(f"{x:.4g}" for x in lost)
            + f" go{'es' * (not many)} on from {'their' if many else 'its'} own checkpoints",
            err=True,
        )
        again = study_plan(spec, size, r, tune_dir, storage_path, experiment=experiment, track=track, only_lrs=lost)
        again_uri = uri_join(storage_path, again["experiment"])
        remove_uri(again_uri)  # an earlier attempt's, on any storage: its LRs meet their workspaces again
        _fit_study(_new_tuner(again), again, again_uri, size, r)
    return plan


def _new_tuner(plan: dict):
    """A new ``tune.Tuner`` (not restored) of a :func:`study_plan`."""
    from ray import tune

    return tune.Tuner(
        plan["trainable"], param_space=plan["param_space"], tune_config=plan["tune_config"], run_config=plan["run_config"]
    )


def _fit_study(tuner, plan: dict, exp_uri: str, size: int, r: int) -> list[float]:
    """Fit ``tuner`` (one study's experiment, saved at ``exp_uri``), record every trial it ended in the Optuna
    study (a finished trial whose record the driver's death had lost is recorded now) and return the LRs of its
    trials Tune could not restore (:func:`loopscale.sweep.grid.lost_checkpoint`), sorted.

    Raises:
        TuneInterrupted: the driver was stopped (SIGINT) or a trial is left unfinished."""
    import logging

    from ray import tune

    from loopscale.sweep.grid import lost_checkpoint

    with warnings.catch_warnings():
        # a restored trial replays the milestones its checkpoint passed (ASHA's rungs need them); OptunaSearch's
        # in-memory study, which only feeds the TPE sampler, already holds those steps and says it ignores them
        warnings.filterwarnings("ignore", message="The reported value is ignored because this `step=")
        grid = fit_tuner(tuner)
    if grid.stopped_by_signal or unfinished_trials(exp_uri):
        raise TuneInterrupted(f"LR tuning of size {size}, r {r} was interrupted")
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    trials = tune.ExperimentAnalysis(exp_uri).trials
    for t in trials:
        if t.status in ("TERMINATED", "ERROR"):
            plan["mirror"]._record(t, failed=t.status == "ERROR")
    return sorted({float(t.config["lr"]) for t in trials if lost_checkpoint(t) and "lr" in t.config})


def study_name(spec_name: str, size: int, r: int) -> str:
    """The Optuna study (in ``tune_lr/optuna.db``) of LR tuning at ``size`` and ``r``."""
    return f"{spec_name}_size{size}_r{r}"


def done_marker(out_dir: str | Path, size: int, r: int) -> Path:
    """The file tune-lr writes in ``out_dir`` once the study at ``size`` and ``r`` has ended with a healthy trial
    (``tune_lr/done/size<s>_r<r>.json``): such a study is not tuned again."""
    return Path(out_dir) / "tune_lr" / "done" / f"size{size}_r{r}.json"


def _existing_studies(storage_url: str, study_names):
    """``(name, study)`` of each of ``study_names`` that ``storage_url`` holds, in their order (none created)."""
    import optuna

    storage = optuna_storage(storage_url)
    have = set(optuna.study.get_all_study_names(storage))
    for name in study_names:
        if name in have:
            yield name, optuna.load_study(study_name=name, storage=storage)


def best_trials(storage_url: str, study_names) -> dict[str, tuple[float, float, int]]:
    """``{study name: (lr, validation loss, trials)}`` of the best healthy trial (:func:`_choose`) of each of
    ``study_names`` in ``storage_url`` that has one: what a study has found so far."""
    out = {}
    for name, study in _existing_studies(storage_url, study_names):
        lr, val, n, _ = _choose(study)
        if lr is not None:
            out[name] = (lr, val, n)
    return out


def finished_trials(storage_url: str, study_names) -> list[tuple[str, float, str, float | None]]:
    """(study name, lr, state name, value) of each finished trial (complete, pruned or failed) that the studies
    ``study_names`` hold in ``storage_url``: those of a study an earlier command began (stopped mid-study, or
    without a healthy trial); none of a study not created yet."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    out = []
    for name, study in _existing_studies(storage_url, study_names):
        for t in study.get_trials(deepcopy=False, states=states):
            out.append((name, float(t.params["lr"]), t.state.name, t.value))
    return out


def _study_failure(study) -> tuple[str, list[str]] | None:
    """(kind, reasons) when no trial of ``study`` is complete and healthy, else None. kind is ``"error"`` when every
    trial raised, ``"unhealthy"`` otherwise (some diverged or did not learn, see :func:`unhealthy_reason`)."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    if any(t.state == optuna.trial.TrialState.COMPLETE and t.value is not None for t in trials):
        return None
    reasons = [t.user_attrs.get("fail_reason") or t.state.name.lower() for t in trials]
    raised = trials and all(t.user_attrs.get("fail_kind") == "error" for t in trials)
    return ("error" if raised else "unhealthy"), reasons


def check_tune_samples(spec, out: str | Path) -> None:
    """Refuse LR studies of one trial each before they start: with ``lr: tune`` and ``tune.num_samples`` 1 a study
    tries one LR (a random draw, or the middle of ``tune.lr_values``) and calls it the best, though one
    ``lr_values`` entry is refused as nothing to tune. A folder whose LR table is written, or whose studies are
    all done, is not refused: nothing would be tuned there (its spec still loads, and ``--resume`` continues it).

    Raises:
        ValueError: a study of one trial would run in ``out``; nothing is written.
    """
    from loopscale.sweep.lr_table import lr_table_present

    if spec.lr != "tune" or spec.tune.num_samples >= 2 or lr_table_present(Path(out) / "lr_table.parquet"):
        return
    if all(done_marker(Path(out), s, r).is_file() for s, r in study_keys(spec)):
        return
    raise ValueError(
        f"tune.num_samples {spec.tune.num_samples} tries one LR per study: there is nothing to tune; give 2 or more "
        "(the default is 8), or fix the LR with lr: {fixed: LR}"
    )


def rejected_trials(study) -> list[tuple[float, str]]:
    """``(lr, reason)`` of each trial of ``study`` that finished but may never be chosen (diverged or did not learn,
    :func:`unhealthy_reason`; trials that raised are not listed), by LR."""
    return sorted(
        (float(t.params["lr"]), t.user_attrs["fail_reason"])
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get("fail_kind") == "unhealthy" and "lr" in t.params
    )


def rejected_note(size: int, r: int, study, tune=None) -> str | None:
    """One console line naming a study's rejected trials with their LR and reason, or None when it has none: a
    trial rejected as flat or diverged is otherwise seen only as a failed marker in ``lr_table.png``. A rejected
    trial whose last validation loss is below the chosen trial's (e.g. a curve that rose after its first milestone,
    yet ended lower) is named as such, with the LRs between the two to try (``tune``: the spec's tune section,
    for the advice; None: generic): the choice then rests on the stability rule, not on the losses."""
    import optuna

    rejected = rejected_trials(study)
    if not rejected:
        return None
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    line = f"size {size}, r {r}: {len(rejected)} of {len(trials)} trials rejected: " + "; ".join(
        f"LR {lr:.3g}: {why}" for lr, why in rejected
    )
    if len(complete) == 1:  # nothing was compared: the chosen LR is merely the one that trained without a fault
        line += ("; the chosen LR is the study's only healthy trial, so no LR was compared with it: raise "
                 "tune.num_samples, or narrow tune.lr_min / lr_max toward it")  # fmt: skip
    if complete:
        best = min(complete, key=lambda t: (t.value, t.params["lr"]))
        ends = [(float(t.params["lr"]), t.intermediate_values[max(t.intermediate_values)]) for t in trials
                if t.user_attrs.get("fail_kind") == "unhealthy" and "lr" in t.params and t.intermediate_values]
        values = sorted(set(tune.lr_values or [])) if tune is not None else []
        for lr, val in sorted(e for e in ends if e[1] < best.value):
            lo, hi = sorted((float(best.params["lr"]), lr))
            if any(lo < v < hi for v in values):  # listed, not drawn: num_samples spread fewer over the set
                how = "raise tune.num_samples to try the values of tune.lr_values between them"
            elif values:
                how = "add LRs between them to tune.lr_values"
            else:
                how = "more LRs between them (tune.num_samples) would tell"
            line += (f"; LR {lr:.3g} ended below the chosen LR {best.params['lr']:.3g} (val {val:.4f} against "
                     f"{best.value:.4f}) and was rejected for the reason above, not for its loss: the best stable LR "
                     f"may lie between {lo:.3g} and {hi:.3g}; {how}")
    return line


def _no_healthy_trial(spec, failures: dict, n_studies: int, n_trials: int, plotted: list = ()):
    """The error for studies without a healthy trial: "0 of N runs finished ok: <most common error>" when every trial
    of every study raised, else "all N trials diverged or did not learn at LR in [a, b]" per study (or, where ASHA
    pruned some, "no trial of N learned ...: k diverged or did not learn ... and p were stopped early"), with what to
    do next (and the ``plotted`` loss-vs-LR figures' paths)."""
    from collections import Counter

    from loopscale.sweep.grid import NoRunFinished, no_run_finished

    if len(failures) == n_studies and all(kind == "error" for kind, _ in failures.values()):
        return no_run_finished(n_trials, [x for _, rs in failures.values() for x in rs])
    ts = spec.tune
    where = f"LR in {sorted(ts.lr_values)}" if ts.lr_values else f"LR in [{ts.lr_min:g}, {ts.lr_max:g}]"
    parts = []
    for (s, r), (_, reasons) in failures.items():
        # a trial ASHA stopped early (Optuna PRUNED) neither diverged nor failed to learn: counted apart
        bad = [x for x in reasons if x != "pruned"]
        pruned = len(reasons) - len(bad)
        if not bad:
            parts.append(f"size {s}, r {r}: all {len(reasons)} trials at {where} were stopped early by ASHA (pruned)")
            continue
        top, k = Counter(bad).most_common(1)[0]
        if pruned:
            parts.append(f"size {s}, r {r}: no trial of {len(reasons)} learned at {where}: {len(bad)} diverged or "
                         f"did not learn ({k} of {len(bad)}: {top}) and {pruned} {'was' if pruned == 1 else 'were'} "
                         "stopped early by ASHA (pruned)")  # fmt: skip
        else:
            parts.append(f"size {s}, r {r}: all {len(reasons)} trials diverged or did not learn at {where} "
                         f"({k} of {len(reasons)}: {top})")  # fmt: skip
    err = NoRunFinished(
        "; ".join(parts) + "; no LR was chosen and lr_table.parquet was not written. Next: move the LR range "
        "(tune.lr_min / tune.lr_max or tune.lr_values: lower where the trials diverged or collapsed to a flat "
        "loss at a high LR, higher where the loss fell too slowly) and run again with another --out folder (this "
        "one records this spec; its trials stay in tune_lr/optuna.db"
        + (f"; loss by LR: {', '.join(str(p) for p in plotted)}" if plotted else "")
        + ")"
    )
    err.resumable = False  # the finished studies are kept: --resume would choose from the same trials again
    return err


def study_seed(seed: int, study_name: str) -> int:
    """The TPE sampler seed of one study: derived from ``tune.seed`` and the study's name, so that every study
    (size, r) draws its own LRs (one seed for all would try the same LRs at every size) and a rerun of the
    spec draws the same ones. An integer in [0, 2^32)."""
    digest = hashlib.sha256(f"{int(seed)}:{study_name}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _choose(study) -> tuple[float | None, float | None, int, int]:
    import optuna

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
    if not complete:
        return None, None, len(trials), pruned
    best = min(complete, key=lambda t: (t.value, t.params["lr"]))
    return float(best.params["lr"]), float(best.value), len(trials), pruned


EDGE_HEAD = "best LR at the edge of the LRs tried (the best may lie beyond them)"
"""How `tune-lr` opens its line on studies whose chosen LR is the highest or lowest tried (console and the LR
table's ``notes``)."""


def edge_of_tried(study, lr: float | None) -> str | None:
    """'highest' / 'lowest' when ``lr`` (the chosen LR) is the largest / smallest LR among the study's finished
    trials (complete, pruned, or failed as unhealthy: diverged or did not learn; at least 3 distinct LRs), else
    None: the best LR may then lie beyond the LRs tried, and a wider range or more samples would tell. An
    unhealthy trial at a larger LR bounds the chosen one from above (and one at a smaller LR from below), so it
    takes part; a trial that raised says nothing of its LR and does not."""
    import optuna

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    tried = sorted(
        {
            float(t.params["lr"])
            for t in study.get_trials(deepcopy=False)
            if t.state in done
            or (t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("fail_kind") == "unhealthy")
        }
    )
    if lr is None or len(tried) < 3:
        return None
    return "highest" if lr >= tried[-1] else ("lowest" if lr <= tried[0] else None)


def edge_advice(edge: str, lr: float, tune) -> str:
    """What would tell whether the best LR lies beyond the ``edge`` ('highest' / 'lowest') of the LRs tried, given
    the spec's ``tune`` section: extend ``lr_values``, widen ``lr_min`` / ``lr_max`` when ``lr`` is within a factor
    1.5 of that bound, else sample more (``num_samples``: the range goes further than the LRs tried)."""
    if tune.lr_values:
        return f"add {'larger' if edge == 'highest' else 'smaller'} values to tune.lr_values"
    key, bound = ("lr_max", tune.lr_max) if edge == "highest" else ("lr_min", tune.lr_min)
    near = lr >= bound / 1.5 if edge == "highest" else lr <= bound * 1.5
    return f"widen tune.{key} ({bound:g})" if near else f"raise tune.num_samples (tune.{key} is {bound:g})"


def run_tune_lr(
    spec,
    out_dir: str | Path,
    *,
    resume: bool = False,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    ray_temp_dir: str | None = None,
    plot: bool = True,
    track: tuple | list = (),
    quiet: bool = False,
    note_fresh_resume: bool = True,
):
    """Run stage 1 for ``spec`` into ``out_dir`` and return the LR table (a pyarrow Table, also written to
    ``<out_dir>/lr_table.parquet``; the studies are in ``<out_dir>/tune_lr/optuna.db``).

    One study per size and r (``tune.tune_per_r``; otherwise per size at the largest r, its LR used for
    every r). ``lr`` is ``lr_smoothed`` when ``tune.smooth`` else ``lr_best``; both are in the table.
    Studies already finished in ``out_dir`` are not rerun; ``resume`` restores an interrupted study's
    Tune experiment (or, when Tune's saved state of it is torn or mixed, goes on in a new one; the LRs of trials Tune
    cannot restore, their saved state naming a deleted checkpoint, go on in a fresh ``<experiment>_again``). ``track``: ``--track`` values or parsed targets (:mod:`loopscale.sweep.tracking`). Progress
    (trials done/pruned/failed, best LR so far) is shown on the console (:class:`loopscale.sweep.console.LRView`)
    unless ``quiet``, which turns off that display only (as :func:`loopscale.sweep.run_sweep`'s ``quiet``).
    ``resume`` where no LR tuning ran says so on the console unless ``note_fresh_resume`` is False (``run``, which
    has said it of the whole folder).

    Raises:
        SpecError: bad spec or runtime (GPUs requested where none exist), before Ray starts.
        ValueError: a bad ``--track`` value or its package missing, before Ray starts.
        TuneInterrupted: the driver was stopped (SIGINT) mid-study.
        NoRunFinished: a study has no healthy complete trial (every trial raised, diverged or did not learn,
            :func:`unhealthy_reason`); the message names the LR range and the most common reason, and no LR
            table is written.
    """
    import optuna

    from loopscale.cluster.connect import ray_session
    from loopscale.cluster.storage import absolute_uri, read_json_or_aside, write_text_atomic
    from loopscale.sweep import console, tracking
    from loopscale.sweep.spec import check_folder_spec, high_tune_range_warning, load_spec, record_folder_spec
    from loopscale.sweep.status import mark_started
    from loopscale.sweep.store import to_table, write_table_atomic

    if isinstance(spec, str | Path):
        spec = load_spec(spec)
    spec.check_runtime(address, num_cpus, num_gpus, models="single")  # a tuning trial trains one model
    if spec.lr != "tune":
        spec.cells()  # its LR table (lr: {table: ...}) is checked as `sweep` checks it, before Ray starts
    track = tracking.parse_track(track)
    out = Path(out_dir).resolve()
    check_folder_spec(out, spec)
    check_tune_samples(spec, out)
    tune_dir = out / "tune_lr"
    if resume and note_fresh_resume and not (tune_dir.is_dir() and any(tune_dir.iterdir())):  # as `sweep` says
        console.current().say(f"--resume: nothing to resume in {out} (no earlier LR tuning there); starting a new "
                              "one", err=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    # `sweep` and `run` of another spec will not read this folder's LR table (recorded before tune_lr/ is made: a
    # folder of a design's prediction alone may take this spec with another candidate's seeds)
    record_folder_spec(out, spec)
    tune_dir.mkdir(parents=True, exist_ok=True)
    # `loopscale status`: running from here on, before Ray starts; a --storage is recorded (and claimed)
    mark_started(out, "tune-lr", storage=absolute_uri(spec.storage_path) if spec.storage_path else None)
    if spec.lr != "tune":  # tuning still answers "which LR?", but nothing downstream will read this table
        n_studies, n_trials = len(study_keys(spec)), trials_per_study(spec.tune)
        console.current().say(
            f"note: the spec fixes the LR (lr: {', '.join(f'{k}: {v}' for k, v in spec.lr.items())}); "
            "`loopscale sweep` and `run` of it will not use this LR table (for a sweep that does: `lr: tune` in "
            f"the spec, and another --out folder); this tunes {n_studies} stud{'y' if n_studies == 1 else 'ies'} of "
            f"{n_trials} trials each for reference (its `tune` section), Ctrl-C to stop",
            err=True,
        )
    storage_path = absolute_uri(spec.storage_path) if spec.storage_path else str(tune_dir / "ray")
    todo = study_keys(spec)
    rows = []
    done_info = {(s, r): read_json_or_aside(str(done_marker(out, s, r))) for s, r in todo}
    pending = [(s, r) for s, r in todo if done_info[(s, r)] is None]
    failures: dict = {}
    failed_info: dict = {}
    n_failed_trials = 0
    if pending:
        from loopscale.sweep.run import lr_cost_left_warning

        if costly := lr_cost_left_warning(spec, out):  # the dry run's lr_warning, said before the tuning starts
            console.current().say(f"warning: {costly}", err=True)
        if too_high := high_tune_range_warning(spec):  # the dry run's lr_value_warning, before any trial trains
            console.current().say(f"warning: {too_high}", err=True)
        if early := early_rung_warning(spec):  # the dry run's lr_rung_warning
            console.current().say(f"warning: {early}", err=True)
        optuna_storage(f"sqlite:///{(tune_dir / 'optuna.db').resolve()}")  # create the schema once, up front
        names = {study_name(spec.name, s, r): (s, r) for s, r in pending}
        before = finished_trials(f"sqlite:///{(tune_dir / 'optuna.db').resolve()}", names)
        if not quiet:  # the studies' progress display (as run_sweep's quiet, it turns off that display only)
            console.start_view(console.LRView(console.current(), names, trials_per_study(spec.tune), before))
        # ending_view first: a Ray that fails to start must not leave the LR display open
        with console.ending_view(), ray_session(address, num_cpus=num_cpus, num_gpus=num_gpus,
                                                temp_dir=ray_temp_dir) as ray_info:
            from loopscale.cluster.connect import session_notes

            for line in session_notes(ray_info, address, storage_path, float(spec.resources.cpus),
                                      float(spec.resources.gpus or 0)):  # fmt: skip
                console.current().say(line, err=True)
            for s, r in pending:
                plan = _run_study(spec, s, r, tune_dir, storage_path, resume, track)
                info = {
                    k: plan[k] for k in ("study_name", "storage_url", "budget_tokens", "N_unique", "N_usage")
                }
                study = optuna.load_study(study_name=info["study_name"], storage=info["storage_url"])
                failure = _study_failure(study)
                if failure is not None:  # no done marker: the study is never read as finished
                    failures[(s, r)] = failure
                    failed_info[(s, r)] = info
                    n_failed_trials += len(failure[1])
                    continue
                marker = done_marker(out, s, r)
                marker.parent.mkdir(exist_ok=True)
                write_text_atomic(str(marker), json.dumps(info))
                done_info[(s, r)] = info
    if failures:
        plotted = []
        if plot:  # what the trials did at each LR, to choose the next range from
            seen = [
                {"size": s, "r": r, **i} for (s, r), i in {**done_info, **failed_info}.items() if i is not None
            ]
            plotted = _plot(tune_dir, seen[0]["storage_url"], seen)
        raise _no_healthy_trial(spec, failures, len(todo), n_failed_trials, plotted)
    at_edge, rejected = [], []
    for s, r in todo:
        info = done_info[(s, r)]
        study = optuna.load_study(study_name=info["study_name"], storage=info["storage_url"])
        lr, val, n, npruned = _choose(study)
        notes = []  # recorded with the study's rows: the report and `status` say them too
        if note := rejected_note(s, r, study, spec.tune):
            rejected.append(note)
            notes.append(note)
        if edge := edge_of_tried(study, lr):
            at_edge.append(f"size {s}, r {r}: {lr:.3g}, the {edge} of {n} tried: {edge_advice(edge, lr, spec.tune)}")
            notes.append(f"{EDGE_HEAD}: {at_edge[-1]}")
        targets = [r] if spec.tune.tune_per_r else sorted(spec.r)
        for rr in targets:
            rows.append(
                dict(
                    size=s,
                    r=rr,
                    tuned_r=r,
                    N_unique=info["N_unique"],
                    N_usage=info["N_usage"],
                    lr_best=lr,
                    best_val_loss=val,
                    lr_smoothed=None,
                    lr=None,
                    n_trials=n,
                    n_pruned=npruned,
                    budget_tokens=info["budget_tokens"],
                    study_name=info["study_name"],
                    storage=info["storage_url"],
                    notes=json.dumps(notes),
                )
            )
    if rejected:  # never chosen, whatever their loss (unhealthy_reason): say which and why
        console.current().say("tune-lr: " + " | ".join(rejected), err=True)
    if at_edge:  # the advice changes the spec, and a folder keeps one spec: its studies are run in a new one
        console.current().say(
            f"tune-lr: {EDGE_HEAD}: " + "; ".join(at_edge) + f" (a changed spec tunes in a new --out folder: {out} "
            "keeps this spec)",
            err=True,
        )
    _smooth(rows)
    for row in rows:
        row["lr"] = row["lr_smoothed"] if spec.tune.smooth else row["lr_best"]
    table = to_table(rows, _lr_table_schema())
    write_table_atomic(table, out / "lr_table.parquet")
    if plot:
        _plot(tune_dir, rows[0]["storage"], rows)
    return table
