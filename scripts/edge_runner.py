"""Run one ONNX model on an edge inference engine, in a subprocess (a converter or engine
crash stays there), in this interpreter when the engine is installed here, else in the
engine's own venv (``$EDGE_ENGINES_DIR/ENGINE/venv``, default /work/engines: RKNN's pins
need one; ../shared/engines.md says how each installs).

CLI, under the engine's interpreter:
    python edge_runner.py ENGINE MODEL.onnx FEEDS.npz OUT.npz
  ENGINE     opencv | ncnn | mnn | tract | rknn
  FEEDS.npz  one array per graph input, keyed by the graph input's name
  OUT.npz    the outputs in graph-output order, keyed out0, out1, ...
  Exit 0 on success (nothing on stdout). On any failure: exactly one line
  "ERROR: <the engine's own message>" on stdout, exit 2. Converter logs are read:
  a converter that exits 0 but reports dropped/unsupported ops is a failure.

Library, from any Python with numpy (e.g. the project venv):
    run(engine, model_path, feeds: dict[str, np.ndarray], timeout=600.0) -> list[np.ndarray]
  runs the CLI in a subprocess of the engine's interpreter in a temp dir and returns the
  outputs in graph-output order; raises RuntimeError(one_line) on failure, on
  timeout ("timed out after N s") or on a crash ("crashed (signal 11)").
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import numpy as np

ENGINES = ("opencv", "ncnn", "mnn", "tract", "rknn")
ENGINES_DIR = os.environ.get("EDGE_ENGINES_DIR", "/work/engines")
HERE = os.path.abspath(__file__)

# Log lines that mean "the model was not (fully) converted", even when the tool exits 0.
FAIL_MARKERS = tuple(re.compile(p) for p in (
    r"These Op Not Support",          # MNN converter, exits 0
    r"Don't support",                 # MNN converter, exits 0
    # pnnx drops an op's param ("ignore OP NAME param K=V") and goes on
    r"^ignore \S+ \S+ param ",
    r"not exists or registered",      # ncnn load_param: "layer X not exists or registered"
    r"Unsupported operations:",       # OpenCV readNetFromONNX (stderr)
))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# run-varying prefixes, dropped so that one failure reads the same every run:
# MNN "[20:11:58] :220: ", OpenCV "[ WARN:0@0.009] global onnx_importer2.cpp:793 parseModel "
NOISE = re.compile(r"^\[\d\d:\d\d:\d\d\] :\d+: |^\[ ?\w+:\d+@[\d.]+\] (global \S+:\d+ \w+ )?")
FAILISH = re.compile(r"error|fail|not support|unsupport", re.I)


class EngineError(Exception):
    pass


# ---------------------------------------------------------------- driver (any venv)

def run(engine, model_path, feeds, timeout=600.0):
    """Run model_path on engine in its venv; outputs in graph-output order."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}, expected one of {ENGINES}")
    py = python_for(engine)
    if py is None:
        raise RuntimeError(f"{engine} is not installed (no {ENGINES_DIR}/{engine}/venv, and "
                           f"pip install {PACKAGES[engine]} here)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["RUST_BACKTRACE"] = "0"  # tract: keep its error to the message, no Rust backtrace
    with tempfile.TemporaryDirectory(prefix=f"edge-{engine}-") as tmp:
        if engine == "mnn":
            # MNN's Python tools `pip install -U aliyun-log-python-sdk` on import with the
            # first pip on PATH (protobuf<6: breaks onnx 1.23). The runner never imports
            # them, and a pip that refuses comes first on PATH anyway.
            env["PATH"] = _refusing_pip(tmp) + os.pathsep + env.get("PATH", "")
        fin, fout = os.path.join(tmp, "feeds.npz"), os.path.join(tmp, "out.npz")
        np.savez(fin, **{k: np.asarray(v) for k, v in feeds.items()})
        cmd = [py, HERE, engine, os.path.abspath(model_path), fin, fout]
        # own session: on timeout the whole group (pnnx, mnnconvert children too) is killed
        p = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, errors="replace", start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise RuntimeError(f"timed out after {timeout:g} s") from None
        if p.returncode < 0:
            raise RuntimeError(f"crashed (signal {-p.returncode})")
        if p.returncode != 0:
            line = next((ln[7:] for ln in out.splitlines() if ln.startswith("ERROR: ")), None)
            raise RuntimeError(line or _one_line(err) or f"exit code {p.returncode}")
        with np.load(fout) as z:
            return [z[f"out{i}"] for i in range(len(z.files))]


# ---------------------------------------------------------------- helpers

PACKAGES = {"opencv": "opencv-python-headless", "ncnn": "ncnn pnnx", "mnn": "mnn",
            "tract": "tract", "rknn": "rknn-toolkit2 (its own venv: ../shared/engines.md)"}
_MODULES = {"opencv": "cv2", "ncnn": "pnnx", "mnn": "MNN", "tract": "tract", "rknn": "rknn"}


def python_for(engine):
    """The interpreter that runs ``engine``: this one if the engine imports here (the test
    extra installs OpenCV, ncnn with pnnx, MNN and tract beside decomposer), else its own
    venv under ENGINES_DIR (RKNN's pins need one), else None."""
    import importlib.util

    if importlib.util.find_spec(_MODULES[engine]):
        return sys.executable
    own = os.path.join(ENGINES_DIR, engine, "venv", "bin", "python")
    return own if os.path.exists(own) else None


def _refusing_pip(folder):
    """A folder of pip commands that refuse to install anything."""
    path = os.path.join(folder, "nopip")
    os.makedirs(path, exist_ok=True)
    for name in ("pip", "pip3", f"pip3.{sys.version_info.minor}"):
        tool = os.path.join(path, name)
        with open(tool, "w") as f:
            f.write("#!/bin/sh\necho 'pip refused (decomposer edge runner)' >&2\nexit 1\n")
        os.chmod(tool, 0o755)
    return path


def _one_line(text, exc=None):
    """The single most informative line of an engine log (+ exception text)."""
    lines = [NOISE.sub("", ANSI.sub("", ln).strip()) for ln in (text or "").splitlines()]
    lines = [ln for ln in lines if ln]
    for m in FAIL_MARKERS:
        for i, ln in enumerate(lines):
            if m.search(ln):
                # "Unsupported operations:" / "These Op Not Support:" list the ops on the next line
                if ln.rstrip().endswith(":") and i + 1 < len(lines):
                    return f"{ln} {lines[i + 1]}"
                return ln
    # RKNN logs "E <api>: <message>" before raising a traceback-shaped exception
    for ln in lines:
        m = re.match(r"E (\w+: .*)", ln)
        if m and "rknn-toolkit2 version" not in ln and "Traceback" not in ln:
            return m.group(1)
    if exc is not None:
        msg = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        # multi-line messages (RKNN's wrapped traceback) end in "XxxError: text"
        errs = [ln for ln in msg if re.match(r"\w+(Error|Exception): ", ln)]
        if errs:
            return errs[-1]
        if msg:
            return f"{type(exc).__name__}: {msg[0]}"
        return type(exc).__name__
    return next((ln for ln in lines if FAILISH.search(ln)), lines[-1] if lines else "")


def _flush():
    """Flush Python's and C's stdio buffers (C++ iostreams write through the latter)."""
    import ctypes
    sys.stdout.flush(), sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)


