"""`loopscale run --dry-run` states the corpus size and warns when the runs would repeat the data (sweep/run.py).

Before, the ``paper`` preset's dry-run printed ``tokens_total: 285039394816`` with no word about the embedded corpus
(~16 M training tokens), although every run would pass over it hundreds of times; only the trainer warned, at train
time (:func:`loopscale.model.data.implied_epochs`).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from loopscale.model import data as data_mod
from loopscale.model.data import WindowSampler, load_tokens, resolve_corpus
from loopscale.model.train import resolve_tokens
from loopscale.sweep.cli import app
from loopscale.sweep.presets import preset_spec
from loopscale.sweep.spec import spec_to_yaml


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A token cache with nothing tokenized in it (the trainer's default cache dir follows $LOOPSCALE_CACHE)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LOOPSCALE_CACHE", str(cache))
    return cache


def _dry_run(tmp_path, *args: str) -> dict:
    res = CliRunner().invoke(app, ["run", *args, "--dry-run", "--json", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _max_d(spec) -> int:
    lr = {(s, None): 1.0 for s in spec.all_sizes()} if spec.lr == "tune" else None
    return max(resolve_tokens(c.run) for c in spec.cells(lr_table=lr))


def _embedded_train_bytes() -> int:
    man = resolve_corpus("embedded").manifest
    return sum(d["bytes"] + 1 for d in man["documents"] if d["split"] == "train")


def test_paper_dry_run_warns_that_the_embedded_corpus_repeats(tmp_path, empty_cache):
    p = _dry_run(tmp_path, "--preset", "paper")
    d_max = _max_d(preset_spec("paper"))
    assert p["tokens_max_run"] == d_max and d_max > 1e9
    # BPE 32000 is not trained yet: no exact count, but the bytes bound it (a BPE token covers >= 1 byte)
    assert p["corpus_train_tokens"] == "unknown until tokenized"
    assert f"at most {_embedded_train_bytes()}" in p["corpus_tokens_from"]
    assert p["epochs_max_run"] > 100  # at least: the corpus holds at most ~16 M training tokens
    w = p["data_warning"]
    assert w and w.startswith("116 of 116 runs would repeat the training data")
    assert f"D = {d_max} training tokens exceeds the at most" in w and "epochs (data repeats)" in w
    assert "at least" in w
    assert not (tmp_path / "out").exists()  # still nothing run, nothing written to --out
    text = CliRunner().invoke(app, ["run", "--preset", "paper", "--dry-run", "--out", str(tmp_path / "out")])
    assert text.exit_code == 0, text.output
    assert "corpus_train_tokens: unknown until tokenized" in text.output
    assert "data_warning: 116 of 116 runs would repeat" in text.output


def test_smoke_dry_run_fits_in_the_corpus(tmp_path, empty_cache):
    """The smoke runs (D <= 4096) fit in the embedded corpus many times over: sizes stated, no warning."""
    p = _dry_run(tmp_path, "--preset", "smoke")
    assert p["corpus_train_tokens"] == _embedded_train_bytes()  # byte tokens: exact without tokenizing
    assert p["tokens_max_run"] == 4096 and p["epochs_max_run"] < 1e-3
    assert p["data_warning"] is None


def _small_corpus_spec(tmp_path, corpus) -> str:
    spec = preset_spec("smoke").model_copy(update={"corpus": str(corpus)})
    path = tmp_path / "small.yaml"
    path.write_text(spec_to_yaml(spec))
    return str(path)


def test_text_corpus_is_unknown_until_tokenized_then_matches_the_trainer(tmp_path, empty_cache, monkeypatch):
    rng = np.random.default_rng(0)
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(["ab", "cd", "efg"], 12)) for _ in range(100)))
    spec = _small_corpus_spec(tmp_path, corpus)
    with monkeypatch.context() as m:  # a corpus too large for the pre-flight to tokenize
        m.setattr(data_mod, "TOKENIZE_TO_CHECK_BYTES", corpus.stat().st_size - 1)
        p = _dry_run(tmp_path, spec)
    assert p["corpus_train_tokens"] == "unknown until tokenized"
    assert p["epochs_max_run"] is None and p["data_warning"] is None
    assert not (empty_cache / "tokens").exists()
    # once tokenized (as the first run would), the cache gives the exact count and the trainer's own epochs
    data = load_tokens(str(corpus), "byte", cache_dir=empty_cache)
    p = _dry_run(tmp_path, spec)
    n = int(data.meta["n_train_tokens"])
    assert p["corpus_train_tokens"] == n and "token cache" in p["corpus_tokens_from"]
    per_epoch = WindowSampler(data.train, 32, 1, 0).tokens_per_epoch
    assert p["epochs_max_run"] == pytest.approx(4096 / per_epoch)
    assert p["epochs_max_run"] > 1
    w = p["data_warning"]
    assert f"D = 4096 training tokens exceeds the {per_epoch} available (one epoch: the training split's whole " in w
    assert "at least" not in w and per_epoch < n  # the split's few tokens past its last whole window are not trained on
    assert w.startswith("8 of 16 runs")  # the D = 4096 half of the grid; D = 2048 fits in one pass


def test_token_file_is_counted_without_reading_the_text(tmp_path, empty_cache):
    tokens = tmp_path / "toks.npy"
    np.save(tokens, (np.arange(100_000) % 200).astype(np.uint16))
    spec = preset_spec("smoke").model_copy(update={"corpus": str(tokens), "tokenizer": "pretokenized"})
    path = tmp_path / "toks.yaml"
    path.write_text(spec_to_yaml(spec))
    p = _dry_run(tmp_path, str(path))
    assert p["corpus_train_tokens"] == 100_000 - 5_000  # the last 5 % is validation, as load_tokens splits it
    assert p["data_warning"] is None


def test_lr_trials_that_would_repeat_the_corpus_are_warned_of(tmp_path, empty_cache):
    """The grid's runs fit in a 95,000-token split but LR trials of 200,000 tokens would not: the dry-run warned of
    the grid's runs only (data_warning None), so the LR was chosen by trials that repeat the data, unsaid."""
    tokens = tmp_path / "toks.npy"
    np.save(tokens, (np.arange(100_000) % 200).astype(np.uint16))
    spec = preset_spec("smoke")
    tune = spec.tune.model_copy(update={"tokens": 200_000, "tokens_per_param": None})
    spec = spec.model_copy(update={"corpus": str(tokens), "tokenizer": "pretokenized", "lr": "tune", "tune": tune})
    path = tmp_path / "toks.yaml"
    path.write_text(spec_to_yaml(spec))
    p = _dry_run(tmp_path, str(path))
    per_epoch = ((95_000 - 1) // 32) * 32  # whole windows of seq_len 32
    assert p["epochs_max_run"] < 1
    trial = max(p["lr_trial_tokens"].values())
    assert trial >= 200_000 and p["epochs_max_lr_trial"] == pytest.approx(trial / per_epoch)
    n = p["lr_studies"]
    assert p["data_warning"].startswith(f"{n} of {n} LR studies' trials would repeat the training data")
    assert p["data_warning"].endswith(f"{trial} tokens, {trial / per_epoch:.2f} epochs); lower tune.tokens, or give "
                                      "a larger corpus")
    # few tokens asked, but one whole step per milestone: the rounding repeats the data, and the advice says so
    tune = spec.tune.model_copy(update={"tokens": 256, "num_milestones": 4096})
    path.write_text(spec_to_yaml(spec.model_copy(update={"tune": tune})))
    p = _dry_run(tmp_path, str(path))
    assert p["epochs_max_lr_trial"] > 1 and "lower tune.num_milestones (or training.batch_tokens)" in p["data_warning"]
    fixed = _dry_run(tmp_path, "--preset", "smoke")  # no LR tuning: nothing to say of LR trials
    assert fixed["epochs_max_lr_trial"] is None and fixed["data_warning"] is None


def test_small_text_corpus_is_tokenized_by_the_dry_run_and_the_runs_reuse_it(tmp_path, empty_cache):
    """A text corpus of at most TOKENIZE_TO_CHECK_BYTES is tokenized by the pre-flight: the dry-run's counts are
    exact at once, and the cache it built is the one the runs load (not built again)."""
    rng = np.random.default_rng(0)
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(["ab", "cd", "efg"], 12)) for _ in range(100)))
    p = _dry_run(tmp_path, _small_corpus_spec(tmp_path, corpus))
    data = load_tokens(str(corpus), "byte", cache_dir=empty_cache)
    assert not data.built
    assert p["corpus_train_tokens"] == len(data.train) == 3810


