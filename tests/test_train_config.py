"""Training config: YAML + dotted overrides, validated up front with messages that name the fix;
the shipped recipes resolve to the official README hyper-parameters (github.com/wangf3014/ViT-5
README training commands, main.py defaults at commit b7b0796)."""

from pathlib import Path

import pytest
from test_train_support import TINY, single_thread  # noqa: F401 (autouse fixture)

from vit5.cli.train import parse_args
from vit5.train import TrainConfigError, config_to_yaml, load_config
from vit5.train.config import DEMO_RECIPE

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DIGITS = ["data.dataset=digits"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1e-3"], r"optim\.lrr is not a setting\. Did you mean optim\.lr\?"),
        (["optm.lr=1e-3"], r"optm is not a setting\. Did you mean optim\?"),
        (["optim.lr=fast"], r"bad value for optim\.lr: .*'fast'.*\(expected float\)"),
        (["data.batch_size=1.5"], r"data\.batch_size.*\(expected int\)"),
        (["aug.mixup_mode=rows"], r"aug\.mixup_mode.*expected one of \['batch', 'pair', 'elem'\]"),
        (["optim"], r"not a key=value override; write e\.g\. optim\.lr=1e-3"),
        (["model=3"], r"model is a section; give it keys"),
        (
            ["model.name=vit5_smal"],
            r"model\.name='vit5_smal' is not a preset; did you mean vit5_small\?",
        ),
        (["model.overrides.dept=2"], r"unknown ViT5Config key 'dept': did you mean 'depth'\?"),
        (["model.overrides.img_size=64"], r"model\.overrides\.img_size duplicates model\.img_size"),
        (["optim.name=lamm"], r"optim\.name='lamm' is not a timm optimizer \(closest: lamb"),
        (["data.preload=true"], r"data\.dataset=digits has none .*set data\.preload=false"),
        (
            ["data.batch_size=7"],
            r"data\.batch_size=7 is odd, but timm Mixup/CutMix needs an even batch",
        ),
        (
            ["loss.smoothing=0.1"],
            r"makes all targets 1; set loss\.smoothing=0 \(official\) or loss\.bce_target_threshold=null",
        ),
        (["model.compile=fast"], r"model\.compile=fast is not a choice: use true .* regional"),
        (
            ["schedule.warmup_epochs=900"],
            r"schedule\.warmup_epochs=900\.0 must be in \[0, schedule\.epochs\)",
        ),
    ],
)
def test_bad_settings_are_named_with_the_fix(overrides, message):
    with pytest.raises(TrainConfigError, match=message):
        load_config(None, DIGITS + overrides)


def test_all_problems_are_reported_at_once():
    with pytest.raises(TrainConfigError) as info:
        load_config(None, DIGITS + ["optim.lr=-1", "aug.hflip=2", "ema.decay=1.0"])
    text = str(info.value)
    assert "optim.lr=-1.0 must be > 0" in text and "aug.hflip=2.0 must be a probability" in text
    assert "ema.decay=1.0 must be in (0, 1)" in text


def test_a_data_root_that_the_data_set_would_not_read_is_refused(tmp_path):
    # `vit5 train data.root=DIR` runs the demo recipe, whose built-in digits would ignore DIR
    with pytest.raises(
        TrainConfigError,
        match=rf"data\.root={tmp_path} is set, but data\.dataset=digits reads the built-in "
        r"digits, not a folder: add data\.dataset=folder",
    ):
        load_config(DEMO_RECIPE, [f"data.root={tmp_path}"])
    shards = ["data.dataset=wds", "data.train_shards=/s/t.tar", "data.val_shards=/s/v.tar"]
    with pytest.raises(TrainConfigError, match=r"data\.dataset=wds reads data\.train_shards"):
        load_config(None, [*shards, "aug.repeated_aug=1", f"data.root={tmp_path}"])
    given = load_config(
        DEMO_RECIPE, ["data.dataset=folder", f"data.root={tmp_path}"], check_paths=False
    )
    assert given.data.root == str(tmp_path)


