"""Every script on the one bad-input contract: one `error:` line, exit 2, nothing written, before any work."""

import pytest
from script_helpers import run_hydra_script


@pytest.mark.parametrize(
    "script, overrides, message",
    [
        ("train_drafter", ["steps=0"], "steps=0: expected an integer >= 1"),
        ("train_drafter", ["lr=nan"], "lr=nan: expected a finite number > 0"),
        ("train_drafter", ["batch_size=-4"], "batch_size=-4: expected an integer >= 1"),
        ("train_drafter", ["data=pictures"], "data='pictures': expected one of self, images"),
        ("train_gpt", ["batch_size=-4"], "batch_size=-4: expected an integer >= 1"),
        ("train_gpt", ["warmup_steps=-1"], "warmup_steps=-1: expected an integer >= 0"),
        ("train_vq", ["lrr=0.1"], "lrr"),
        ("train_vq", ["min_lr_ratio=2"], "min_lr_ratio=2: expected a number in [0, 1]"),
        ("train_vq", ["restart.until_fraction=1.5"], "restart.until_fraction=1.5: expected a number in [0, 1]"),
        ("train_classifier", ["label_smoothing=1"], "label_smoothing=1: expected a number in [0, 1)"),
        ("train_clip", ["grad_clip=0"], "grad_clip=0: expected a finite number > 0 or null"),
    ],
)
def test_bad_training_values_are_one_line_at_once_and_leave_no_folder(tmp_path, capsys, script, overrides, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        run_hydra_script(script, [*overrides, f"out_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: ") and "\n" not in err and message in err, err
    assert not out.exists()