def _tiny_corpus(tmp_path, name: str) -> tuple:
    """(corpus file, tokenizer) of the corpora every run would fail on, as a new user met them."""
    f = tmp_path / f"{name}.txt"
    words = " ".join(["the", "cat", "sat", "on", "a", "mat", "dog", "ran"] * 80)
    tok = "byte"
    if name == "zero_bytes":
        f.write_bytes(b"")
    elif name == "whitespace":
        f.write_text("   \n\n\t  \n")
    elif name == "short_val":
        f.write_text(words[:600])
    else:  # bpe_small
        f.write_text(words[:569])
        tok = "bpe:512"
    return f, tok


@pytest.mark.parametrize(
    "name, message",
    [
        ("zero_bytes", "holds no text: its file is empty or only whitespace (and NUL bytes)"),
        ("whitespace", "holds no text: its file is empty or only whitespace (and NUL bytes)"),
        ("short_val", "the validation token stream (30 tokens) is shorter than one window: seq_len=32 needs at least seq_len + 1 = 33"),
        ("bpe_small", "need at least 1024 bytes of training text"),
    ],
)
def test_corpus_every_run_would_fail_on_is_refused_before_ray(tmp_path, empty_cache, name, message):
    """An empty or whitespace-only file, a file too small for one validation window, too little text for BPE: each
    failed every Ray trial (retried: minutes lost) and is now refused by check_data, with the runs' own message,
    before Ray starts and by --dry-run (exit 2, nothing written to --out)."""
    from loopscale.sweep.spec import SpecError

    corpus, tok = _tiny_corpus(tmp_path, name)
    spec = preset_spec("smoke").model_copy(update={"corpus": str(corpus), "tokenizer": tok})
    with pytest.raises(SpecError, match=re.escape(message)):
        spec.check_data()
    path = tmp_path / "tiny.yaml"
    path.write_text(spec_to_yaml(spec))
    for extra in (["--dry-run"], []):
        res = CliRunner().invoke(app, ["run", str(path), *extra, "--out", str(tmp_path / "out")])
        assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_token_file_shorter_than_a_validation_window_is_refused(tmp_path, empty_cache):
    """A token file's split is known from its length: 400 tokens leave 20 for validation, less than seq_len + 1."""
    from loopscale.sweep.spec import SpecError

    f = tmp_path / "t.u16.bin"
    (np.arange(400) % 200).astype(np.uint16).tofile(f)
    spec = preset_spec("smoke").model_copy(update={"corpus": str(f), "tokenizer": "pretokenized"})
    with pytest.raises(SpecError, match=re.escape("validation token stream (20 tokens)")):
        spec.check_data()
    (np.arange(1000) % 200).astype(np.uint16).tofile(f)  # 50 validation tokens: one window of 33 fits
    assert spec.check_data(warn=False) == [
        "eval_tokens=2048 is more than the validation split holds (50 tokens): 32 tokens (1 window of seq_len=32) "
        "are evaluated (give a larger corpus for a steadier loss)",
        # before Ray too (it came only from each trial as it started): the dry run's data_warning
        "16 of 16 runs would repeat the training data (more than one epoch); the run that repeats it most: D = 4096 "
        "training tokens exceeds the 928 available (one epoch: the training split's whole windows of seq_len): 4.41 "
        "epochs (data repeats)",
    ]
    # tune-lr trains no run of the grid: its trials' repeats alone (the smoke spec fixes its LR: none)
    assert spec.check_data(warn=False, grid=False) == spec.check_data(warn=False)[:1]