def test_missing_data_paths(tmp_path):
    with pytest.raises(
        TrainConfigError, match=r"data\.root is not set: pass data\.root=/path/to/dataset"
    ):
        load_config(None, [])
    with pytest.raises(TrainConfigError, match=r"data\.root=.*nowhere does not exist"):
        load_config(None, [f"data.root={tmp_path / 'nowhere'}"])
    (tmp_path / "train").mkdir()
    with pytest.raises(
        TrainConfigError,
        match=r"data\.val_split='val': split folder .*val does not exist \(sub-folders of .*: train\)",
    ):
        load_config(None, [f"data.root={tmp_path}"])
    # a split given as data.root: both problems name the root to give
    (tmp_path / "val").mkdir()
    with pytest.raises(TrainConfigError) as err:
        load_config(None, [f"data.root={tmp_path / 'train'}"])
    for key, split in (("train_split", "train"), ("val_split", "val")):
        assert (
            f"data.{key}='{split}': split folder {tmp_path / 'train' / split} does not exist, but "
            f"{tmp_path / split} does: the data root is {tmp_path}; fix data.root or data.{key}"
        ) in str(err.value)
    with pytest.raises(
        TrainConfigError, match=r"required setting\(s\) data\.root not given; add data\.root=\.\.\."
    ):
        load_config(CONFIGS / "vit5_small_in1k.yaml")
    with pytest.raises(TrainConfigError, match=r"model\.pretrained=.*missing\.pth does not exist"):
        load_config(None, DIGITS + [f"model.pretrained={tmp_path / 'missing.pth'}"])


def test_unknown_key_in_a_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("optim:\n  weight_decy: 0.1\n")
    with pytest.raises(
        TrainConfigError,
        match=r"recipe\.yaml: optim\.weight_decy is not a setting\. Did you mean optim\.weight_decay\?",
    ):
        load_config(path, DIGITS)
    with pytest.raises(
        TrainConfigError, match=r"does not exist\. Configs in .*: \['recipe\.yaml'\]"
    ):
        load_config(tmp_path / "recpe.yaml")


def test_overrides_apply_after_the_file_and_round_trip_through_yaml(tmp_path):
    cfg = load_config(
        CONFIGS / "demo_digits.yaml",
        ["optim.lr=2e-3", "model.overrides.depth=3", "aug.scale=[0.5,1.0]"],
    )
    assert cfg.optim.lr == 2e-3 and cfg.model.overrides == {"patch_size": 8, "depth": 3}
    assert cfg.aug.scale == (0.5, 1.0) and isinstance(cfg.optim.lr, float)
    path = tmp_path / "as_run.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(path) == cfg


# Expected values typed from the official README commands and main.py defaults, not from our YAMLs.
RECIPES = {
    "vit5_small_in1k.yaml": dict(name="vit5_small", img=224, epochs=800, lr=4e-3, dp=0.05),
    "vit5_base_in1k.yaml": dict(name="vit5_base", img=192, epochs=800, lr=3e-3, dp=0.2),
    "vit5_large_in1k.yaml": dict(name="vit5_large", img=192, epochs=400, lr=3e-3, dp=0.35),
    "deit3_small_in1k.yaml": dict(name="deit3_small", img=224, epochs=800, lr=4e-3, dp=0.05),
}


@pytest.mark.parametrize("file, expected", sorted(RECIPES.items()))
def test_pretraining_recipes_match_the_official_commands(file, expected):
    cfg = load_config(CONFIGS / file, ["data.root=/imagenet"], check_paths=False)
    assert (cfg.model.name, cfg.model.img_size, cfg.schedule.epochs) == (
        expected["name"],
        expected["img"],
        expected["epochs"],
    )
    assert (
        cfg.optim.lr == expected["lr"] and cfg.optim.lr_base_batch is None
    )  # --unscale-lr: absolute
    assert cfg.model.drop_path_rate == expected["dp"]
    assert (cfg.optim.name, cfg.optim.weight_decay, cfg.optim.eps, cfg.optim.betas) == (
        "lamb",
        0.05,
        1e-8,
        (0.9, 0.999),
    )
    assert cfg.data.batch_size == 256 and cfg.optim.accum_steps == 1
    assert (cfg.aug.train, cfg.aug.color_jitter, cfg.aug.repeated_aug, cfg.aug.eval_crop_ratio) == (
        "three_augment",
        0.3,
        3,
        1.0,
    )
    assert (cfg.aug.mixup, cfg.aug.cutmix, cfg.aug.mixup_prob, cfg.aug.mixup_switch_prob) == (
        0.8,
        1.0,
        1.0,
        0.5,
    )
    assert (cfg.loss.name, cfg.loss.smoothing, cfg.loss.bce_target_threshold) == ("bce", 0.0, 0.0)
    sched = cfg.schedule
    assert (sched.warmup_epochs, sched.warmup_lr, sched.min_lr, sched.interval) == (
        5,
        1e-6,
        1e-5,
        "epoch",
    )
    assert cfg.ema.enabled and cfg.ema.decay == 0.99996 and cfg.run.mixed_precision == "bf16"


