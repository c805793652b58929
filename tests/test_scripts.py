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
        ("train_drafter", ["lr=0"], "lr=0: expected a finite number > 0"),
        ("train_drafter", ["nope=1"], "nope"),
        ("train_gpt", ["lr=-1"], "lr=-1: expected a finite number > 0"),
        ("train_gpt", ["steps=0"], "steps=0: expected an integer >= 1"),
        ("train_vq", ["batch_size=0"], "batch_size=0: expected an integer >= 1"),
        ("train_classifier", ["epochs=0"], "epochs=0: expected an integer >= 1"),
        ("train_classifier", ["lr=inf"], "lr=inf: expected a finite number > 0"),
        ("train_clip", ["batch_size=0"], "batch_size=0: expected an integer >= 1"),
        ("train_clip", ["lr=nan"], "lr=nan: expected a finite number > 0"),
        ("export_hf", ["parts=[vq]"], "parts='vq': expected one of target, drafter"),
        ("export_hf", ["parts=[]"], "parts=[]: expected a non-empty list of target, drafter"),
        ("export_hf", ["weights_dtype=int8"], "weights_dtype='int8': expected one of float32, bfloat16, float16"),
        ("export_hf", ["model.gpt_ckpt=/nonexistent/gpt"], "checkpoint file not found: '/nonexistent/gpt'"),
    ],
)
def test_bad_training_values_are_one_line_at_once_and_leave_no_folder(tmp_path, capsys, script, overrides, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        run_hydra_script(script, [*overrides, f"out_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: ") and "\n" not in err and message in err, err
    assert not out.exists()


ARGPARSE_SCRIPTS = [
    "bench_ar",
    "bench_speculative",
    "eval_world",
    "fid_reference",
    "gpu_check",
    "make_tables",
    "ship_world",
]
HYDRA_SCRIPTS = ["export_hf", "train_classifier", "train_clip", "train_drafter", "train_gpt", "train_vq"]


def _main(name: str, argv: list[str], monkeypatch) -> None:
    import sys

    from script_helpers import load_script

    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    module = load_script(name)
    module.main() if name != "gpu_check" else module.main(argv)


@pytest.mark.parametrize("name", ARGPARSE_SCRIPTS)
def test_every_tool_has_help_and_refuses_an_unknown_flag_in_one_line(name, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _main(name, ["--help"], monkeypatch)
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        _main(name, ["--no-such-flag"], monkeypatch)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: ") and "\n" not in err, err


@pytest.mark.parametrize("name", HYDRA_SCRIPTS)
def test_every_training_job_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_hydra_script(name, ["--help"])
    assert exit_info.value.code == 0 and "Powered by Hydra" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("bench_speculative", ["--deltas", "abc"], "--deltas='abc': expected a number in [0, 1]"),
        ("bench_speculative", ["--deltas", "-0.5"], "--deltas=-0.5: expected a number in [0, 1]"),
        ("bench_speculative", ["--structures", "pyramid"], "--structures='pyramid': expected one of"),
        ("bench_speculative", ["--model", "nope"], "--model='nope': expected one of"),
        ("bench_speculative", ["--mode", "x::foo=1"], "unknown key 'foo'"),
        ("bench_speculative", ["--overrides", "temperature=-3"], "temperature=-3: expected a finite number >= 0"),
        ("bench_speculative", ["--images", "0"], "--images=0: expected an integer >= 1"),
        ("bench_ar", ["--runs", "0"], "--runs=0: expected an integer >= 1"),
        ("eval_world", ["--batch-size", "0", "recon"], "--batch-size=0: expected an integer >= 1"),
        ("fid_reference", ["--images", "x", "--out", "y", "--size", "4"], "--size=4: expected an integer >= 8"),
        ("ship_world", ["--world", "W", "--file", "a=b"], "--file='a=b': expected NAME=SOURCE=COMMAND"),
        ("make_tables", ["R", "--stem", "../x/y"], "--stem='../x/y': expected a plain file name"),
        ("gpu_check", ["--images", "1", "--device", "cpu"], "--images=1: expected an integer >= 2"),
        ("bench_speculative", ["--runs", "0"], "--runs=0: expected an integer >= 1"),
        ("bench_speculative", ["--threads", "-1"], "--threads=-1: expected an integer >= 1"),
        ("bench_speculative", ["--seed", "x"], "--seed='x': expected an integer >= 0"),
        ("bench_speculative", ["--settings", "warm"], "--settings='warm': expected one of greedy, sampling"),
        ("bench_speculative", ["--candidates", "maybe"], "--candidates='maybe': expected one of deterministic"),
        ("bench_speculative", ["--peers", "xyz"], "--peers='xyz': expected one of sjd, gsd, gsd_audit_off"),
        ("bench_speculative", ["--lantern-structures", "pyramid"], "--lantern-structures='pyramid': expected one of"),
        ("bench_speculative", ["--mode", "nolabel"], "--mode='nolabel': expected LABEL::OVERRIDES"),
        ("bench_speculative", ["--mode", "x::decoding=lantern compile=none"], "leave compile, dtype, device"),
        ("bench_speculative", ["--overrides", "compile=none"], "--overrides='compile=none': expected overrides"),
        ("bench_speculative", ["--compile", "fast"], "compile='fast': expected one of none, default"),
        ("bench_speculative", ["--deltas", "nan"], "--deltas=nan: expected a number in [0, 1]"),
        ("bench_ar", ["--preset", "nope"], "GPT preset='nope': expected one of"),
        ("bench_ar", ["--grid", "0"], "--grid=0: expected an integer >= 1"),
        ("bench_ar", ["--vocab", "1"], "--vocab=1: expected an integer >= 2"),
        ("bench_ar", ["--batch-sizes", "0"], "--batch-sizes=0: expected an integer >= 1"),
        ("bench_ar", ["--warmup", "-1"], "--warmup=-1: expected an integer >= 0"),
        ("bench_ar", ["--top-k", "-2"], "top_k=-2: expected an integer >= 0"),
        ("bench_ar", ["--device", "tpu"], "device='tpu': expected cpu, cuda or cuda:N"),
        ("bench_ar", ["--threads", "-1"], "--threads=-1: expected an integer >= 0"),
        ("bench_ar", ["--runs", "two"], "argument --runs: invalid int value: 'two'"),
        ("eval_world", ["nothing"], "argument mode: invalid choice: 'nothing'"),
        ("eval_world", ["samples", "/nonexistent"], "'/nonexistent' has no metrics.json"),
        ("fid_reference", ["--images", "/nonexistent", "--out", "o"], "image folder not found: '/nonexistent'"),
        ("make_tables", ["/nonexistent"], "runs path not found: '/nonexistent'"),
        ("make_tables", ["R", "--stem", ""], "--stem='': expected a plain file name"),
        ("make_tables", ["R", "--stem", ".."], "--stem='..': expected a plain file name"),
        ("gpu_check", ["--dtype", "int8", "--device", "cpu"], "argument --dtype: invalid choice: 'int8'"),
        ("gpu_check", ["--compile", "fast", "--device", "cpu"], "argument --compile: invalid choice: 'fast'"),
        ("gpu_check", ["--device", "tpu"], "device='tpu': expected cpu, cuda or cuda:N"),
        ("gpu_check", ["--targets", "moon", "--device", "cpu"], "--targets='moon': expected one of world, llamagen"),
        ("ship_world", ["--world", "W", "--file", "a=/nonexistent=c"], "expected an existing file"),
    ],
)
def test_bad_tool_values_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, name, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        _main(name, argv, monkeypatch)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: ") and "\n" not in err and message in err, err
    assert list(tmp_path.iterdir()) == []