def _read(log):
    _flush()
    with open(log, errors="replace") as f:
        return f.read()


@contextmanager
def _capture(path):
    """Send fds 1 and 2 (C++ and Python prints alike) to path; yield the real stdout."""
    _flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
    try:
        yield os.fdopen(os.dup(saved[0]), "w")
    finally:
        _flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])


def _check_log(log):
    lines = [ANSI.sub("", ln).strip() for ln in log.splitlines()]
    if any(m.search(ln) for m in FAIL_MARKERS for ln in lines):
        raise EngineError(_one_line(log))


def _tool(cmd, log_path, cwd, ok_text=None):
    """Run a converter; fail on a bad exit, on a failure marker, or without ok_text."""
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace")
    with open(log_path, "a") as f:
        f.write(p.stdout)
    if p.returncode < 0:  # pnnx segfaults after a failed step: name that step too
        why = _one_line(p.stdout)
        raise EngineError(f"{os.path.basename(cmd[0])} crashed (signal {-p.returncode})"
                          + (f" after: {why}" if FAILISH.search(why) else ""))
    _check_log(p.stdout)
    if p.returncode != 0 or (ok_text and ok_text not in p.stdout):
        raise EngineError(_one_line(p.stdout) or f"{cmd[0]} exit code {p.returncode}")


def _graph_io(model_path):
    """Graph input names (no initializers) and, per output, (name, static shape or None)."""
    import onnx
    m = onnx.load(model_path, load_external_data=False)
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:
        pass
    inits = {t.name for t in m.graph.initializer}
    ins = [i.name for i in m.graph.input if i.name not in inits]
    outs = []
    for o in m.graph.output:
        t = o.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        static = t.HasField("shape") and None not in dims
        outs.append((o.name, tuple(dims) if static else None))
    return ins, outs