def test_finetune_recipe_matches_the_official_command():
    with pytest.raises(TrainConfigError, match=r"model\.pretrained"):
        load_config(CONFIGS / "finetune_in1k.yaml", ["data.root=/imagenet"], check_paths=False)
    cfg = load_config(
        CONFIGS / "finetune_in1k.yaml",
        ["data.root=/in", "model.pretrained=s.pth"],
        check_paths=False,
    )
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay, cfg.schedule.epochs) == (
        "adamw",
        1e-5,
        0.1,
        20,
    )
    assert (
        cfg.data.batch_size == 64 and cfg.model.pretrained_ema and cfg.model.drop_path_rate == 0.05
    )
    assert (cfg.aug.train, cfg.aug.randaug, cfg.aug.repeated_aug) == (
        "randaug",
        "rand-m9-mstd0.5-inc1",
        1,
    )
    assert (
        (cfg.loss.name, cfg.loss.smoothing) == ("soft_ce", 0.1)
        and cfg.aug.mixup == 0.8
        and cfg.aug.cutmix == 1.0
    )
    assert cfg.schedule.min_lr == cfg.optim.lr  # constant 1e-5 after warmup


def test_resume_flag_without_a_directory_keeps_overrides():
    args = parse_args(["--resume", "optim.lr=1e-3", "schedule.epochs=3"])
    assert args.resume == "" and args.overrides == ["optim.lr=1e-3", "schedule.epochs=3"]
    args = parse_args(["--resume", "runs/demo", "schedule.epochs=3"])
    assert args.resume == "runs/demo" and args.overrides == ["schedule.epochs=3"]


def test_recipes_load_by_name_from_the_package_and_the_repository_folder_is_the_same():
    from vit5.train.config import recipe_path, recipes

    assert (
        CONFIGS.resolve() == next(iter(recipes().values())).parent.resolve()
    )  # configs -> vit5/configs
    assert sorted(recipes()) == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    by_name = load_config("vit5_small_in1k", ["data.root=/imagenet"], check_paths=False)
    assert by_name == load_config(
        CONFIGS / "vit5_small_in1k.yaml", ["data.root=/imagenet"], check_paths=False
    )
    assert recipe_path("demo_digits.yaml") == recipes()["demo_digits"]
    with pytest.raises(
        TrainConfigError, match=r"vit5_smal does not exist; packaged recipes .*vit5_small_in1k"
    ):
        load_config("vit5_smal")


# ------------------------------------------------------------------ documented commands, short runs
DOCS = Path(__file__).resolve().parent.parent / "docs" / "training.md"


