"""Lineage: which code, data and environment made a run.

Digests of declared data inputs (:func:`digest_input`), the notebook, training function
and git state (:func:`code_version`), and the versions a process runs with
(:func:`environment`, :func:`pip_freeze`). Every digest is a SHA-256 (FIPS 180-4) in
lower-case hex. Nothing here talks to MLflow; credentials in URLs are masked with
:func:`.redact.mask_url` before anything is returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .redact import mask_url
from .tracking import TAG

__all__ = [
    "CONTENT_DIGEST_LIMIT",
    "CodeVersion",
    "DataInput",
    "code_version",
    "digest_input",
    "environment",
    "pip_freeze",
]

#: Local data up to this many bytes (256 MiB; a directory: its files together) is
#: digested by content; larger local data by its listing (relative paths, sizes and
#: modification times), so a launch never reads gigabytes just to name its inputs.
#: SHA-256 runs at roughly 0.5 to 2 GB/s per core, so content digests stay under a second.
CONTENT_DIGEST_LIMIT = 256 * 2**20
#: A remote listing that takes longer than this (s) gives way to the URI's digest.
_LISTING_TIMEOUT_S = 20.0
_CHUNK = 2**20
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_SOURCE_TYPES = {
    "s3a": "s3",
    "s3n": "s3",
    "gcs": "gs",
    "https": "http",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
    "adl": "azure",
}
# Listing fields that change when an object's content does, most specific first
# (S3 ETag, Google Cloud Storage etag and md5Hash, Hugging Face blob_id, times).
_VERSION_FIELDS = (
    "ETag",
    "etag",
    "md5Hash",
    "blob_id",
    "mtime",
    "LastModified",
    "last_modified",
    "updated",
    "created",
)


@dataclass(frozen=True)
class DataInput:
    """A declared data input and its digest.

    Attributes
    ----------
    name : str
        The name the user gave it (``inputs={"train": ...}``).
    source : str
        Absolute local path, URI (credentials masked), or a description of an in-memory
        value (``"<in-memory ndarray float32 (1797, 64)>"``).
    source_type : str
        ``"local"``, ``"memory"`` (an in-memory value), ``"s3"``, ``"gs"``, ``"http"``,
        ``"azure"``, ``"hf"``, or another URI scheme as written.
    digest : str
        SHA-256, 64 hex characters.
    digest_of : str
        ``"content"``, ``"listing"`` (names, sizes and ETags or modification times) or
        ``"uri"`` (the URI's text: a remote input that could not be listed).
    size_bytes : int or None
        Bytes of content (a directory's files together; an array's buffer); None when
        unknown.
    profile : dict
        Shape and dtype of an array, columns of a DataFrame, file count of a path or
        listing; ``"not_listed"`` says why a remote input was digested by its URI.
    """

    name: str
    source: str
    source_type: str
    digest: str
    digest_of: str
    size_bytes: int | None = None
    profile: dict = field(default_factory=dict)


def _hash_file(sha: Any, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)


def _local_files(root: Path) -> list[tuple[str, Path, os.stat_result]]:
    """(relative posix path, path, stat) of the files under ``root``, sorted by path."""
    if root.is_file():
        return [(root.name, root, root.stat())]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in filenames:
            path = Path(dirpath, filename)
            if path.is_file():
                files.append((path.relative_to(root).as_posix(), path, path.stat()))
    return sorted(files, key=lambda item: item[0])


def _digest_local(name: str, raw: str | os.PathLike[str]) -> DataInput:
    path = Path(raw).expanduser()
    if not path.exists():
        raise ValueError(f"input {name!r}: there is no file or directory at {str(path)!r}.")
    path = path.resolve()
    files = _local_files(path)
    size = sum(stat.st_size for _, _, stat in files)
    sha = hashlib.sha256()
    if size > CONTENT_DIGEST_LIMIT:
        for rel, _, stat in files:
            sha.update(f"{rel}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
        digest_of = "listing"
    elif path.is_file():
        _hash_file(sha, path)  # the file's plain SHA-256, as sha256sum prints it
        digest_of = "content"
    else:
        for rel, file, stat in files:
            sha.update(f"{rel}\0{stat.st_size}\0".encode())
            _hash_file(sha, file)
        digest_of = "content"
    return DataInput(
        name, str(path), "local", sha.hexdigest(), digest_of, size, {"files": len(files)}
    )


def _list_remote(uri: str, protocol: str) -> tuple[str, int, int]:
    """(digest, total size in bytes, file count) of a remote listing; raises when it cannot."""
    import fsspec

    fs = fsspec.filesystem(protocol)
    root = fs._strip_protocol(uri).rstrip("/")
    found = fs.find(uri, detail=True, withdirs=False)
    if not found:
        raise FileNotFoundError("the listing is empty")
    lines = []
    size = 0
    for path, info in found.items():
        rel = path[len(root) :].lstrip("/") if path.startswith(root) else path
        rel = rel or PurePosixPath(path).name
        version = next((info[k] for k in _VERSION_FIELDS if info.get(k) is not None), "")
        size += int(info.get("size") or 0)
        lines.append(f"{rel}\t{info.get('size')}\t{version}\n")
    sha = hashlib.sha256()
    for line in sorted(lines):
        sha.update(line.encode())
    return sha.hexdigest(), size, len(lines)


def _digest_remote(name: str, uri: str, protocol: str) -> DataInput:
    source = mask_url(uri)
    source_type = _SOURCE_TYPES.get(protocol, protocol)
    reason = "http(s) URLs are not fetched"
    if source_type != "http":
        result: list[Any] = []
        reason = f"listing took longer than {_LISTING_TIMEOUT_S:g} s"

        def list_it() -> None:
            try:
                result.append(_list_remote(uri, protocol))
            except BaseException as exc:  # no driver, no credentials, offline, missing
                result.append(exc)

        # a daemon thread: a listing stuck on the network never holds up the caller
        worker = threading.Thread(target=list_it, name=f"lineage-list-{name}", daemon=True)
        worker.start()
        worker.join(_LISTING_TIMEOUT_S)
        if result and not isinstance(result[0], BaseException):
            digest, size, count = result[0]
            return DataInput(name, source, source_type, digest, "listing", size, {"files": count})
        if result:
            reason = f"{type(result[0]).__name__}: {result[0]}"
    digest = hashlib.sha256(source.encode()).hexdigest()
    return DataInput(name, source, source_type, digest, "uri", None, {"not_listed": reason})


def _digest_array(name: str, value: Any) -> DataInput:
    import numpy as np

    array = np.asarray(value)
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
        array = array.copy(order="C")
    if array.dtype.hasobject:
        raise TypeError(
            f"input {name!r}: an array of Python objects has no stable bytes to digest; "
            "convert it to a numeric or fixed-width string dtype."
        )
    descr = np.lib.format.dtype_to_descr(array.dtype)
    sha = hashlib.sha256(f"ndarray\0{descr!r}\0{array.shape!r}\0".encode())
    try:
        sha.update(memoryview(array).cast("B"))
    except (TypeError, ValueError):  # dtypes the buffer protocol lacks (datetime64)
        sha.update(array.tobytes())
    kind = type(value).__name__
    source = f"<in-memory {kind} {array.dtype} {tuple(array.shape)}>"
    profile = {"shape": list(array.shape), "dtype": str(array.dtype)}
    return DataInput(name, source, "memory", sha.hexdigest(), "content", array.nbytes, profile)


def _digest_pandas(name: str, value: Any) -> DataInput:
    import numpy as np
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        columns, dtypes = [str(c) for c in value.columns], [str(d) for d in value.dtypes]
    else:  # a Series
        columns, dtypes = [str(value.name)], [str(value.dtype)]
    rows = pd.util.hash_pandas_object(value, index=True).to_numpy()  # fixed hash key
    header = f"pandas\0{type(value).__name__}\0{columns!r}\0{dtypes!r}\0{value.shape!r}\0"
    sha = hashlib.sha256(header.encode())
    sha.update(rows.tobytes())
    source = f"<in-memory {type(value).__name__} {tuple(value.shape)}>"
    profile = {"shape": list(value.shape), "columns": columns}
    size = int(np.sum(value.memory_usage(index=True, deep=False)))  # Series: a number
    return DataInput(name, source, "memory", sha.hexdigest(), "content", size, profile)


def _is_dataframe_or_series(value: Any) -> bool:
    if type(value).__module__.split(".")[0] != "pandas":
        return False  # pandas is not imported for other values
    import pandas as pd

    return isinstance(value, (pd.DataFrame, pd.Series))


def digest_input(name: str, value: Any) -> DataInput:
    """Digest one declared data input.

    Parameters
    ----------
    name : str
        The input's name.
    value : array-like, DataFrame, bytes, str, or path
        A NumPy array or anything with ``__array__`` (digest of dtype, shape and
        C-order bytes); a pandas DataFrame or Series (columns, dtypes, shape and
        ``pandas.util.hash_pandas_object`` row hashes, index included); ``bytes``
        (their plain SHA-256); a local file or directory (``~`` expanded; ``file://``
        accepted); or a URI with a scheme (``s3://``, ``gs://``, ``hf://``, ...).

    Returns
    -------
    DataInput
        In-memory values are always digested by content. A local file up to
        :data:`CONTENT_DIGEST_LIMIT` bytes by content (the file's plain SHA-256, as
        ``sha256sum`` prints it); a directory up to it by its files' relative paths,
        sizes and bytes in path order; larger local data by its listing (relative path,
        size, ``st_mtime_ns``). A remote URI by its ``fsspec`` listing (relative name,
        size, ETag or modification time) when the protocol's driver is installed and
        the listing succeeds within 20 s; otherwise, and always for ``http(s)`` (never
        fetched), by the text of the URI with credentials masked (``digest_of="uri"``).

    Raises
    ------
    ValueError
        If a local path does not exist.
    TypeError
        If ``value`` is of none of the kinds above, or an array of Python objects.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        digest = hashlib.sha256(data).hexdigest()
        source = f"<in-memory bytes ({len(data)})>"
        return DataInput(name, source, "memory", digest, "content", len(data), {})
    if isinstance(value, str):
        scheme = _SCHEME.match(value)
        if scheme and scheme[1].lower() != "file":
            return _digest_remote(name, value, scheme[1].lower())
        return _digest_local(name, value[len("file://") :] if scheme else value)
    if isinstance(value, os.PathLike):
        return _digest_local(name, value)
    if _is_dataframe_or_series(value):
        return _digest_pandas(name, value)
    if hasattr(value, "__array__") or type(value).__module__.split(".")[0] == "numpy":
        return _digest_array(name, value)
    raise TypeError(
        f"input {name!r}: expected an array, a DataFrame, bytes, a path or a URI, "
        f"got {type(value).__name__}."
    )


@dataclass(frozen=True)
class CodeVersion:
    """The code a run was launched from.

    Attributes
    ----------
    notebook : str
        Absolute path of the notebook or script; ``""`` when unknown or missing.
    notebook_sha256 : str
        SHA-256 of its file content; ``""`` without a notebook.
    function_sha256 : str
        SHA-256 of the training function's source text (UTF-8); ``""`` without source.
    git_commit, git_branch : str
        HEAD's commit and active branch (``""`` when detached, or outside a repository).
    git_repo : str
        URL of the ``origin`` remote, credentials masked, or else the repository's root
        path; ``""`` outside a repository.
    git_dirty : bool or None
        Whether tracked files differ from HEAD (staged or not; untracked files do not
        count); None outside a repository, or where git refused to run.
    git_diff : str
        ``git diff HEAD`` when dirty, else ``""``.
    """

    notebook: str = ""
    notebook_sha256: str = ""
    function_sha256: str = ""
    git_commit: str = ""
    git_branch: str = ""
    git_repo: str = ""
    git_dirty: bool | None = None
    git_diff: str = ""

    def tags(self) -> dict[str, str]:
        """MLflow tags: MLflow's own ``mlflow.source.git.*`` names (inside a repository)
        and ``trainfactory.code.*``; empty values are left out."""
        dirty = {True: "true", False: "false", None: ""}[self.git_dirty]
        tags = {
            "mlflow.source.git.commit": self.git_commit,
            "mlflow.source.git.branch": self.git_branch,
            "mlflow.source.git.repoURL": self.git_repo,
            TAG.CODE_NOTEBOOK: self.notebook,
            TAG.CODE_NOTEBOOK_SHA256: self.notebook_sha256,
            TAG.CODE_FUNCTION_SHA256: self.function_sha256,
            TAG.CODE_GIT_DIRTY: dirty,
        }
        return {key: value for key, value in tags.items() if value}


def _git_fields(start: Path) -> dict[str, Any]:
    try:
        import git  # GitPython; raises ImportError when the git executable is missing
    except Exception:
        return {}
    try:
        repo = git.Repo(start, search_parent_directories=True)
    except Exception:  # not a repository, or the path vanished
        return {}
    fields: dict[str, Any] = {}
    try:
        try:
            fields["git_commit"] = repo.head.commit.hexsha
        except Exception:  # no commit yet
            fields["git_commit"] = ""
        try:
            fields["git_branch"] = repo.active_branch.name
        except Exception:  # detached HEAD
            fields["git_branch"] = ""
        try:
            fields["git_repo"] = mask_url(repo.remote("origin").url)
        except Exception:  # no origin
            fields["git_repo"] = str(repo.working_tree_dir or repo.git_dir)
        try:
            dirty = repo.is_dirty(untracked_files=False)
        except Exception:  # git refused to run here (safe.directory): unknown
            return fields
        fields["git_dirty"] = dirty
        try:
            fields["git_diff"] = repo.git.diff("HEAD") if dirty else ""
        except Exception:  # no commit to compare with yet
            fields["git_diff"] = ""
    finally:
        repo.close()
    return fields


def code_version(source_path: str, function_source: str) -> CodeVersion:
    """Identify the code of a run.

    Parameters
    ----------
    source_path : str
        Path of the notebook or script that launched it (``~`` expanded); ``""`` or a
        missing file leaves the notebook fields empty.
    function_source : str
        Source text of the training function.

    Returns
    -------
    CodeVersion
        Git fields come from the repository holding the notebook (or the current
        directory without one), found with GitPython; outside a repository, or without
        git, they are empty and ``git_dirty`` is None. Never raises for git trouble.
    """
    notebook = notebook_sha = ""
    start = Path.cwd()
    if source_path:
        path = Path(source_path).expanduser()
        if path.is_file():
            path = path.resolve()
            notebook = str(path)
            sha = hashlib.sha256()
            _hash_file(sha, path)
            notebook_sha = sha.hexdigest()
            start = path.parent
        elif path.parent.is_dir():
            start = path.parent
    function_sha = (
        hashlib.sha256(function_source.encode("utf-8")).hexdigest() if function_source else ""
    )
    return CodeVersion(notebook, notebook_sha, function_sha, **_git_fields(start))


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except Exception:
        return ""


def _nvidia_driver() -> str:
    try:
        import pynvml  # nvidia-ml-py
    except Exception:
        return ""
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU
        return ""
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return ""
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def environment() -> dict[str, str]:
    """Versions the current process runs with (meant to run on a Ray worker).

    Returns
    -------
    dict of str to str
        ``python``, ``ray``, ``torch``, ``cuda`` (the CUDA runtime PyTorch was built
        with), ``cudnn``, ``nvidia_driver`` (from NVML) and ``platform``; ``""`` for what
        is not installed or not available. Never raises; imports PyTorch only when it is
        installed, and never imports Ray.
    """
    env = {
        "python": platform.python_version(),
        "ray": _version("ray"),
        "torch": _version("torch"),
        "cuda": "",
        "cudnn": "",
        "nvidia_driver": _nvidia_driver(),
        "platform": "",
    }
    with contextlib.suppress(Exception):
        env["platform"] = platform.platform()
    if env["torch"]:
        try:
            import torch

            env["cuda"] = str(torch.version.cuda or "")
            cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            env["cudnn"] = str(cudnn) if cudnn else ""
        except Exception:
            pass
    return env


def _distributions() -> Iterator[tuple[str, importlib.metadata.Distribution]]:
    seen = set()
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            continue
        if not name:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()  # PEP 503 normalized name
        if key not in seen:  # the first on sys.path is the one imported
            seen.add(key)
            yield name, dist


def _direct_url(dist: importlib.metadata.Distribution) -> str:
    """The URL of a direct-URL install (PEP 610 ``direct_url.json``), else ``""``."""
    try:
        text = dist.read_text("direct_url.json")
        info = json.loads(text) if text else None
        url = info["url"] if isinstance(info, dict) else ""
        vcs = info.get("vcs_info") if url else None
        if isinstance(vcs, dict) and vcs.get("vcs"):
            url = f"{vcs['vcs']}+{url}"
            if vcs.get("commit_id"):
                url = f"{url}@{vcs['commit_id']}"
        return url if isinstance(url, str) else ""
    except Exception:
        return ""


def pip_freeze() -> str:
    """The installed distributions, as ``pip freeze`` lists them.

    Returns
    -------
    str
        One line per distribution visible on ``sys.path`` (the first of a name wins),
        sorted case-insensitively: ``name==version``, or ``name @ URL`` for a direct-URL
        install (PEP 610), every line with credentials masked by
        :func:`.redact.mask_url`; a final newline. Read from ``importlib.metadata``;
        no subprocess.
    """
    lines = []
    for name, dist in _distributions():
        url = _direct_url(dist)
        lines.append(mask_url(f"{name} @ {url}" if url else f"{name}=={dist.version}"))
    lines.sort(key=str.lower)
    return "".join(f"{line}\n" for line in lines)
