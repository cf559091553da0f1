#!/usr/bin/env bash
# Install minip_learn (editable) into the active Python environment.
#
#   ./install.sh            runtime dependencies
#   ./install.sh test       + pytest, hypothesis, dask.distributed, ruff, import-linter
#   ./install.sh fla        + fla-core, triton, einops (reference feature maps, CPU)
#   ./install.sh docs       + Sphinx, sphinx-gallery, numpydoc, pydata-sphinx-theme
#   ./install.sh bench      + pytest-benchmark, psutil (the benchmarks/ suite)
#   ./install.sh test,docs  several extras
#
# torch comes first, and only when it is missing: a plain "torch" requirement on a
# machine without torch pulls a multi-GB CUDA build from PyPI. By default this installs
# torch==$MINIP_TORCH_VERSION (2.13.0); set MINIP_TORCH_INDEX_URL to a PyTorch wheel
# index (CPU or a CUDA version, as shown by PyTorch's install selector) to choose the
# build, or install the torch you want before running this script.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}
extras=${1:-}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "install.sh: torch not found; installing torch==${MINIP_TORCH_VERSION:-2.13.0}"
    "$PY" -m pip install ${MINIP_TORCH_INDEX_URL:+--index-url "$MINIP_TORCH_INDEX_URL"} \
        "torch==${MINIP_TORCH_VERSION:-2.13.0}"
fi
"$PY" -m pip install -e ".${extras:+[$extras]}"
"$PY" -c "import minip_learn, torch; print('minip_learn', minip_learn.__version__, '| torch', torch.__version__, '| CUDA available:', torch.cuda.is_available())"