# ---------------------------------------------------------------- engines (own venvs)

def _opencv(model, feeds, ins, outs, tmp, log):
    import cv2
    net = cv2.dnn.readNetFromONNX(model)  # may SIGSEGV: hence the subprocess
    _check_log(_read(log))  # unsupported ops are only listed on stderr
    for name in ins:
        net.setInput(feeds[name], name)
    names = list(net.getUnconnectedOutLayersNames())
    res = dict(zip(names, net.forward(names), strict=False))
    # OpenCV 5 names its unconnected outputs after the graph outputs; order them as the graph does
    return [res[n] for n, _ in outs] if all(n in res for n, _ in outs) else list(res.values())


_PNNX_DT = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32", "int64": "i64",
            "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}


def _ncnn(model, feeds, ins, outs, tmp, log):
    import importlib.util
    pnnx_bin = os.path.join(importlib.util.find_spec("pnnx").submodule_search_locations[0], "pnnx")
    tmp = os.path.abspath(tmp)
    src = os.path.join(tmp, "m.onnx")
    os.symlink(model, src)  # pnnx writes m.ncnn.param/.bin, m_ncnn.py, ... beside its input
    # pnnx requires the ONNX's own static shapes (a batch-2 graph cannot be converted at batch 1)
    shape = ",".join(f"[{','.join(map(str, feeds[n].shape))}]{_PNNX_DT[feeds[n].dtype.name]}"
                     for n in ins)
    _tool([pnnx_bin, src, f"inputshape={shape}", "fp16=0"], log, tmp)
    import ncnn
    # pnnx's generated script says which axis of each blob it treated as batch (233 = none)
    py = open(os.path.join(tmp, "m_ncnn.py")).read()
    in_b = dict(re.findall(r'ex\.input\("(in\d+)", ncnn\.Mat\(.*?batch_index=(\d+)\)', py))
    out_b = dict(re.findall(r'(out\d+)\.numpy\(batch_index=(\d+)\)', py))
    net = ncnn.Net()
    # fp16 storage/arithmetic would be compared against ORT's fp32
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    net.opt.use_bf16_storage = False
    rp = net.load_param(os.path.join(tmp, "m.ncnn.param"))
    rm = net.load_model(os.path.join(tmp, "m.ncnn.bin"))
    _check_log(_read(log))  # "layer X not exists or registered"
    if rp or rm:
        raise EngineError(f"ncnn load_param/load_model returned {rp}/{rm}")
    xs = [np.ascontiguousarray(feeds[n]) for n in ins]
    batched = [in_b.get(f"in{i}") == "0" for i in range(len(xs))]
    nb = max([x.shape[0] for x, b in zip(xs, batched, strict=False) if b] or [1])
    per_sample = nb > 1 and all(out_b.get(f"out{j}") == "0" for j in range(len(outs)))
    # ncnn has no batch axis: a batch > 1 runs one sample at a time and is stacked
    runs = []
    for s in (range(nb) if per_sample else [None]):
        ex = net.create_extractor()
        for i, (x, b) in enumerate(zip(xs, batched, strict=False)):
            a = x[s:s + 1] if s is not None and b else x
            ex.input(f"in{i}", ncnn.Mat(a, batch_index=int(in_b.get(f"in{i}", 233))).clone())
        res = []
        for j in range(len(outs)):
            r, m = ex.extract(f"out{j}")
            if r:
                raise EngineError(f"ncnn extract out{j} returned {r}")
            res.append(m.numpy(batch_index=int(out_b.get(f"out{j}", 233))).copy())
        runs.append(res)
    return [np.concatenate(r, 0) for r in zip(*runs, strict=False)] if per_sample else runs[0]


