"""The backends a model's forward pass can run on, behind one call: features in, array out.

A *graph* is a torch module taking (input_ids, attention_mask[, token_type_ids]) and
returning the model's output (a sentence embedding, or a cross-encoder's logits). torch
runs it as it is (fp32, bf16 weights, fp16 on CUDA); OpenVINO and ONNX Runtime run an ONNX
export of it, built with `torch.onnx.export` into the cache directory on first start
(never downloaded) and reused after, like the demo LLM.

- OpenVINO's CPU plugin silently runs "f32" models in bf16 on CPUs with AMX unless told:
  `openvino` pins `INFERENCE_PRECISION_HINT` to f32; `openvino-bf16` asks for bf16.
- ONNX Runtime may list another provider (Azure) first: the CPU provider is named.
- `onnx-int8` is ONNX Runtime's dynamic int8 quantisation (no calibration data): opt-in,
  since it moves vectors well below a 0.999 cosine.
"""

from __future__ import annotations

import copy as _copy
import fcntl
import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deployments.backends.runtimes.openvino_import import import_openvino

RUNTIMES = (
    "torch-fp32",
    "torch-bf16",
    "torch-fp16",
    "openvino",
    "openvino-bf16",
    "onnx",
    "onnx-int8",
)
# The extra and the module each runtime needs beyond the project's own dependencies.
EXTRAS = {"openvino": "openvino", "onnx": "onnxruntime"}
# Bumped whenever the export recipe changes, so an old cached graph is not reused.
EXPORT_VERSION = 1

Features = dict[str, np.ndarray]
Forward = Callable[[Features], np.ndarray]


class RuntimeUnavailable(RuntimeError):
    """An explicitly chosen runtime cannot run here; the message is one line."""


def family(runtime: str) -> str:
    return runtime.split("-")[0]


def installed(runtime: str) -> bool:
    module = EXTRAS.get(family(runtime))
    return module is None or importlib.util.find_spec(module) is not None


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX-512 bf16 or AMX); without it torch and
    OpenVINO emulate bf16, slower than fp32."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(flags.split(":", 1)[-1].split())


def check_available(runtime: str, device: str) -> None:
    """Raise `RuntimeUnavailable` (one line, naming the field) when `runtime` cannot run."""
    if runtime not in RUNTIMES:
        raise RuntimeUnavailable(f"runtime: {runtime!r} is not one of {', '.join(RUNTIMES)}")
    if runtime == "torch-fp16" and not device.startswith("cuda"):
        raise RuntimeUnavailable(
            "runtime: torch-fp16 needs a GPU (this replica runs on the CPU); give the "
            "deployment num_gpus, or choose torch-fp32, torch-bf16, openvino, onnx or auto"
        )
    if not installed(runtime):
        extra = family(runtime)
        raise RuntimeUnavailable(
            f"runtime: {runtime} needs the '{extra}' extra, which is not installed: "
            f"pip install 'tributary[{extra}]' (or choose runtime: auto, which skips it)"
        )


def auto_candidates(device: str) -> list[str]:
    """What `auto` tries on this hardware, reference first. Quantised runtimes never."""
    if device.startswith("cuda"):
        return ["torch-fp32", "torch-fp16"]
    names = ["torch-fp32"]
    if cpu_has_bf16():
        names.append("torch-bf16")
    if installed("openvino"):
        names.append("openvino")
        if cpu_has_bf16():
            names.append("openvino-bf16")
    if installed("onnx"):
        names.append("onnx")
    return names


