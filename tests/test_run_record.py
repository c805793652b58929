"""The run record schema: built in one place, versioned, validated when read."""

import json

import pytest
from helpers import REPO

from lantern.decoding.tree.decoder import TreeSettings
from lantern.results.record import SCHEMA_VERSION, RecordError, build_record, json_schema, read_record, write_record

LANTERN = TreeSettings(
    name="lantern",
    label="LANTERN",
    draft={"draft": "chain", "candidates": "sampled"},
    rule={"acceptance": "lantern", "k": 1000, "delta": 0.1, "lambda": None, "label": "k=1000 d=0.1"},
)
# A record of the versions before 4: the decoder's knobs as flat entries, no typed settings.
OLD_FIELDS = {
    "decoding": "lantern",
    "model": "m",
    "prompts": "p",
    "num_images": 2,
    "batch_size": 1,
    "seed": 0,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "cfg_scale": 3.0,
    "k": 1000,
    "delta": 0.1,
    "lambda": None,
    "environment": {"device": "cpu"},
    "acceptance_histogram": [3, 1],
}
FIELDS = {
    **{key: value for key, value in OLD_FIELDS.items() if key not in ("k", "delta", "lambda")},
    "settings": LANTERN.to_json(),
}


def test_a_built_record_round_trips_with_its_version_and_extras(tmp_path):
    record = build_record(FIELDS)
    path = write_record(record, tmp_path)
    payload = json.loads(path.read_text())
    assert payload["schema_version"] == SCHEMA_VERSION and "delta" not in payload and "lambda" not in payload
    assert payload["compile"] is None and payload["phase_times"] is None and payload["world_size"] == 1
    again = read_record(tmp_path)
    assert again.get("acceptance_histogram") == [3, 1] and again.run_dir == str(tmp_path)
    assert again.decoder_settings == LANTERN and again.decoder_settings.columns()["delta"] == 0.1
    assert again.to_json() == payload


def test_settings_are_required_and_checked_field_by_field_from_version_4(tmp_path):
    with pytest.raises(ValueError, match="settings: required from schema version 4"):
        build_record(OLD_FIELDS)
    bad = {**LANTERN.to_json(), "draft": "chain"}  # a string where the settings class wants a dict
    with pytest.raises(ValueError, match="tree settings, field 'draft'"):
        build_record({**FIELDS, "settings": bad})
    (tmp_path / "metrics.json").write_text(json.dumps({**FIELDS, "schema_version": 4, "settings": bad}))
    with pytest.raises(RecordError, match="field 'draft'"):
        read_record(tmp_path)
    with pytest.raises(ValueError, match=r"delta=1.5: expected a number in \[0, 1\]"):
        rule = {**LANTERN.rule, "delta": 1.5}
        build_record({**FIELDS, "settings": {**LANTERN.to_json(), "rule": rule}})


def test_a_version_3_record_keeps_its_flat_knobs_as_entries_tables_read(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({**OLD_FIELDS, "schema_version": 3}))
    old = read_record(tmp_path)
    assert old.get("delta") == 0.1 and old.get("k") == 1000 and old.settings is None
    assert "k=1000" in old.decoder_settings.method() and "delta=0.1" in old.decoder_settings.method()


def test_the_builder_refuses_a_record_that_breaks_the_schema():
    with pytest.raises(ValueError, match="field 'num_images'"):
        build_record({**FIELDS, "num_images": "2"})


@pytest.mark.parametrize(
    "change,message",
    [
        ({"seed": 1.5}, "field 'seed': input should be a valid integer"),
        ({"latency_s_per_image": [0.1]}, "field 'latency_s_per_image': input should be a valid number"),
        ({"environment": "cpu"}, "field 'environment': input should be a valid dictionary"),
        ({"schema_version": "1"}, "schema_version='1'"),
    ],
)
def test_reading_names_the_file_and_the_bad_field(tmp_path, change, message):
    (tmp_path / "metrics.json").write_text(json.dumps({**FIELDS, "schema_version": 1, **change}))
    with pytest.raises(RecordError) as caught:
        read_record(tmp_path)
    assert str(caught.value).startswith(f"'{tmp_path / 'metrics.json'}'") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_records_before_versioning_read_as_version_0(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps(OLD_FIELDS))
    assert read_record(tmp_path).schema_version == 0


def test_the_shipped_json_schema_is_the_current_one():
    shipped = json.loads((REPO / "docs" / "run_record.schema.json").read_text())
    assert shipped == json.loads(json.dumps(json_schema())), (
        'regenerate docs/run_record.schema.json: python -c "import json; from lantern.results.record import json_schema; '
        "open('docs/run_record.schema.json','w').write(json.dumps(json_schema(), indent=2) + '\\n')\""
    )
