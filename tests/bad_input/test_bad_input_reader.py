"""The one reader (issue 37, item 2): ``mismatch_ctrl.regular_files`` reads regular files only, refusing a FIFO, a
device, a socket or a directory by name at once (a FIFO never opened for reading), bounded in size, UTF-8 where text;
each test would fail (or hang, which the deadline turns into a failure) without the rule it names."""

from __future__ import annotations

import hashlib
import re
import os
import socket
import stat

import pytest
from no_hang import make_fifo, within_deadline

from mismatch_ctrl import regular_files
from mismatch_ctrl.regular_files import FileRefused


def test_a_regular_file_reads_as_it_is(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b'{"x": "\xc3\xa9"}')
    assert regular_files.read_bytes(path) == b'{"x": "\xc3\xa9"}'
    assert regular_files.read_text(path) == '{"x": "é"}'
    assert regular_files.read_json(path) == {"x": "é"}
    assert regular_files.sha256_of(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert regular_files.read_json(link) == {"x": "é"}  # a link to a regular file is that file


@pytest.mark.parametrize("read", [regular_files.read_bytes, regular_files.read_text, regular_files.read_json,
                                  regular_files.sha256_of, regular_files.regular_file])
def test_a_fifo_is_refused_by_name_at_once_never_opened(tmp_path, read):
    fifo = make_fifo(tmp_path / "metrics.jsonl")
    with pytest.raises(FileRefused) as caught:
        within_deadline(lambda: read(fifo), [fifo])
    assert str(caught.value) == f"{fifo}: a FIFO (named pipe), not a regular file"
    assert caught.value.filename == str(fifo) and isinstance(caught.value, OSError)


def test_a_link_to_a_fifo_is_the_fifo(tmp_path):
    fifo = make_fifo(tmp_path / "pipe")
    link = tmp_path / "config.json"
    link.symlink_to(fifo)
    with pytest.raises(FileRefused, match="a FIFO"):
        within_deadline(lambda: regular_files.read_text(link), [fifo])


def test_a_path_swapped_for_a_fifo_after_the_check_is_refused_on_the_open_descriptor(tmp_path, monkeypatch):
    """The second check: the path passes ``os.stat`` as a regular file, then is a FIFO when it is opened. Opened
    without blocking (O_NONBLOCK), refused on ``fstat``."""
    fifo = make_fifo(tmp_path / "summary.json")
    real = tmp_path / "real"
    real.write_text("{}")
    looks_regular = os.stat(real)
    monkeypatch.setattr(regular_files, "regular_file", lambda path: looks_regular)
    with pytest.raises(FileRefused, match="a FIFO"):
        within_deadline(lambda: regular_files.read_bytes(fifo), [fifo])


@pytest.mark.parametrize("device, kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_a_device_is_refused_never_read(device, kind):
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    with pytest.raises(FileRefused, match=f"{device}: {kind}, not a regular file"):
        within_deadline(lambda: regular_files.read_bytes(device), [])


def test_a_directory_named_as_a_file_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(FileRefused, match="config.json: a directory, not a regular file"):
        regular_files.read_json(tmp_path / "config.json")


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        with pytest.raises(FileRefused, match="a socket"):
            regular_files.read_text(path)
    finally:
        server.close()


def test_missing_stays_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        regular_files.read_text(tmp_path / "absent")
    broken = tmp_path / "broken"
    broken.symlink_to(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        regular_files.read_text(broken)


def test_size_is_bounded_without_reading_more(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    assert regular_files.read_bytes(path, limit=101) == b"x" * 101
    with pytest.raises(FileRefused, match="larger than 100 bytes"):
        regular_files.read_bytes(path, limit=100)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:  # 1 TiB on paper, nothing on disk: must be refused, not read
        f.truncate(1 << 40)
    with pytest.raises(FileRefused, match="larger than 64 MiB"):
        regular_files.read_text(sparse)


def test_text_that_is_not_utf8_is_named_with_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(FileRefused, match=r"latin1.yaml: not UTF-8 text \(byte 9: b'\\xe9\\n'\)"):
        regular_files.read_text(path)


def test_write_atomic_replaces_a_fifo_never_opening_it(tmp_path):
    fifo = make_fifo(tmp_path / "report.md")
    within_deadline(lambda: regular_files.write_atomic(fifo, b"# report\n"), [fifo])
    assert fifo.read_bytes() == b"# report\n" and stat.S_ISREG(os.stat(fifo).st_mode)
    assert stat.S_IMODE(os.stat(fifo).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary file left


# Every place that reads a file a user or a run left reads it through the one reader: a FIFO, a device or a
# directory where the file belongs is named, never waited on (each would hang or be read forever without it).
NOT_FILES = {"fifo": (make_fifo, "a FIFO (named pipe)"),
             "dev/zero": (lambda p: p.symlink_to("/dev/zero"), "a character device"),
             "directory": (lambda p: p.mkdir(), "a directory")}


@pytest.mark.parametrize("kind, given", [("fifo", "file"), ("fifo", "model directory"), ("dev/zero", "file"),
                                         ("dev/zero", "model directory"), ("directory", "file")])
def test_check_config_hf_config_names_what_is_no_file(tmp_path, capsys, kind, given):
    from mismatch_ctrl.cli import main
    make, what = NOT_FILES[kind]
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    make(config)
    path = config if given == "file" else model
    code = within_deadline(lambda: main(["check-config", "configs/methods/dcgrpo.yaml", "--hf-config", str(path)]),
                           [config])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot read the Hugging Face config {config} ({what}, not a regular file)" in err, err


@pytest.mark.parametrize("kind", ["fifo", "dev/zero"])
def test_on_megatron_init_reads_the_checkpoints_config_json_through_the_reader(tmp_path, kind):
    from slime_data import make_args, method

    from mismatch_ctrl.errors import ConfigError
    from mismatch_ctrl.slime import hooks
    make, what = NOT_FILES[kind]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    make(checkpoint / "config.json")
    args = make_args(method("dcgrpo"), num_experts=None, hf_checkpoint=str(checkpoint))
    with pytest.raises(ConfigError, match=re.escape(f"config.json ({what}, not a regular file)")):
        within_deadline(lambda: hooks.on_megatron_init(args), [checkpoint / "config.json"])


@pytest.mark.parametrize("kind", ["fifo", "dev/zero"])
def test_a_state_file_that_is_no_file_is_named_on_resume(tmp_path, kind):
    from test_bad_input_corpus import resume, saved_run

    from mismatch_ctrl.errors import StateError
    make, what = NOT_FILES[kind]
    path = saved_run(tmp_path)
    path.unlink()
    make(path)
    with pytest.raises(StateError, match=re.escape(f"state_0000002.json: not a regular file ({what})")):
        within_deadline(lambda: resume(tmp_path), [path])


def test_the_state_store_reads_through_the_reader_even_past_its_check(tmp_path, monkeypatch):
    """The state file swapped for a FIFO after the store looked at it: the read itself refuses it."""
    from test_bad_input_corpus import saved_run

    from mismatch_ctrl.errors import StateError
    from mismatch_ctrl.state import StateStore
    path = saved_run(tmp_path)
    path.unlink()
    make_fifo(path)
    monkeypatch.setattr(regular_files, "what_is", lambda p: None)
    with pytest.raises(StateError, match=r"unreadable mismatch_ctrl state \(a FIFO \(named pipe\), not a regular file"):
        within_deadline(lambda: StateStore(path.parent).load(2), [path])


@pytest.mark.parametrize("kind", list(NOT_FILES))
def test_a_method_yaml_that_is_no_file_is_named(tmp_path, kind):
    from mismatch_ctrl.config import load_config
    from mismatch_ctrl.errors import ConfigError
    make, what = NOT_FILES[kind]
    path = tmp_path / "method.yaml"
    make(path)
    needle = "is a directory" if kind == "directory" else f"{what}, not a regular file"
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {needle}; give the method YAML")):
        within_deadline(lambda: load_config(path), [path])


def test_a_warm_up_cache_that_is_a_fifo_is_trained_again_never_waited_on(tmp_path):
    from sweep_helpers import TINY_WARMUP

    from mismatch_ctrl.lab.model.warmup import cache_path, warmup_policy
    fifo = make_fifo(cache_path(TINY_WARMUP, tmp_path))
    said: list[str] = []
    result = within_deadline(lambda: warmup_policy(TINY_WARMUP, cache_dir=tmp_path, log=said.append), [fifo])
    assert not result.from_cache and any("a FIFO (named pipe), not a regular file); training again" in s for s in said)
    assert fifo.is_file()  # the trained warm-up replaced it
    assert warmup_policy(TINY_WARMUP, cache_dir=tmp_path).from_cache


@pytest.mark.parametrize("content, needle", [(b"7" * 65, "longer than Megatron's tracker"), (b"7\n", None)])
def test_the_tracker_is_read_bounded(tmp_path, content, needle):
    from mismatch_ctrl.errors import StateError
    from mismatch_ctrl.slime.names import read_tracker
    path = tmp_path / "latest_checkpointed_iteration.txt"
    path.write_bytes(content)
    if needle is None:
        assert read_tracker(path) == 7
    else:
        with pytest.raises(StateError, match=needle):
            read_tracker(path)
