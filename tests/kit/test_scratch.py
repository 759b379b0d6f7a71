"""The guarded module: how the kit's own process reads, writes and empties a folder a sandbox could write."""

from __future__ import annotations

import os
import threading

import pytest

from labkit.run import scratch


@pytest.fixture
def folder(tmp_path):
    f = tmp_path / "scratch"
    f.mkdir()
    return f


def test_a_regular_file_is_read(folder):
    (folder / "results.json").write_bytes(b"{}")
    assert scratch.read(folder, "results.json", 10) == b"{}"


def test_a_link_is_refused_even_to_a_readable_file(folder, tmp_path):
    (tmp_path / "secret").write_text("outside")
    (folder / "results.json").symlink_to(tmp_path / "secret")
    with pytest.raises(scratch.Refused, match="symbolic link"):
        scratch.read(folder, "results.json", 100)


def test_a_named_pipe_is_refused_at_once_without_waiting_for_a_writer(folder):
    os.mkfifo(folder / "results.json")
    done = []
    reader = threading.Thread(
        target=lambda: done.append(
            pytest.raises(  # noqa: RUF061 - the legacy form: a call in a thread, no `with` block to put it in
                scratch.Refused,
                scratch.read,
                folder,
                "results.json",
                100,
            )
        )
    )
    reader.start()
    reader.join(5)
    assert done and not reader.is_alive()


def test_a_file_larger_than_the_cap_is_refused(folder):
    (folder / "results.json").write_bytes(b"x" * 101)
    with pytest.raises(scratch.Refused, match="larger"):
        scratch.read(folder, "results.json", 100)


def test_the_folder_itself_may_not_be_a_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "results.json").write_text("{}")
    (tmp_path / "linked").symlink_to(real, target_is_directory=True)
    with pytest.raises(OSError):
        scratch.read(tmp_path / "linked", "results.json", 100)


def test_create_never_writes_through_a_name_that_is_there(folder, tmp_path):
    (folder / "key.json").symlink_to(tmp_path / "made-elsewhere")  # dangling
    with pytest.raises(FileExistsError):
        scratch.create(folder, "key.json", b"secret")
    assert not (tmp_path / "made-elsewhere").exists()


def test_empty_removes_dangling_links_pipes_and_locked_folders_following_nothing(folder, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (folder / "run.log").symlink_to(tmp_path / "planted.pth")
    (folder / "to-outside").symlink_to(outside, target_is_directory=True)
    os.mkfifo(folder / "pipe")
    locked = folder / "locked"
    (locked / "deep").mkdir(parents=True)
    (locked / "deep" / "f").write_text("x")
    locked.chmod(0)
    scratch.empty(folder)
    assert list(folder.iterdir()) == []
    assert (outside / "keep.txt").read_text() == "mine" and not (tmp_path / "planted.pth").exists()


def test_a_link_in_place_of_the_folder_is_removed_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (tmp_path / "scratch").symlink_to(outside, target_is_directory=True)
    scratch.empty(tmp_path / "scratch")
    assert (tmp_path / "scratch").is_dir() and not (tmp_path / "scratch").is_symlink()
    assert (outside / "keep.txt").read_text() == "mine"


def test_usage_adds_up_the_disk_each_file_takes(folder):
    (folder / "a").write_bytes(b"\1" * (1 << 20))
    (folder / "sub").mkdir()
    (folder / "sub" / "b").write_bytes(b"\1" * (2 << 20))
    assert 3 << 20 <= scratch.usage(folder) < (3 << 20) + (1 << 16)


def test_usage_never_counts_through_a_link(folder, tmp_path):
    (tmp_path / "big-elsewhere").write_bytes(b"\1" * (4 << 20))
    (tmp_path / "folder-elsewhere").mkdir()
    (tmp_path / "folder-elsewhere" / "big").write_bytes(b"\1" * (4 << 20))
    (folder / "file-link").symlink_to(tmp_path / "big-elsewhere")
    (folder / "folder-link").symlink_to(tmp_path / "folder-elsewhere", target_is_directory=True)
    assert scratch.usage(folder) < 1 << 20


def test_usage_counts_a_file_with_several_names_once_and_a_sparse_file_by_what_it_holds(folder):
    (folder / "a").write_bytes(b"\1" * (2 << 20))
    os.link(folder / "a", folder / "b")
    with open(folder / "sparse", "wb") as f:
        f.truncate(10 << 30)
    assert 2 << 20 <= scratch.usage(folder) < 3 << 20


def test_usage_opens_up_a_folder_made_unreadable(folder):
    hidden = folder / "hidden"
    hidden.mkdir()
    (hidden / "big").write_bytes(b"\1" * (2 << 20))
    hidden.chmod(0)
    assert scratch.usage(folder) >= 2 << 20


def test_usage_stops_once_past_the_limit(folder):
    for i in range(4):
        (folder / f"f{i}").write_bytes(b"\1" * (1 << 20))
    assert (1 << 20) < scratch.usage(folder, limit=1 << 20) < 4 << 20


def test_usage_refuses_folders_nested_too_deep_to_measure(folder):
    deep = folder.joinpath(*["d"] * (scratch.MAX_DEPTH + 2))
    deep.mkdir(parents=True)
    with pytest.raises(scratch.Refused, match="nested"):
        scratch.usage(folder)


def test_usage_counts_every_name_so_a_flood_of_empty_files_is_not_free(folder):
    for i in range(1000):
        (folder / f"empty-{i}").touch()
    assert scratch.usage(folder) >= 1000 * scratch.NAME_COST