def documented_train_commands() -> list[list[str]]:
    """The ``vit5 train`` / ``-m vit5 train`` command lines of docs/training.md's bash blocks, as argv
    after ``train`` (continuation lines joined, comments dropped)."""
    import shlex

    text = DOCS.read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```bash")[1:]]
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "train" in words and words[: words.index("train")][-1:] == ["vit5"]:
                commands.append(words[words.index("train") + 1 :])
    return commands


def test_every_documented_training_command_line_parses_and_validates():
    commands = documented_train_commands()
    assert len(commands) >= 12 and ["schedule.epochs=1"] in commands  # the CPU-process example
    for argv in commands:
        argv = [a for a in argv if not a.startswith("$")]  # a shell variable: empty on a first run
        args = parse_args(argv)
        if args.resume is not None or any(o.startswith("optim.lrr") for o in args.overrides):
            continue  # resume needs a run; optim.lrr is the documented error
        try:
            cfg = load_config(args.config or DEMO_RECIPE, args.overrides, check_paths=False)
        except (
            TrainConfigError
        ) as e:  # an optional package (a tracker) this machine lacks is no bug
            problems = str(e).splitlines()[1:]
            if problems and all("which is not installed: pip install" in p for p in problems):
                continue
            raise
        assert 0 <= cfg.schedule.warmup_epochs < cfg.schedule.epochs, argv


def test_a_recipe_warmup_longer_than_a_short_run_becomes_a_tenth_of_it_with_a_note():
    from vit5.train.config import ConfigAdjusted

    with pytest.warns(
        ConfigAdjusted, match=r"warmup_epochs=1 of the recipe does not fit schedule\.epochs=1"
    ):
        cfg = load_config("demo_digits", ["schedule.epochs=1"])
    assert cfg.schedule.warmup_epochs == pytest.approx(0.1)
    with pytest.warns(ConfigAdjusted, match=r"warming up for 0\.3 epochs"):
        cfg = load_config(
            "vit5_small_in1k", ["data.root=/x", "schedule.epochs=3"], check_paths=False
        )
    assert cfg.schedule.warmup_epochs == pytest.approx(0.3)
    with pytest.raises(
        TrainConfigError, match=r"warmup_epochs=1\.0 must be in \[0, schedule\.epochs\)"
    ):
        load_config(
            "demo_digits", ["schedule.epochs=1", "schedule.warmup_epochs=1"]
        )  # the user's own


def test_vit5_ablate_with_one_epoch_builds_every_run_config(tmp_path):
    from vit5.cli.ablate import parse_args as ablate_args
    from vit5.cli.ablate import plan_from_args

    plan = plan_from_args(ablate_args(["--epochs", "1", "--out", str(tmp_path)]))
    for ablation in plan.ablations:
        cfg = plan.config(ablation, plan.seeds[0])
        assert cfg.schedule.epochs == 1 and cfg.schedule.warmup_epochs < 1


# ------------------------------------------------------------------ values that used to crash or pass
@pytest.mark.parametrize(
    "override, message",
    [
        ("run.seed=-1", r"run\.seed=-1 must be in \[0, 2\*\*31\)"),
        ("optim.lr=1e39", r"optim\.lr=1e\+39 must be a finite number of at most 3\.4e38"),
        ("optim.eps=inf", r"optim\.eps=inf must be a finite number"),
        ("schedule.min_lr=inf", r"schedule\.min_lr=inf must be a finite number"),
        ("optim.name=adam\x01w", r"holds the control character '\\x01' at position 15; retype it"),
    ],
)
def test_values_that_crashed_or_trained_nothing_are_one_error(override, message):
    with pytest.raises(TrainConfigError, match=message):
        load_config(None, [*DIGITS, override])


def test_the_command_line_reports_them_as_one_line(capsys):
    from vit5.cli import train as cli

    assert cli.main([*DIGITS, "run.seed=-1", "run.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "run.seed=-1 must be in [0, 2**31)" in err


def test_a_huge_value_is_cut_in_the_message(tmp_path):
    recipe = tmp_path / "big.yaml"
    recipe.write_text(f"model:\n  name: {'x' * 300_000}\noptim:\n  lr: {'y' * 300_000}\n")
    with pytest.raises(TrainConfigError) as info:
        load_config(recipe, ["data.dataset=digits"])
    assert len(str(info.value)) < 1000 and "characters" in str(info.value)
    recipe.write_text(f"model:\n  name: {'x' * 300_000}\n")
    with pytest.raises(TrainConfigError) as info:
        load_config(recipe, ["data.dataset=digits"])
    assert len(str(info.value)) < 2000 and "(300,002 characters)" in str(info.value)
    with pytest.raises(TrainConfigError) as info:
        load_config(None, [f"data.root=/{'z' * 300_000}"])
    assert len(str(info.value)) < 1000


# ------------------------------------------------------------------ pretrained weights by name
def test_released_weights_by_name_pass_validation_and_bad_names_are_named():
    cfg = load_config(None, [*DIGITS, "model.pretrained=vit5_small_patch16_224.in1k"])
    assert cfg.model.pretrained == "vit5_small_patch16_224.in1k"
    assert load_config(None, [*DIGITS, "model.pretrained=true"]).model.pretrained == "True"
    with pytest.raises(
        TrainConfigError, match=r"model\.pretrained=true: vit5_tiny has no released weights"
    ):
        load_config(None, [*DIGITS, "model.name=vit5_tiny", "model.pretrained=true"])
    with pytest.raises(
        TrainConfigError,
        match=r"neither a file nor released weights; did you mean vit5_small_patch16_224",
    ):
        load_config(None, [*DIGITS, "model.pretrained=vit5_small_patch16_224.in21k"])
    with pytest.raises(
        TrainConfigError, match=r"244\.in1k does not exist; check the path, or name released"
    ):
        load_config(None, [*DIGITS, "model.pretrained=vit5_small_patch16_244.in1k"])


# ------------------------------------------------------------------ environment values stay unresolved
def test_environment_values_are_never_written_resolved(tmp_path, monkeypatch):
    import json

    from vit5.train import Trainer
    from vit5.train.checkpointing import resolve_resume
    from vit5.weights.publish import stage_for_hub

    monkeypatch.setenv("VIT5_TEST_SECRET", "s3cr3t-token")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("run:\n  name: tiny-${oc.env:VIT5_TEST_SECRET}\n")
    cfg = load_config(recipe, [*TINY[:-1], f"run.output_dir={tmp_path / 'runs'}"])
    assert cfg.run.name == "tiny-s3cr3t-token"  # the run itself sees the value
    trainer = Trainer(cfg)
    trainer.fit()
    run = trainer.run_dir
    staged = stage_for_hub(run / "final", tmp_path / "hub", "user/repo")
    written = {
        "config.yaml": (run / "config.yaml").read_text(),
        "checkpoint.json": (resolve_resume(run)[1] / "checkpoint.json").read_text(),
        "final/config.json": (run / "final" / "config.json").read_text(),
        "uploaded config.json": (staged / "config.json").read_text(),
    }
    for name, text in written.items():
        assert "s3cr3t" not in text, name
    assert "tiny-${oc.env:VIT5_TEST_SECRET}" in written["config.yaml"]
    assert json.loads(written["uploaded config.json"])["run"] == "tiny-${oc.env:VIT5_TEST_SECRET}"
    assert (
        load_config(run / "config.yaml").run.name == "tiny-s3cr3t-token"
    )  # --resume reads it again
    monkeypatch.delenv("VIT5_TEST_SECRET")
    with pytest.raises(TrainConfigError, match=r"cannot resolve run\.name: .*VIT5_TEST_SECRET"):
        load_config(recipe, DIGITS)


def test_the_command_line_prints_the_warmup_note(monkeypatch, capsys):
    import vit5.train.trainer
    from vit5.cli import train as cli
    from vit5.errors import Vit5Error

    class Stop:  # stands in for the run: only what is printed before it matters
        def __init__(self, cfg, resume=None):
            raise Vit5Error(f"stopped with warmup {cfg.schedule.warmup_epochs:g}")

    monkeypatch.setattr(vit5.train.trainer, "Trainer", Stop)
    assert cli.main(["schedule.epochs=1"]) == 2  # docs/training.md's 2-process example, in one
    captured = capsys.readouterr()
    assert (
        "note: schedule.warmup_epochs=1 of the recipe does not fit schedule.epochs=1"
        in captured.out
    )
    assert "error: stopped with warmup 0.1" in captured.err


def test_a_hand_built_config_is_checked_when_it_is_built(tmp_path):
    """A TrainConfig changed in Python (not through load_config) gets the same one error, before any
    work: the config checks itself at construction, so no Trainer ever sees it."""
    from dataclasses import replace

    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}"])
    with pytest.raises(TrainConfigError, match="vit5_tiny has no released weights"):
        replace(cfg, model=replace(cfg.model, name="vit5_tiny", pretrained="true"))
    assert not any(tmp_path.iterdir())  # refused before a run directory was made
