"""The torch-free checkpoint-directory names (albert_dist.engine.checkpoint.layout) shared by engine and tracking."""

from albert_dist.engine.checkpoint import layout as cd


def test_tags_round_trip_and_other_names_are_not_steps():
    assert cd.tag_for(120) == "step_120" and cd.step_of("step_120") == 120
    assert cd.step_of("checkpoints/step_7") == 7 and cd.step_of("a/step_7/") == 7  # an artifact path
    assert [cd.step_of(n) for n in ("step_7_universal", "latest", ".latest.tmp.1", "step_", "step_x")] == [None] * 5


def test_latest_is_replaced_whole(tmp_path):
    assert cd.read_latest(tmp_path) is None
    cd.write_latest(tmp_path, "step_3")
    cd.write_latest(tmp_path, "step_10")
    assert cd.read_latest(tmp_path) == "step_10" and (tmp_path / "latest").read_text() == "step_10"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no temporary file left behind
    (tmp_path / "latest").write_text("  \n")
    assert cd.read_latest(tmp_path) is None



def test_list_files_sizes_relative_paths_and_exclusions(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.pt").write_bytes(b"12345")
    (tmp_path / "sub" / "b.pt").write_bytes(b"")
    (tmp_path / "COMPLETE.json").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "a.pt")
    assert cd.list_files(tmp_path, exclude=("COMPLETE.json",)) == {"a.pt": 5, "sub/b.pt": 0}
    assert list(cd.list_files(tmp_path)) == ["COMPLETE.json", "a.pt", "sub/b.pt"]