def test_eval_tokens_beyond_the_validation_split_is_said(tmp_path, empty_cache):
    """A 3 KB text file has 150 validation tokens; eval_tokens 2048 at seq_len 32 evaluates 4 windows = 128 tokens.
    That was silent; now the dry-run (and check_data before Ray) and every run say how many tokens are evaluated."""
    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, train_run

    corpus = tmp_path / "three_kb.txt"
    corpus.write_text(("the cat sat on a mat " * 200)[:3000])
    p = _dry_run(tmp_path, _small_corpus_spec(tmp_path, corpus))
    note = "eval_tokens=2048 is more than the validation split holds (150 tokens): 128 tokens (4 windows of seq_len=32)"
    assert p["eval_warning"].startswith(note)
    spec = preset_spec("smoke").model_copy(update={"corpus": str(corpus)})
    with pytest.warns(UserWarning, match=re.escape(note)):
        assert spec.check_data() == [p["eval_warning"], p["data_warning"]]  # the data repeat said before Ray too
    assert p["data_warning"].startswith("8 of 16 runs would repeat the training data")
    cfg = RunConfig(
        model=preset_config("cpu", r=1, d_model=16, seq_len=32),
        corpus=str(corpus),
        tokens=256,
        batch_tokens=256,
        eval_tokens=2048,
    )
    with pytest.warns(UserWarning, match=re.escape(note)):
        res = train_run(cfg)
    assert res.eval_tokens == 128 and any(w.startswith(note) for w in res.warnings)
    # eval_tokens that fit: no eval warning anywhere (the data repeat stays)
    fits = spec.model_copy(update={"training": spec.training.model_copy(update={"eval_tokens": 128})})
    assert fits.check_data() == [p["data_warning"]]
    assert _dry_run(tmp_path, "--preset", "smoke")["eval_warning"] is None


