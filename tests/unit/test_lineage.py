"""Lineage (lineage): data digests, code versions, environment and pip freeze."""

import hashlib
import importlib.metadata
import json
import os
import platform
import sys

import fsspec
import git
import numpy as np
import pandas as pd
import pytest

from jupyter_trainfactory import lineage
from jupyter_trainfactory.lineage import (
    CONTENT_DIGEST_LIMIT,
    CodeVersion,
    DataInput,
    code_version,
    digest_input,
    environment,
    pip_freeze,
)

# ---------------------------------------------------------------- data inputs


def test_content_digest_limit_is_256_mib():
    assert CONTENT_DIGEST_LIMIT == 256 * 2**20


def test_equal_arrays_share_a_digest_and_one_element_changes_it():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    first = digest_input("train", a)
    assert isinstance(first, DataInput)
    assert first == digest_input("train", a.copy())
    assert first.digest_of == "content" and first.source_type == "memory"
    assert len(first.digest) == 64 and int(first.digest, 16) >= 0
    assert first.size_bytes == 48
    assert first.profile == {"shape": [3, 4], "dtype": "float32"}
    b = a.copy()
    b[2, 3] += 1
    assert digest_input("train", b).digest != first.digest


def test_array_digest_depends_on_dtype_and_shape_not_memory_order():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    digests = {
        digest_input("x", a).digest,
        digest_input("x", a.astype(np.float64)).digest,
        digest_input("x", a.reshape(4, 3)).digest,
        digest_input("x", a.reshape(12)).digest,
    }
    assert len(digests) == 4
    fortran = np.asfortranarray(a)
    assert digest_input("x", fortran).digest == digest_input("x", a).digest
    assert digest_input("x", a[:, ::2]).digest == digest_input("x", a[:, ::2].copy()).digest
    scalar = digest_input("x", np.array(5))
    assert scalar.profile == {"shape": [], "dtype": "int64"}
    assert scalar.digest != digest_input("x", np.array([5])).digest


def test_array_likes_and_object_arrays():
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.array([1, 2, 3], dtype=np.int16)

    assert (
        digest_input("x", ArrayLike()).digest
        == digest_input("x", np.array([1, 2, 3], np.int16)).digest
    )
    with pytest.raises(TypeError, match="objects"):
        digest_input("x", np.array([{"a": 1}], dtype=object))
    with pytest.raises(TypeError, match="expected an array"):
        digest_input("x", [1, 2, 3])


def test_dataframes_digest_by_content():
    df = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5]})
    first = digest_input("df", df)
    assert first.digest == digest_input("df", df.copy()).digest
    assert first.profile == {"shape": [3, 2], "columns": ["a", "b"]}
    changed = df.copy()
    changed.loc[1, "b"] = 9.0
    renamed = df.rename(columns={"b": "c"})
    assert (
        len({first.digest, digest_input("df", changed).digest, digest_input("df", renamed).digest})
        == 3
    )
    series = digest_input("s", df["a"])
    assert series.digest_of == "content" and series.digest != first.digest
    assert series.profile == {"shape": [3], "columns": ["a"]} and series.size_bytes > 0
    assert digest_input("s", df["a"].rename("z")).digest != series.digest


def test_bytes_digest_is_their_sha256_and_equals_a_file_with_them(tmp_path):
    data = b"hello lineage"
    assert digest_input("b", data).digest == hashlib.sha256(data).hexdigest()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    file_input = digest_input("f", path)
    assert file_input.digest == hashlib.sha256(data).hexdigest()
    assert file_input.source == str(path.resolve()) and file_input.source_type == "local"
    assert file_input.size_bytes == len(data) and file_input.profile == {"files": 1}


