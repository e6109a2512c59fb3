"""Checkpoint manifests (no Ray): written, verified, and damage named in one sentence."""

import json

from ray_backend.checkpoints import MANIFEST, verify, write_manifest


def _checkpoint(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"w" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "optim.pt").write_bytes(b"o" * 10)
    return tmp_path


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    manifest = write_manifest(_checkpoint(tmp_path))
    assert manifest["bytes"] == 1010
    assert sorted(manifest["files"]) == ["model.pt", "sub/optim.pt"]
    assert manifest["files"]["model.pt"]["bytes"] == 1000
    assert json.loads((tmp_path / MANIFEST).read_text()) == manifest
    assert verify(tmp_path) is None


def test_damage_is_named(tmp_path):
    write_manifest(_checkpoint(tmp_path))
    with open(tmp_path / "model.pt", "r+b") as f:
        f.truncate(10)
    assert verify(tmp_path) == "model.pt has 10 bytes, the manifest says 1000"
    (tmp_path / "model.pt").write_bytes(b"x" * 1000)  # same size, other content
    assert verify(tmp_path) == "model.pt does not match its SHA-256"
    (tmp_path / "sub" / "optim.pt").unlink()
    write_manifest(tmp_path)
    assert verify(tmp_path) is None
    (tmp_path / "model.pt").unlink()
    assert verify(tmp_path) == "model.pt is missing"


def test_no_or_bad_manifest(tmp_path):
    assert verify(tmp_path) == "it has no manifest"
    (tmp_path / MANIFEST).write_text("{not json")
    assert verify(tmp_path).startswith("its manifest cannot be read")