def test_directory_corpus_skipped_files_are_in_the_plan_and_every_run(tmp_path, empty_cache):
    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, train_run

    d = tmp_path / "docs"
    d.mkdir()
    for name in ("a.txt", "b.rst"):
        (d / name).write_text("the cat sat on a mat " * 300)
    note = f"ignored 1 file (.rst) in {d}: a directory corpus reads .txt/.md/.text (or .parquet)"
    p = _dry_run(tmp_path, _small_corpus_spec(tmp_path, d))
    assert p["corpus_warning"].startswith(note)
    spec = preset_spec("smoke").model_copy(update={"corpus": str(d)})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"eval_tokens": 256})})
    with pytest.warns(UserWarning, match=re.escape(note)):
        assert spec.check_data() == [p["corpus_warning"]]
    cfg = RunConfig(model=preset_config("cpu", r=1, d_model=16, seq_len=32), corpus=str(d), tokens=256,
                    batch_tokens=256, eval_tokens=32)  # fmt: skip
    with pytest.warns(UserWarning, match=re.escape(note)):
        res = train_run(cfg)
    assert [w for w in res.warnings if w.startswith("ignored")] == [p["corpus_warning"]]
    assert _dry_run(tmp_path, "--preset", "smoke")["corpus_warning"] is None


