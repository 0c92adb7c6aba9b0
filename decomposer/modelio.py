"""Reading and writing model files safely.

In: a path to an ``.onnx`` file (possibly with external-data files beside it).
Out: ``load_model`` gives a ``ModelProto`` whose external weights are *not* read (only
their references), plus the folder they live in; ``save_model`` writes a model atomically,
streaming any external weights from the input's data files into a fresh data file next to
the output.

Guarantees:
- Bad input raises :class:`InvalidModelError` with one line that says what is wrong.
- External-data locations must stay inside the model's folder: absolute paths, ``..``,
  symlinks and hard-linked files are refused. A tensor that sets both inline data and an
  external location is refused.
- Writes go to a temporary file in the target folder, are fsynced, and are moved into
  place with ``os.replace``, data file first and model file last, so a failed run leaves an
  existing output untouched and never leaves a half-written file. The input's data files
  are only read.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto

from decomposer.errors import InvalidModelError, ModelIOError
from decomposer.graphs import all_graphs, may_hold

_COPY_CHUNK = 16 << 20
_WRITEBACK_CHUNK = 64 << 20


LARGE_INLINE = 1024  # bytes (onnx.save's size_threshold): an inline initializer this big goes
# to the data file, when the model has one


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse ``path`` without reading external weights; raise InvalidModelError if unusable."""
    source = Path(path)
    if not source.exists():
        raise InvalidModelError(f"{source}: no such file")
    if source.is_dir():
        raise InvalidModelError(f"{source}: is a directory, expected an .onnx file")
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise InvalidModelError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    if not data:
        raise InvalidModelError(f"{source}: file is empty")
    try:
        model = onnx.ModelProto()
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else "truncated or corrupt"
        raise InvalidModelError(f"{source}: not an ONNX model (protobuf parse failed: "
                                f"{detail})") from exc
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InvalidModelError(f"{source}: not an ONNX model (no ir_version or no graph)")
    for tensor in external_tensors(model):
        _check_external_reference(tensor, source.parent)
    return model


def external_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor in the model that stores its data in an external file."""
    for tensor in _all_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL:
            yield tensor


_HOLDERS = frozenset({AttributeProto.TENSOR, AttributeProto.TENSORS, AttributeProto.GRAPH,
                      AttributeProto.GRAPHS})


def _all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Initializers (of every graph, outer first), then tensor attributes (graph by graph,
    then the functions' own nodes): one walk of the model's nodes, for a large model."""
    graphs: list[onnx.GraphProto] = []
    held: list[list[TensorProto]] = []  # tensor attributes, per graph in ``graphs``

    def add_graph(graph: onnx.GraphProto) -> None:
        index = len(graphs)
        graphs.append(graph)
        held.append([])  # its slot, before the graphs nested in it take theirs
        held[index] = visit(graph.node)

    def visit(nodes: Iterable[onnx.NodeProto]) -> list[TensorProto]:
        found: list[TensorProto] = []
        for node in nodes:
            if not node.attribute or not may_hold(node.domain, node.op_type, _HOLDERS):
                continue
            for attr in node.attribute:
                kind = attr.type
                if kind == AttributeProto.TENSOR:
                    found.append(attr.t)
                elif kind == AttributeProto.TENSORS:
                    found.extend(attr.tensors)
                elif kind == AttributeProto.GRAPH:
                    add_graph(attr.g)
                elif kind == AttributeProto.GRAPHS:
                    for graph in attr.graphs:
                        add_graph(graph)
        return found

    add_graph(model.graph)
    in_functions = [visit(function.node) for function in model.functions]
    for graph in graphs:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
    for tensors in [*held, *in_functions]:
        yield from tensors