def test_files_differ_by_content_and_str_tilde_and_file_uri_are_paths(tmp_path, monkeypatch):
    (tmp_path / "a.csv").write_text("1,2\n")
    (tmp_path / "b.csv").write_text("1,3\n")
    a = digest_input("a", str(tmp_path / "a.csv"))
    assert a.digest != digest_input("b", tmp_path / "b.csv").digest
    assert digest_input("a", f"file://{tmp_path / 'a.csv'}").digest == a.digest
    monkeypatch.setenv("HOME", str(tmp_path))
    assert digest_input("a", "~/a.csv") == a


def test_missing_local_path_raises_one_sentence(tmp_path):
    with pytest.raises(ValueError, match=r"^input 'train': there is no file or directory at .*\.$"):
        digest_input("train", tmp_path / "nope")


def _make_dir(root):
    (root / "sub").mkdir(parents=True)
    (root / "x.txt").write_text("x")
    (root / "sub" / "y.txt").write_text("y")
    return root


def test_directories_digest_by_paths_and_bytes(tmp_path):
    one = _make_dir(tmp_path / "one")
    two = _make_dir(tmp_path / "two")
    first = digest_input("d", one)
    assert first.digest == digest_input("d", two).digest  # same tree elsewhere
    assert first.digest_of == "content" and first.profile == {"files": 2} and first.size_bytes == 2
    (two / "sub" / "y.txt").rename(two / "sub" / "z.txt")
    renamed = digest_input("d", two).digest
    assert renamed != first.digest
    (two / "sub" / "z.txt").write_text("z")
    assert digest_input("d", two).digest not in {first.digest, renamed}


def test_local_data_above_the_limit_is_digested_by_listing(tmp_path, monkeypatch):
    monkeypatch.setattr(lineage, "CONTENT_DIGEST_LIMIT", 4)
    path = tmp_path / "big.bin"
    path.write_bytes(b"0123456789")
    first = digest_input("big", path)
    assert first.digest_of == "listing" and first.size_bytes == 10
    assert first.digest != hashlib.sha256(b"0123456789").hexdigest()
    assert digest_input("big", path).digest == first.digest
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert digest_input("big", path).digest != first.digest
    small = tmp_path / "small.bin"
    small.write_bytes(b"0123")
    assert digest_input("small", small).digest_of == "content"  # at the limit


def test_remote_uri_listed_with_fsspec(tmp_path):
    fs = fsspec.filesystem("memory")
    root = f"memory://lineage-test-{os.getpid()}"
    try:
        fs.pipe({f"{root}/d/a.txt": b"a", f"{root}/d/sub/b.txt": b"bb"})
        first = digest_input("r", f"{root}/d")
        assert (first.digest_of, first.source_type) == ("listing", "memory")
        assert first.size_bytes == 3 and first.profile == {"files": 2}
        assert digest_input("r", f"{root}/d/").digest == first.digest
        fs.pipe(f"{root}/d/sub/b.txt", b"bbb")
        assert digest_input("r", f"{root}/d").digest != first.digest
        missing = digest_input("r", f"{root}/nothing")
        assert missing.digest_of == "uri" and "FileNotFoundError" in missing.profile["not_listed"]
    finally:
        fs.rm(root, recursive=True)


@pytest.mark.parametrize(
    ("uri", "source_type"),
    [
        ("https://u:pw@example.com/data.csv?token=abc", "http"),
        ("http://example.com/data.csv", "http"),
        ("nosuchproto://bucket/key", "nosuchproto"),
    ],
)
def test_remote_uris_that_cannot_be_listed_digest_their_text(uri, source_type):
    first = digest_input("r", uri)
    assert (first.digest_of, first.source_type, first.size_bytes) == ("uri", source_type, None)
    assert first.digest == hashlib.sha256(first.source.encode()).hexdigest()
    assert "pw" not in first.source and "abc" not in first.source
    assert digest_input("r", uri).digest == first.digest
    other = uri.replace("example.com/", "example.com/v2/").replace("//bucket", "//bucket2")
    assert digest_input("r", other).digest != first.digest