def _mnn(model, feeds, ins, outs, tmp, log):
    dst = os.path.join(tmp, "m.mnn")
    # the C++ converter directly: MNN.tools.mnnconvert would import the telemetry logger
    conv = "import sys, _tools; _tools.mnnconvert(sys.argv)"
    _tool([sys.executable, "-c", conv, "-f", "ONNX", "--modelFile", model, "--MNNModel", dst,
           "--bizCode", "MNN"], log, tmp, ok_text="Converted Success")
    import MNN
    F = MNN.expr
    mod = MNN.nn.load_module_from_file(dst, ins, [n for n, _ in outs])
    vs = []
    for n in ins:
        a = feeds[n]
        if a.dtype == np.int64:  # MNN has no int64 tensors: int64 inputs go in as int32
            a = a.astype(np.int32)
        dt = {"int32": F.int, "int8": F.int8, "uint8": F.uint8,
              "float64": F.double}.get(a.dtype.name)
        vs.append(F.const(a, list(a.shape), F.NCHW, dt) if dt
                  else F.const(a, list(a.shape), F.NCHW))
    arrs = []
    for o in mod.forward(vs):
        if o.data_format == F.NC4HW4:  # packed layout of conv outputs: back to NCHW
            o = F.convert(o, F.NCHW)
        arrs.append(np.array(o.read()))
    if len(arrs) != len(outs):  # a failed forward returns [] and only logs why
        raise EngineError(_one_line(_read(log)) or "MNN forward returned no outputs")
    return arrs


def _tract(model, feeds, ins, outs, tmp, log):
    import tract
    dt = {"float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64", "int32": "i32",
          "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}
    m = tract.onnx().load(model)
    names = [m.input_name(i) for i in range(m.input_count())]
    for i, n in enumerate(names):  # facts from the feeds: no symbolic dims left for tract to guess
        a = feeds[n]
        m.set_input_fact(i, ",".join([*map(str, a.shape), dt[a.dtype.name]]))
    # 0.23: into_model() is into_typed() + declutter (there is no "declutter" transform to call)
    r = m.into_model().into_runnable()
    return [o.to_numpy() for o in r.run([feeds[n] for n in names])]


def _rknn(model, feeds, ins, outs, tmp, log):
    from rknn.api import RKNN

    def ok(ret, what):  # RKNN returns non-zero and logs "E what: message" instead of raising
        if ret not in (0, None):
            raise EngineError(_one_line(_read(log)) or f"{what} returned {ret}")

    r = RKNN(verbose=False)
    try:
        ok(r.config(target_platform="rk3588"), "config")
        ok(r.load_onnx(model=model, inputs=ins,
                       input_size_list=[list(feeds[n].shape) for n in ins]),
           "load_onnx")
        ok(r.build(do_quantization=False), "build")
        ok(r.init_runtime(), "init_runtime")  # no target: the x86 simulator
        # inference() takes 4D inputs as NHWC unless told: ours are ONNX's NCHW
        res = r.inference(inputs=[feeds[n] for n in ins], data_format=["nchw"] * len(ins))
        if res is None:
            ok(-1, "inference")
    finally:
        r.release()
    return res


def main(argv):
    if len(argv) != 5 or argv[1] not in ENGINES:
        print(f"usage: {argv[0]} {{{'|'.join(ENGINES)}}} MODEL.onnx FEEDS.npz OUT.npz",
              file=sys.stderr)
        return 64
    engine, model, fin, fout = argv[1], os.path.abspath(argv[2]), argv[3], argv[4]
    tmp = tempfile.mkdtemp(prefix=f"edge-{engine}-work-")
    log = os.path.join(tmp, "engine.log")
    open(log, "w").close()
    # everything the engine prints goes to the log; stdout carries only the ERROR line
    with _capture(log) as stdout:
        rc = _main(engine, model, fin, fout, tmp, log, stdout)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return rc


def _main(engine, model, fin, fout, tmp, log, stdout):
    try:
        with np.load(fin) as z:
            feeds = {k: z[k] for k in z.files}
        ins, outs = _graph_io(model)
        missing = [n for n in ins if n not in feeds]
        if missing:
            raise EngineError(f"feeds lack graph inputs {missing}")
        res = globals()["_" + engine](model, feeds, ins, outs, tmp, log)
        if len(res) != len(outs):
            raise EngineError(f"{engine} returned {len(res)} outputs, graph has {len(outs)}")
        arrs = []
        for a, (_, shp) in zip(res, outs, strict=False):
            a = np.asarray(a)
            # engines drop unit/batch dims (ncnn, RKNN): restore the graph's static shape
            if shp is not None and a.shape != shp and a.size == int(np.prod(shp)):
                a = a.reshape(shp)
            arrs.append(a)
        np.savez(fout, **{f"out{i}": a for i, a in enumerate(arrs)})
        return 0
    except BaseException as e:  # noqa: BLE001 - engines raise anything, SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        msg = str(e) if isinstance(e, EngineError) else _one_line(_read(log), e)
        print("ERROR: " + (" ".join(msg.split()) or type(e).__name__), file=stdout, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