def _external_info(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _check_external_reference(tensor: TensorProto, model_dir: Path) -> Path:
    """Resolve a tensor's external file inside ``model_dir``; refuse anything that escapes."""
    info = _external_info(tensor)
    location = info.get("location", "")
    where = f"tensor '{tensor.name}'"
    if tensor.HasField("raw_data") or _has_inline_values(tensor):
        raise InvalidModelError(f"{where} sets both inline data and an external location "
                                f"'{location}'; refusing a crafted or corrupt model")
    if not location:
        raise InvalidModelError(f"{where} is marked external but names no location")
    relative = Path(location)
    if relative.is_absolute() or location.startswith(("/", "\\")) or ".." in relative.parts \
            or ":" in location:
        raise InvalidModelError(f"{where}: external location '{location}' leaves the model's "
                                f"folder; only plain relative names are accepted")
    target = model_dir / relative
    try:
        status = os.lstat(target)
    except OSError as exc:
        raise InvalidModelError(f"{where}: external data file '{location}' not found next to "
                                f"the model ({exc.strerror})") from exc
    if stat.S_ISLNK(status.st_mode):
        raise InvalidModelError(f"{where}: external data file '{location}' is a symbolic "
                                f"link; refusing to follow it")
    if not stat.S_ISREG(status.st_mode):
        raise InvalidModelError(f"{where}: external data '{location}' is not a regular file")
    if status.st_nlink > 1:
        raise InvalidModelError(f"{where}: external data file '{location}' has "
                                f"{status.st_nlink} hard links; refusing a file that may "
                                f"alias one outside the model's folder")
    real_dir = model_dir.resolve()
    if real_dir not in target.resolve().parents:
        raise InvalidModelError(f"{where}: external location '{location}' resolves outside "
                                f"the model's folder")
    for key in ("offset", "length"):
        if key in info and (not info[key].isdigit()):
            raise InvalidModelError(f"{where}: external {key} '{info[key]}' is not a "
                                    f"non-negative integer")
    offset = int(info.get("offset", "0"))
    length = int(info["length"]) if "length" in info else status.st_size - offset
    if offset + length > status.st_size:
        raise InvalidModelError(f"{where}: external data range {offset}+{length} runs past "
                                f"the end of '{location}' ({status.st_size} bytes)")
    return target


def read_external(tensor: TensorProto, model_dir: str | os.PathLike[str]) -> TensorProto:
    """A copy of external ``tensor`` with its bytes read in (as ``raw_data``), from a file
    checked like any external reference (inside ``model_dir``, no links, in range)."""
    source = _check_external_reference(tensor, Path(model_dir))
    info = _external_info(tensor)
    offset = int(info.get("offset", "0"))
    length = int(info["length"]) if "length" in info else os.stat(source).st_size - offset
    with open(source, "rb") as handle:
        handle.seek(offset)
        data = handle.read(length)
    if len(data) != length:
        raise InvalidModelError(f"tensor '{tensor.name}': external data ends early")
    loaded = TensorProto()
    loaded.CopyFrom(tensor)
    del loaded.external_data[:]
    loaded.data_location = TensorProto.DEFAULT
    loaded.raw_data = data
    return loaded


def _has_inline_values(tensor: TensorProto) -> bool:
    return any(len(getattr(tensor, f)) for f in (
        "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"))


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str],
               source_dir: str | os.PathLike[str] | None = None) -> None:
    """Write ``model`` to ``path`` atomically.

    External tensors are copied, in order, from their files under ``source_dir`` into one
    fresh data file next to ``path``, named ``<output file name>.<content hash>.data``, and
    re-pointed at it; inline initializers of 1 KiB or more (weights a pattern repacked)
    join them there, so the ``.onnx`` file stays small. The data file is in place before
    the model file is replaced, so an existing output is never paired with the wrong data;
    the data file the previous output used is removed afterwards if it follows the same
    naming scheme. ``model`` itself is not modified. The output folder must exist.
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise ModelIOError(f"{target}: output folder '{folder}' does not exist; create it "
                           f"first")
    if target.is_dir():
        raise ModelIOError(f"{target}: is a directory; give an output file name")
    out = model
    externals = list(external_tensors(model))
    data_tmp: Path | None = None
    data_name: str | None = None
    stale = _our_data_files(target)
    try:
        if externals:
            if source_dir is None:
                raise ModelIOError("the model has external data but its source folder is "
                                   "unknown; load it with decomposer.load_model")
            out = onnx.ModelProto()
            out.CopyFrom(model)
            data_tmp, data_name = _write_external_data(out, Path(source_dir), folder,
                                                       target.name)
        payload = out.SerializeToString(deterministic=True)
        model_tmp = _write_temp(folder, target.name, [payload])
        try:
            if data_tmp is not None and data_name is not None:
                os.replace(data_tmp, folder / data_name)
                data_tmp = None
            os.replace(model_tmp, target)
        except BaseException:
            model_tmp.unlink(missing_ok=True)
            raise
        for old in stale:
            if old.name != data_name:
                old.unlink(missing_ok=True)
    except OSError as exc:
        raise ModelIOError(f"{target}: cannot write: {exc.strerror or exc}") from exc
    except ValueError as exc:  # protobuf refuses to serialize > 2 GiB inline
        raise ModelIOError(f"{target}: cannot serialize the model: {exc}") from exc
    finally:
        if data_tmp is not None:
            data_tmp.unlink(missing_ok=True)


def _data_file_pattern(model_name: str) -> re.Pattern[str]:
    return re.compile(re.escape(model_name) + r"\.[0-9a-f]{16}\.data")


def _our_data_files(target: Path) -> list[Path]:
    """Data files an existing output at ``target`` points to that decomposer named."""
    pattern = _data_file_pattern(target.name)
    candidates = target.parent.glob(f"{glob.escape(target.name)}.*.data")
    if not target.is_file() or not any(pattern.fullmatch(path.name) for path in candidates):
        return []  # nothing of ours to clean up: spare parsing the previous output
    try:
        previous = onnx.ModelProto.FromString(target.read_bytes())
    except Exception:  # not ours to understand: leave everything alone
        return []
    names = {_external_info(t).get("location", "") for t in external_tensors(previous)}
    return [target.parent / name for name in sorted(names) if pattern.fullmatch(name)]


def _file_mode() -> int:
    """What a plainly created file gets (0666 less the umask); mkstemp would give 0600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _write_temp(folder: Path, name: str, chunks: list[bytes]) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.fchmod(fd, _file_mode())
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _write_external_data(model: onnx.ModelProto, source_dir: Path, folder: Path,
                         model_name: str) -> tuple[Path, str]:
    """Copy every external tensor into a fresh temp data file and re-point the tensors.

    Returns the temp file and the name it must get: ``<model_name>.<id>.data``. The id
    hashes the tensor table and the identity of the source files (path, size, mtime,
    inode): the same input gives the same name, so a re-run replaces the file instead of
    adding one, while changed weights get a new name and an existing output never points
    at half-replaced data. Bytes move with ``copy_file_range`` (in-kernel, reflinked where
    the filesystem can), falling back to a buffered copy.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{model_name}.", suffix=".data.tmp", dir=folder)
    os.fchmod(fd, _file_mode())
    tmp_path = Path(tmp)
    identity = hashlib.sha256()
    placeholder = model_name + ".0000000000000000.data"
    position = 0
    try:
        for tensor in external_tensors(model):
            source = _check_external_reference(tensor, source_dir)
            info = _external_info(tensor)
            status = os.stat(source)
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else status.st_size - offset
            aligned = _aligned(position)
            identity.update(repr((tensor.name, source.name, offset, length, status.st_size,
                                  status.st_mtime_ns, status.st_ino)).encode())
            with open(source, "rb") as handle:
                _copy_range(handle.fileno(), offset, fd, aligned, length, tensor.name)
            position = aligned + length
            kept = [(e.key, e.value) for e in tensor.external_data
                    if e.key not in ("location", "offset", "length")]
            del tensor.external_data[:]
            for key, value in [("location", placeholder), ("offset", str(aligned)),
                               ("length", str(length)), *kept]:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        for tensor in _large_inline(model):
            aligned = _aligned(position)
            identity.update(hashlib.sha256(tensor.raw_data).digest())
            view = memoryview(tensor.raw_data)
            while view:  # pwrite may write less than asked (at most ~2 GiB per call)
                view = view[os.pwrite(fd, view, aligned + len(tensor.raw_data) - len(view)):]
            position = aligned + len(tensor.raw_data)
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in [("location", placeholder), ("offset", str(aligned)),
                               ("length", str(position - aligned))]:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        os.ftruncate(fd, position)
        os.fsync(fd)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    data_name = f"{model_name}.{identity.hexdigest()[:16]}.data"
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_name
    return tmp_path, data_name


def _aligned(position: int) -> int:
    """The 4 KiB alignment onnx uses, so memory-mapping readers stay fast."""
    return (position + 4095) // 4096 * 4096


def _large_inline(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Initializers held inline in ``raw_data`` of at least ``LARGE_INLINE`` bytes, in model
    order."""
    for graph in all_graphs(model.graph):
        for tensor in graph.initializer:
            if len(tensor.raw_data) >= LARGE_INLINE:
                yield tensor


def _copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, length: int,
                tensor_name: str) -> None:
    """Copy ``length`` bytes between file offsets, in the kernel when it can."""
    copied = 0
    use_kernel = hasattr(os, "copy_file_range")
    while copied < length:
        count = min(length - copied, _WRITEBACK_CHUNK)
        done = 0
        if use_kernel:
            try:
                done = os.copy_file_range(src_fd, dst_fd, count, src_offset + copied,
                                          dst_offset + copied)
            except OSError:  # e.g. EXDEV on old kernels, or an unsupported filesystem
                use_kernel = False
        if not use_kernel:
            chunk = os.pread(src_fd, min(count, _COPY_CHUNK), src_offset + copied)
            done = os.pwrite(dst_fd, chunk, dst_offset + copied) if chunk else 0
        if done == 0:
            raise ModelIOError(f"external data for tensor '{tensor_name}' ends early")
        if hasattr(os, "posix_fadvise"):
            # Start writing this chunk to disk now (without waiting), so the final fsync
            # overlaps with the copy instead of following it.
            os.posix_fadvise(dst_fd, dst_offset + copied, done, os.POSIX_FADV_DONTNEED)
        copied += done