def build_forward(
    runtime: str,
    graph: torch.nn.Module,
    input_names: list[str],
    device: str,
    threads: int,
    cache_dir: Path,
    digest: str | None = None,
    streams: int = 1,
) -> Forward:
    """A forward pass of `graph` (an fp32 module, left unchanged) on `runtime`; `digest`
    is `graph_key(graph)` where the caller already has it (it reads every weight).
    `streams`: how many passes may call it at once, from as many threads, sharing
    `threads` between them (torch takes each calling thread's own thread count)."""
    check_available(runtime, device)
    if family(runtime) == "torch":
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
            runtime.split("-")[1]
        ]
        return TorchForward(graph, device, dtype, copy=dtype != torch.float32)
    onnx_path = export_onnx(graph, input_names, cache_dir, digest)
    if runtime.startswith("openvino"):
        precision = "bf16" if runtime.endswith("bf16") else "f32"
        return openvino_forward(onnx_path, precision, threads, streams)
    if runtime == "onnx-int8":
        onnx_path = quantized_onnx(onnx_path)
    return onnxruntime_forward(onnx_path, max(1, threads // max(1, streams)))


class TorchForward:
    """torch on `device` in `dtype`; `copy` leaves the given graph as it was (so fp32 and
    bf16 can be measured side by side), else it is cast in place."""

    def __init__(
        self, graph: torch.nn.Module, device: str, dtype: torch.dtype, copy: bool = True
    ) -> None:
        if copy:
            graph = _copy.deepcopy(graph)
        if dtype != torch.float32:
            graph = graph.to(dtype=dtype)
        self.graph = graph.eval()
        self.device = device

    def __call__(self, features: Features) -> np.ndarray:
        tensors = {k: torch.from_numpy(v).to(self.device) for k, v in features.items()}
        with torch.inference_mode():
            out = self.graph(**tensors)
        return out.float().cpu().numpy()


# OpenVINO's CPU plugin keeps what it built for each input shape it has seen, and MiniLM's
# shapes are (rows, padded length): hundreds in a day of serving. Each costs ~1.5 MiB that is
# never given back (measured: +1.5 GiB over 1,056 shapes; the plugin's default keeps 5,000).
# 64 holds that flat (+246 MiB after 1,056 shapes, none of it after the 400th). On a harsh
# mix, 594 shapes in 1,500 passes, the mean pass took 7 % longer than with the unbounded
# cache, where none at all took 1.6x (bench/openvino_shapes.py, docs/backends.md).
SHAPE_CACHE_ENTRIES = 64
# Beneath it, the plugin's oneDNN keeps every kernel it built in a cache of its own, 1,024 by
# default, whatever the capacity above: after a replica's memory probe, 1,500 passes of
# serving-like shapes grew the process +289 MiB with it and +76 with 64, the mean pass no
# slower (docs/benchmarks.md, "oneDNN's kernel cache"). oneDNN reads the variable when its
# cache is first made, so it is set before the first compile; one set by the user stands.
ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_KERNELS = 64

# Padded lengths are rounded up to a multiple of this (the added tokens masked out, so no
# output changes): an encoder's shapes are (rows, longest text), hundreds under a mixed load,
# and past SHAPE_CACHE_ENTRIES each new one is built again. On an AMX Xeon, 900 passes of
# rows 1-16 and lengths 8-60 (bench/openvino_lengths.py), mean pass at exact lengths / steps
# of 8 / of 16: bf16 26.8 / 23.9 / 21.2 ms; f32, where the padding's compute weighs about
# what the rebuilds saved, 38.8 / 39.5 / 40.1 (docs/backends.md).
LENGTH_STEP = 16
# BERT-like models number positions up to 512: a length is never rounded past it.
LONGEST_ROUNDED = 512


def openvino_forward(
    onnx_path: Path,
    precision: str,
    threads: int,
    streams: int = 1,
    shape_cache: int | None = SHAPE_CACHE_ENTRIES,
    length_step: int = LENGTH_STEP,
) -> OpenVinoForward:
    """`shape_cache`: the input shapes whose builds the plugin keeps; None leaves the
    plugin's own default (bench/openvino_shapes.py compares them). `length_step`: what
    padded lengths are rounded up to a multiple of (bench/openvino_lengths.py)."""
    os.environ.setdefault(ONEDNN_CACHE_VARIABLE, str(ONEDNN_KERNELS))
    ov = import_openvino()
    core = ov.Core()
    # OpenVINO keeps the compiled model beside the export and reloads it next start
    # (~0.1 s instead of ~0.4 s to read and compile MiniLM); it keys the blob by the
    # file, the device, this config and its own version, and recompiles on a miss.
    core.set_property({"CACHE_DIR": str(onnx_path.parent / "openvino-cache")})
    properties: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": max(1, threads),
        # One stream per pass in flight, the threads split between them: with
        # several, each pass runs on its own cores instead of waiting for the other.
        "NUM_STREAMS": max(1, streams),
        "PERFORMANCE_HINT": "LATENCY" if streams <= 1 else "THROUGHPUT",
    }
    if shape_cache is not None:
        properties["CPU_RUNTIME_CACHE_CAPACITY"] = shape_cache
    compiled = core.compile_model(str(onnx_path), "CPU", properties)
    return OpenVinoForward(compiled, properties, length_step)


def rounded_length(features: Features, step: int = LENGTH_STEP) -> Features:
    """`features` padded along the length to a multiple of `step`, the added tokens
    masked out (attention_mask 0); as they are without an attention mask."""
    mask = features.get("attention_mask")
    if mask is None or mask.ndim != 2:
        return features
    length = mask.shape[1]
    wanted = min(-(-length // step) * step, max(length, LONGEST_ROUNDED))
    if wanted == length:
        return features
    pad = ((0, 0), (0, wanted - length))
    return {name: np.pad(v, pad) if v.ndim == 2 else v for name, v in features.items()}


class OpenVinoForward:
    """A compiled OpenVINO model as a forward pass, callable from several threads at once.
    `properties`: what it was compiled with (the plugin does not read them all back);
    `length_step`: what padded lengths are rounded up to a multiple of."""

    def __init__(self, compiled: Any, properties: dict[str, Any], length_step: int) -> None:
        self.compiled = compiled
        self.properties = properties
        self.length_step = length_step
        # An infer request serves one call at a time: one per calling thread.
        self._requests = threading.local()
        self._wanted = {name for port in compiled.inputs for name in port.get_names()}

    def __call__(self, features: Features) -> np.ndarray:
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self.compiled.create_infer_request()
        fed = {k: v for k, v in features.items() if k in self._wanted}
        wanted = rounded_length(fed, self.length_step)
        result = request.infer(wanted)
        output = np.asarray(result[self.compiled.output(0)], dtype=np.float32)
        rows = len(next(iter(features.values())))
        if len(output) != rows:
            # Seen under an address-space limit: the output could not grow, and the last
            # pass's (smaller) one came back. Said as what it is, so the pass is split.
            raise RuntimeError(
                f"OpenVINO failed to allocate its output: {len(output)} rows for {rows} inputs"
            )
        return output


def onnxruntime_forward(onnx_path: Path, threads: int) -> Forward:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    # Named explicitly: the first provider ONNX Runtime lists may be a remote one.
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}

    def forward(features: Features) -> np.ndarray:
        feeds = {k: v for k, v in features.items() if k in wanted}
        return np.asarray(session.run(None, feeds)[0], dtype=np.float32)

    return forward


def export_onnx(
    graph: torch.nn.Module, input_names: list[str], cache_dir: Path, digest: str | None = None
) -> Path:
    """The ONNX export of `graph`, built into `cache_dir` once (per weights and recipe)."""
    key = digest or graph_key(graph)
    target = cache_dir.expanduser() / "graphs" / f"{type(graph).__name__}-{key}"
    path = target / "model.onnx"
    if path.is_file():
        return path
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several replicas may start at once: one exports, the others wait and reuse it.
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            try:
                _export(graph, input_names, staging / "model.onnx")
                staging.rename(target)  # atomic: a reader sees all of it or none
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return path


def quantized_onnx(onnx_path: Path) -> Path:
    """ONNX Runtime's dynamic int8 quantisation of an export, next to it. (Its
    `reduce_range`, advised for CPUs without VNNI, measured far worse on one: docs.)"""
    target = onnx_path.with_name("model.int8.onnx")
    if target.is_file():
        return target
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with (onnx_path.parent / ".int8.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            staging = onnx_path.with_name(".model.int8.partial.onnx")
            quantize_dynamic(
                str(onnx_path),
                str(staging),
                weight_type=QuantType.QInt8,
            )
            staging.rename(target)
    return target


def _export(graph: torch.nn.Module, input_names: list[str], path: Path) -> None:
    # A padded row in the example, so no "mask is all ones" shortcut is traced in.
    mask = torch.ones((2, 8), dtype=torch.long)
    mask[1, 5:] = 0
    values = {"input_ids": torch.full((2, 8), 1000, dtype=torch.long), "attention_mask": mask}
    example = tuple(values.get(name, torch.zeros_like(mask)) for name in input_names)
    axes = {name: {0: "batch", 1: "tokens"} for name in input_names}
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter warns that it is the old one; it is the one that
        # needs no extra package (the torch.export one needs onnxscript).
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph.eval(),
            example,
            str(path),
            input_names=input_names,
            output_names=["output"],
            dynamic_axes={**axes, "output": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )


def graph_key(graph: torch.nn.Module) -> str:
    """A digest of the graph's weights and the export recipe: new weights, new export."""
    digest = hashlib.sha256(f"{EXPORT_VERSION}:{torch.__version__}".encode())
    for name, tensor in graph.state_dict().items():
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        # The first 1,024 values (4 KiB as fp32), without copying the whole tensor first.
        digest.update(tensor.detach().reshape(-1)[:1024].float().cpu().numpy().tobytes())
        # A sum over every value, in numpy's fixed (pairwise) order: torch's parallel sum
        # rounds differently with the thread count, which gave one model two digests
        # (and two exports) in replicas with different torch_threads.
        values = tensor.detach().float().cpu().numpy()
        digest.update(str(float(np.sum(values, dtype=np.float64))).encode())
    return digest.hexdigest()[:16]