def test_a_token_file_without_dtype_suffix_is_said_by_the_plan_and_every_run(tmp_path, empty_cache):
    """A plain .bin is read as uint16 with a warning. The runs said it, the dry-run did not (corpus_warning None):
    now the plan and the pre-flight say it too, with the same words as the runs."""
    ids = np.random.default_rng(0).integers(0, 200, 100_000).astype(np.uint16)
    corpus = tmp_path / "tokens.bin"
    ids.tofile(corpus)
    spec = preset_spec("smoke").model_copy(update={"corpus": str(corpus), "tokenizer": "pretokenized"})
    path = tmp_path / "bin.yaml"
    path.write_text(spec_to_yaml(spec))
    p = _dry_run(tmp_path, str(path))
    note = f"token file {str(corpus)!r} has no dtype suffix: read as uint16 (100000 tokens)"
    assert p["corpus_warning"] and p["corpus_warning"].startswith(note)
    with pytest.warns(UserWarning, match=re.escape(note)):
        assert spec.check_data() == [p["corpus_warning"]]
    with pytest.warns(UserWarning, match=re.escape(note)):
        td = load_tokens(str(corpus), "pretokenized")
    assert len(td.train) + len(td.val) == 100_000
    ids.tofile(tmp_path / "tokens.u16.bin")  # the dtype stated: nothing to say
    named = spec.model_copy(update={"corpus": str(tmp_path / "tokens.u16.bin")})
    assert named.check_data() == []


def test_an_empty_token_or_text_file_is_named_in_its_error(tmp_path, empty_cache):
    """`loopscale train --corpus empty.u16.bin` said 'cannot mmap an empty file' and an empty .txt 'corpus contains
    no text ...', neither naming the file (a spec's error names its corpus; `train --corpus` did not)."""
    from loopscale.model.data import CorpusError, load_tokens

    empty = tmp_path / "empty.u16.bin"
    empty.write_bytes(b"")
    with pytest.raises(CorpusError, match=re.escape(f"token file {str(empty)!r} is empty (0 bytes)")):
        load_tokens(str(empty), "pretokenized")
    # an empty .npy said "the training token stream (-1 tokens) is shorter than one window"
    import numpy as np

    from loopscale.model.data import check_corpus

    npy = tmp_path / "empty.npy"
    np.save(npy, np.zeros(0, np.uint16))
    for check in (lambda: load_tokens(str(npy), "pretokenized"), lambda: check_corpus(str(npy), "pretokenized", 256,
                                                                                          seq_len=32)):  # fmt: skip
        with pytest.raises(CorpusError, match=re.escape(f"token file {str(npy)!r} is an empty array (0 tokens): it "
                                                        "holds no token ids")):  # fmt: skip
            check()
    text = tmp_path / "empty.txt"
    text.write_text("  \n")
    with pytest.raises(CorpusError, match=re.escape("corpus contains no text (every document is empty after "
                                                    "cleaning: only whitespace, NUL bytes or empty strings); give a "
                                                    f"corpus that holds text, or 'embedded' for the built-in corpus: "
                                                    f"{str(text)!r}")):  # fmt: skip
        load_tokens(str(text), "byte")


def test_a_text_column_for_a_corpus_without_columns_is_refused(tmp_path, empty_cache):
    """`text_column: body` with a .txt corpus was accepted in silence: it read the same text and only changed the
    corpus's hash (so the token cache and the folder's corpus check took it for another text)."""
    from loopscale.model.data import CorpusError, resolve_corpus
    from loopscale.sweep.spec import SpecError

    f = tmp_path / "a.txt"
    f.write_text("the cat sat on the mat. " * 400)
    assert resolve_corpus(str(f)).kind == "text"
    want = f"text_column 'body' names the column of a Parquet corpus; {str(f)!r} is a text corpus"
    with pytest.raises(CorpusError, match=re.escape(want)):
        resolve_corpus(str(f), "body")
    with pytest.raises(CorpusError, match="'embedded' is the embedded corpus, which has no columns"):
        resolve_corpus("embedded", "body")
    spec = preset_spec("smoke").model_copy(update={"corpus": str(f), "text_column": "body"})
    with pytest.raises(SpecError, match=re.escape(want)):
        spec.check_data()


