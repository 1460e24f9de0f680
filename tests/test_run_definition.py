"""One run definition: the fields declared run-defining on RunConfig are exactly what the sweep's run id and the
trainer's checkpoint key depend on, and a spec's training section can set every field it declares."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from loopscale.model.config import preset_config
from loopscale.model.train import (
    CheckpointError,
    RunConfig,
    checkpoint_key,
    run_defining_fields,
    train_run,
)
from loopscale.sweep.presets import PRESETS, preset_spec
from loopscale.sweep.spec import Cell, parse_spec

# one different, valid value for every RunConfig field
CHANGED = {
    "model": preset_config("cpu", r=2, d_model=48),
    "corpus": "other.txt",
    "text_column": "body",
    "tokenizer": "pretokenized",
    "tokens": 8192,
    "target_flops": None,  # with "tokens" the horizon is switched instead: see _changed
    "batch_tokens": 1024,
    "micro_batch_tokens": 256,
    "optimizer": "muon",
    "orthogonalization": "polar_express",
    "lr": 0.02,
    "lr_data_factor": 0.5,
    "schedule": "wsd",
    "warmup_frac": 0.1,
    "final_lr_frac": 0.0,
    "decay_frac": 0.5,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 7,
    "data_seed": 3,
    "eval_tokens": 1024,
    "eval_every_steps": 3,
    "checkpoint_dir": "/tmp/somewhere",
    "checkpoint_every_steps": 5,
    "num_threads": 2,
    "device": "auto",
    "precision": "bf16",
    "compile": True,
    "diverge_loss": 10.0,
    "cache_dir": "/tmp/cache",
}


def _base_cell() -> Cell:
    return preset_spec("smoke").cells()[0]


def _changed(run: RunConfig, name: str) -> RunConfig:
    if name == "target_flops":
        return dataclasses.replace(run, tokens=None, target_flops=1e12)
    return dataclasses.replace(run, **{name: CHANGED[name]})


def test_every_field_is_classified():
    """The table above covers every RunConfig field, so a new field cannot escape the key test."""
    assert set(CHANGED) == {f.name for f in dataclasses.fields(RunConfig)}


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RunConfig)])
def test_run_defining_fields_change_both_keys_and_others_neither(name):
    """Changing a run-defining field changes the run id and the checkpoint key; any other field changes neither."""
    cell = _base_cell()
    if name in ("orthogonalization", "lr_data_factor"):  # Muon family only (AdamW with either is refused)
        cell = dataclasses.replace(cell, run=dataclasses.replace(cell.run, optimizer="muon"))
    other = dataclasses.replace(cell, run=_changed(cell.run, name))
    id_changed = other.run_id != cell.run_id
    key_changed = checkpoint_key(other.run, 4096, "h") != checkpoint_key(cell.run, 4096, "h")
    defining = name in run_defining_fields()
    assert id_changed == defining, f"{name}: run id changed={id_changed}, defines the run={defining}"
    assert key_changed == defining, (
        f"{name}: checkpoint key changed={key_changed}, defines the run={defining}"
    )


def test_decay_and_eval_tokens_define_the_run():
    """The two fields the old hand-written key lists disagreed on."""
    assert {"decay_frac", "eval_tokens", "model", "lr", "seed"} <= set(run_defining_fields())
    assert not {"num_threads", "device", "checkpoint_dir", "eval_every_steps"} & set(run_defining_fields())


def test_spec_training_section_overrides_the_run_config():
    """Every key of the training section reaches the cell's RunConfig (decay_frac with schedule wsd included);
    the defaults are RunConfig's own."""
    d = copy.deepcopy(PRESETS["smoke"])
    d["training"].update(schedule="wsd", decay_frac=0.4, eval_tokens=4096)
    run = parse_spec(d).cells()[0].run
    assert (run.schedule, run.decay_frac, run.eval_tokens) == ("wsd", 0.4, 4096)
    assert parse_spec(d).cells()[0].run_id != _base_cell().run_id
    defaults = RunConfig(model=run.model, tokens=2048)
    plain = parse_spec({**copy.deepcopy(PRESETS["smoke"]), "training": {}}).training
    for k, v in plain.model_dump().items():
        assert v == getattr(defaults, k), k


def test_spec_training_errors_name_the_key():
    d = copy.deepcopy(PRESETS["smoke"])
    d["training"]["decay_frac"] = 0
    with pytest.raises(ValueError, match="training.decay_frac"):
        parse_spec(d)
    d = copy.deepcopy(PRESETS["smoke"])
    d["training"]["batch_tokens"] = 100
    with pytest.raises(ValueError, match="training: .*batch_tokens must be a positive multiple"):
        parse_spec(d)


def test_a_wsd_decay_that_starts_inside_its_warmup_is_refused():
    """wsd with warmup_frac + decay_frac > 1 trained in silence: the LR warmed up to the peak and then dropped at
    once to where the decay had got to (0.5 / 0.8 over 10 steps: ... 0.8, 1.0, 0.662, ...). Refused by the trainer
    and by a spec's check, naming both keys; a sum of exactly 1 (no constant phase) is a schedule."""
    from loopscale.model.optim import lr_multiplier

    m = [lr_multiplier(s, 10, "wsd", 0.5, 0.1, 0.5) for s in range(10)]
    assert m[:6] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0] and all(a > b for a, b in zip(m[5:], m[6:], strict=False))
    run = dataclasses.replace(_base_cell().run_config(), schedule="wsd", warmup_frac=0.5)
    dataclasses.replace(run, decay_frac=0.5)  # warmup, then the decay: no constant phase
    with pytest.raises(ValueError, match=r"warmup_frac \+ decay_frac must be <= 1; got 0.5 \+ 0.8"):
        dataclasses.replace(run, decay_frac=0.8)
    dataclasses.replace(run, decay_frac=0.8, schedule="linear")  # decay_frac is wsd's alone
    d = copy.deepcopy(PRESETS["smoke"])
    d["training"].update(schedule="wsd", warmup_frac=0.5, decay_frac=0.8)
    with pytest.raises(ValueError, match=r"training: .*warmup_frac \+ decay_frac must be <= 1"):
        parse_spec(d)


def test_resuming_with_other_eval_tokens_is_refused(trainer_corpus_dir, trainer_cache_dir, tmp_path):
    """A checkpoint of a run with another held-out set size is not resumed as if it were the same run."""
    base = dict(
        model=preset_config("cpu", r=2, d_model=32, seq_len=32),
        corpus=str(trainer_corpus_dir),
        cache_dir=str(trainer_cache_dir),
        batch_tokens=128,
        tokens=2 * 128,
        eval_tokens=256,
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_every_steps=1,
    )
    train_run(RunConfig(**base))
    with pytest.raises(CheckpointError, match="eval_tokens"):
        train_run(RunConfig(**{**base, "eval_tokens": 512}))


def test_a_checkpoint_of_another_run_names_a_field_left_at_its_default():
    """Fields added later are absent from a key at their default: a checkpoint written with Polar Express and a
    data factor, resumed by a run at the defaults, was refused as 'differs in []'."""
    from loopscale.model.train import key_differences

    cell = _base_cell()
    muon = dataclasses.replace(cell.run, optimizer="muon")
    saved = checkpoint_key(dataclasses.replace(muon, orthogonalization="polar_express", lr_data_factor=0.5), 64, "h")
    now = checkpoint_key(muon, 64, "h")
    assert saved != now
    assert key_differences(saved, now) == ["lr_data_factor", "orthogonalization"]
    assert key_differences(now, saved) == ["lr_data_factor", "orthogonalization"]
