#!/usr/bin/env bash
# A virtual environment for DataflowRunner (Beam's gcp extra) layered on the main one: it sees every
# package of BASE (a path file adds BASE's site-packages) and holds only what the gcp extra adds.
# Why apart: with the gcp extra installed, every process that imports Beam also imports BigQuery's
# and GCS's clients (0.7 s more per start, measured), and the tests start hundreds of such
# processes; only tests/test_dataflow_graphs.py needs DataflowRunner.
# Usage: infra/setup_dataflow.sh [VENV] [BASE]   (defaults .venv-dataflow and .venv). Idempotent.
set -euo pipefail
venv=${1:-.venv-dataflow}
base=${2:-.venv}
python=${PYTHON:-python3.11}
[ -x "$base/bin/python" ] || { echo "setup_dataflow: $base is missing: run make setup first" >&2; exit 1; }
beam=$("$base/bin/python" -c "import apache_beam; print(apache_beam.__version__)")
stamp="$venv/.shardsmith-dataflow-beam-$beam"
if [ -f "$stamp" ] && "$venv/bin/python" -c "import apache_beam.runners.dataflow.dataflow_runner, google.cloud.dataflow_v1beta3" >/dev/null 2>&1; then
    echo "setup_dataflow: $venv ready (apache-beam[gcp]==$beam)"
    exit 0
fi
[ -x "$venv/bin/python" ] || "$python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$base/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/_shardsmith_base.pth"
"$base/bin/python" -m pip --python "$venv/bin/python" install -q "apache-beam[gcp]==$beam"
"$venv/bin/python" -c "import apache_beam.runners.dataflow.dataflow_runner, google.cloud.dataflow_v1beta3"
touch "$stamp"
echo "setup_dataflow: $venv ready (apache-beam[gcp]==$beam)"
