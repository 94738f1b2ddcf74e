import os
import stat

from gptforge.atomic import (
    atomic_copy,
    atomic_write_json,
    atomic_write_text,
    default_mode,
)


def test_atomic_writes_leave_no_temp_files_and_usual_modes(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "héllo")
        atomic_write_json(tmp_path / "b.json", {"x": "ü"})
        atomic_copy(tmp_path / "a.txt", tmp_path / "c.txt")
        private = tmp_path / "w.safetensors"
        private.write_bytes(b"x")
        os.chmod(private, 0o600)  # as safetensors writes it
        default_mode(private)
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").read_text() == "héllo" == (tmp_path / "c.txt").read_text()
    assert (tmp_path / "b.json").read_text() == '{\n  "x": "ü"\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json", "c.txt", "w.safetensors"]
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