def test_a_text_column_for_a_token_file_is_refused_before_a_folder_is_written(tmp_path, empty_cache, monkeypatch):
    """`text_column: foo` with a token file passed the pre-flight and `run --dry-run` ("refused: None"); `sweep`
    and `tune-lr` then refused it only when recording the folder's corpus, after writing OUT/spec.yaml, so the same
    spec without the key was refused there as "a run of a different spec". The pre-flight now refuses it as the
    runs do: one error line, exit 2, no folder."""
    from loopscale.model.data import CorpusError, check_corpus

    monkeypatch.chdir(tmp_path)
    npy = tmp_path / "u16.npy"
    np.save(npy, np.random.default_rng(0).integers(0, 500, 50_000).astype(np.uint16))
    want = f"text_column 'foo' names the column of a Parquet corpus; {str(npy)!r} is a token file, which has no columns"
    with pytest.raises(CorpusError, match=re.escape(want)):
        check_corpus(str(npy), "pretokenized", 512, "foo")
    spec = preset_spec("smoke").model_copy(update={
        "name": "tk", "corpus": str(npy), "tokenizer": "pretokenized", "text_column": "foo", "sizes": [16], "r": [1, 2],
        "model": preset_spec("smoke").model.model_copy(update={"vocab_size": 512})})  # fmt: skip
    (tmp_path / "tk.yaml").write_text(spec_to_yaml(spec))
    for args in (["sweep", "tk.yaml", "--out", "ex"], ["tune-lr", "tk.yaml", "--out", "ex"],
                 ["run", "tk.yaml", "--out", "ex", "--dry-run"]):  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and want in res.output, (args, res.output)
        assert not (tmp_path / "ex").exists(), args


def test_a_corpus_that_cannot_be_hashed_leaves_no_spec_yaml(tmp_path, monkeypatch):
    """record_folder_spec hashes the corpus before it writes OUT/spec.yaml: a corpus error there (a fault only the
    hash meets) refused the command after the folder had recorded the spec, and that spec.yaml then refused the
    corrected spec in the same folder."""
    from loopscale.model.data import CorpusError
    from loopscale.sweep import spec as spec_mod

    def fails(spec):
        raise CorpusError("the corpus cannot be read")

    monkeypatch.setattr(spec_mod, "corpus_hash_now", fails)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CorpusError, match="the corpus cannot be read"):
        spec_mod.record_folder_spec(out, preset_spec("smoke"))
    assert list(out.iterdir()) == []


def test_eval_tokens_not_whole_windows_is_said_by_the_dry_run(tmp_path):
    """training.eval_tokens 10 at seq_len 32: every run rounded it up to 32 and said so in its warnings, while the
    dry run said nothing."""
    import yaml

    d = preset_spec("smoke").model_dump(mode="json")
    d["training"]["eval_tokens"] = 10
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    p = _dry_run(tmp_path, str(tmp_path / "s.yaml"))
    assert p["eval_warning"] == ("training.eval_tokens=10 is rounded up to 32 in every run (whole windows of "
                                 "seq_len=32)")  # fmt: skip
    d["lr"], d["tune"]["eval_tokens"] = "tune", 40  # the LR trials' own eval_tokens too
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    p = _dry_run(tmp_path, str(tmp_path / "s.yaml"))
    assert p["eval_warning"].endswith("; tune.eval_tokens=40 is rounded up to 64 in every LR trial (whole windows of "
                                      "seq_len=32)")  # fmt: skip


def test_a_dry_run_with_json_of_a_corpus_every_run_would_fail_on_prints_its_refusal_as_json(tmp_path):
    """`run --dry-run --json` of a spec whose corpus glob matches nothing printed no JSON (the error on stderr
    only), while a spec refused for its design printed {"refused": ...}: a script reading the plan got nothing to
    parse. It prints the folder and the refusal as one JSON object, and exits 2 as before."""
    spec = preset_spec("smoke").model_copy(update={"corpus": str(tmp_path / "nowhere" / "*.txt")})
    path = tmp_path / "bad.yaml"
    path.write_text(spec_to_yaml(spec))
    res = CliRunner().invoke(app, ["run", str(path), "--dry-run", "--json", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    got = json.loads(res.stdout)
    assert got == {"out": str((tmp_path / "out").resolve()),
                   "refused": got["refused"]} and "matches no file" in got["refused"]  # fmt: skip
    assert not (tmp_path / "out").exists()