def test_a_driver_that_is_not_installed_gives_the_uri_digest(monkeypatch):
    def no_driver(protocol, **kwargs):
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec, "filesystem", no_driver)
    first = digest_input("r", "s3://bucket/prefix")
    assert (first.digest_of, first.source_type) == ("uri", "s3")
    assert "s3fs" in first.profile["not_listed"]


def test_a_listing_that_hangs_gives_way_to_the_uri_digest(monkeypatch):
    import threading

    release = threading.Event()

    def hang(protocol, **kwargs):
        release.wait(5)
        raise TimeoutError

    monkeypatch.setattr(fsspec, "filesystem", hang)
    monkeypatch.setattr(lineage, "_LISTING_TIMEOUT_S", 0.05)
    try:
        first = digest_input("r", "gs://bucket/prefix")
    finally:
        release.set()
    assert (first.digest_of, first.source_type) == ("uri", "gs")
    assert "longer than" in first.profile["not_listed"]


# ---------------------------------------------------------------- code versions


def _repo(path):
    path.mkdir()
    repo = git.Repo.init(path)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test")
        config.set_value("user", "email", "test@example.com")
    (path / "train.ipynb").write_text('{"cells": []}\n')
    repo.index.add(["train.ipynb"])
    repo.index.commit("first")
    return repo


def test_code_version_of_a_clean_then_dirty_repo(tmp_path):
    repo = _repo(tmp_path / "repo")
    notebook = tmp_path / "repo" / "train.ipynb"
    clean = code_version(str(notebook), "def train(config):\n    pass\n")
    assert clean.notebook == str(notebook.resolve())
    assert clean.notebook_sha256 == hashlib.sha256(notebook.read_bytes()).hexdigest()
    assert clean.function_sha256 == hashlib.sha256(b"def train(config):\n    pass\n").hexdigest()
    assert clean.git_commit == repo.head.commit.hexsha
    assert clean.git_branch == repo.active_branch.name
    assert clean.git_repo == str(tmp_path / "repo")
    assert clean.git_dirty is False and clean.git_diff == ""
    (tmp_path / "repo" / "untracked.txt").write_text("u")
    assert code_version(str(notebook), "").git_dirty is False  # untracked does not count
    notebook.write_text('{"cells": ["changed"]}\n')
    dirty = code_version(str(notebook), "")
    assert dirty.git_dirty is True
    assert '+{"cells": ["changed"]}' in dirty.git_diff
    assert dirty.notebook_sha256 != clean.notebook_sha256
    assert dirty.function_sha256 == ""


def test_code_version_tags(tmp_path):
    _repo(tmp_path / "repo")
    version = code_version(str(tmp_path / "repo" / "train.ipynb"), "src")
    tags = version.tags()
    assert tags == {
        "mlflow.source.git.commit": version.git_commit,
        "mlflow.source.git.branch": version.git_branch,
        "mlflow.source.git.repoURL": version.git_repo,
        "trainfactory.code.notebook": version.notebook,
        "trainfactory.code.notebook_sha256": version.notebook_sha256,
        "trainfactory.code.function_sha256": version.function_sha256,
        "trainfactory.code.git_dirty": "false",
    }
    assert CodeVersion(function_sha256="ab").tags() == {"trainfactory.code.function_sha256": "ab"}


def test_detached_head_has_no_branch(tmp_path):
    repo = _repo(tmp_path / "repo")
    repo.git.checkout(repo.head.commit.hexsha)
    version = code_version(str(tmp_path / "repo" / "train.ipynb"), "")
    assert version.git_branch == "" and version.git_commit == repo.head.commit.hexsha
    assert "mlflow.source.git.branch" not in version.tags()


def test_origin_url_has_its_password_masked(tmp_path):
    repo = _repo(tmp_path / "repo")
    repo.create_remote("origin", "https://alice:s3cret@git.example.com/team/models.git")
    version = code_version(str(tmp_path / "repo" / "train.ipynb"), "")
    assert version.git_repo == "https://alice:***@git.example.com/team/models.git"


def test_repository_found_from_a_subdirectory_and_from_the_cwd(tmp_path, monkeypatch):
    repo = _repo(tmp_path / "repo")
    (tmp_path / "repo" / "nb").mkdir()
    (tmp_path / "repo" / "nb" / "n.py").write_text("print(1)\n")
    assert (
        code_version(str(tmp_path / "repo" / "nb" / "n.py"), "").git_commit
        == repo.head.commit.hexsha
    )
    monkeypatch.chdir(tmp_path / "repo" / "nb")
    from_cwd = code_version("", "")
    assert from_cwd.notebook == "" and from_cwd.notebook_sha256 == ""
    assert from_cwd.git_commit == repo.head.commit.hexsha


def test_outside_a_repository_git_fields_are_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    script = tmp_path / "plain" / "s.py"
    script.parent.mkdir()
    script.write_text("x = 1\n")
    version = code_version(str(script), "f")
    assert version.notebook == str(script.resolve())
    assert (version.git_commit, version.git_branch, version.git_repo) == ("", "", "")
    assert version.git_dirty is None and version.git_diff == ""
    assert set(version.tags()) == {
        "trainfactory.code.notebook",
        "trainfactory.code.notebook_sha256",
        "trainfactory.code.function_sha256",
    }
    missing = code_version(str(tmp_path / "plain" / "gone.ipynb"), "f")
    assert missing.notebook == "" and missing.notebook_sha256 == ""
    assert missing.git_dirty is None


# ---------------------------------------------------------------- environment


def test_environment_reports_versions_as_strings():
    env = environment()
    assert set(env) == {"python", "ray", "torch", "cuda", "cudnn", "nvidia_driver", "platform"}
    assert all(isinstance(v, str) for v in env.values())
    assert env["python"] == platform.python_version()
    assert env["platform"] == platform.platform()
    assert env["ray"] == importlib.metadata.version("ray")
    assert env["torch"] == importlib.metadata.version("torch")


def test_environment_without_torch_or_nvml(monkeypatch):
    real_version = importlib.metadata.version

    def version(name):
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    env = environment()
    assert (env["torch"], env["cuda"], env["cudnn"], env["nvidia_driver"]) == ("", "", "", "")


# ---------------------------------------------------------------- pip freeze


def _fake_dist(site, name, version, direct_url=None):
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_pip_freeze_lists_installed_versions_sorted():
    frozen = pip_freeze()
    lines = frozen.splitlines()
    assert frozen.endswith("\n")
    assert f"mlflow=={importlib.metadata.version('mlflow')}" in lines
    assert lines == sorted(lines, key=str.lower)
    names = [line.split("==")[0].split(" @ ")[0].lower().replace("_", "-") for line in lines]
    assert len(names) == len(set(names))


def test_pip_freeze_masks_direct_urls_and_keeps_the_first_of_a_name(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _fake_dist(
        site, "zz-fake-wheel", "1.0", {"url": "https://u:pw@host/pkg.whl", "archive_info": {}}
    )
    _fake_dist(
        site,
        "zz_fake_vcs",
        "0.1",
        {
            "url": "https://tok@github.com/o/r.git",
            "vcs_info": {"vcs": "git", "commit_id": "abc123"},
        },
    )
    _fake_dist(site, "zz-fake-plain", "2.0")
    shadowed = tmp_path / "later"
    _fake_dist(shadowed, "zz-fake-plain", "1.0")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path, str(shadowed)])
    lines = pip_freeze().splitlines()
    assert "zz-fake-wheel @ https://u:***@host/pkg.whl" in lines
    assert "zz_fake_vcs @ git+https://***@github.com/o/r.git@abc123" in lines
    assert "zz-fake-plain==2.0" in lines and "zz-fake-plain==1.0" not in lines
    assert "pw" not in "".join(line for line in lines if line.startswith("zz"))
