#!/usr/bin/env bash
# dwg: one entry point. Set-up is idempotent; see ./run_all.sh --help.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${DWG_VENV:-.venv}
PY=${PYTHON:-python3}

usage() {
cat <<'USAGE'
Usage: ./run_all.sh [COMMAND] [OPTIONS]

Commands:
  (none) | run   set up, then run the main job: the embedded-default reproduction (SmolLM2-135M, CPU)
  status         done / corrupt / running / failed / pending runs per stage of every sweep under runs/ (or of one:
                 --runs DIR or --profile NAME), the done runs' summed run time, the executed notebook of each failed run
  results        write a profile's snapshot (docs/snapshots/<profile>/, a CSV per cell) from its runs (--profile P, default
                 embedded; --runs DIR, default runs/<profile>), then regenerate the generated parts of README.md and
                 docs/results.md from the committed snapshots; --check: write nothing, exit 1 where a page differs
  check          compare the verdicts of the runs in --runs DIR with the committed snapshot of their profile (or
                 --profile P's), or with the runs in --against DIR2: a table on the console and in DIR/check.md; exit 0
                 when every verdict is the same, 1 when one differs, 2 when there is nothing to compare
  test           set up, then lint (ruff), run the notebook tests (nbdev_test) and pytest; non-zero exit on any failure
                 (the first time, it byte-compiles the rest of .venv: the tests import far more than the main job)
  setup          only set up: create .venv if missing, install torch==2.13.0 (if no torch) and the project,
                 byte-compile what the main job imports, prepare the embedded model under $DWG_HOME (default
                 ~/.cache/dwg)
  export         nbdev_export: regenerate dwg/ from nbs/ (then check `git status dwg/`)
  lint           ruff format --check and ruff check on the notebooks, tests and scripts (test runs it first)
  bench          run the grafting speed benchmark (python -m dwg.dev.bench)
  docs           set up, install docs/requirements.txt, build the documentation site into site/ (mkdocs --strict);
                 --no-execute shows the tutorials without running them
  help | --help  this text

Options of `run` (the command may be left out: `./run_all.sh --profile smoke` runs it):
  --profile NAME   sweep profile: embedded (default), smoke, methods (grafting vs patching), forms, seeds, regime,
                   regime_small, gemma3 (Gemma 3 270M), breadth, custom, localize, lora, paper (docs/how-to/sweeps.md)
  --sweep FILE     a sweep YAML file instead of a packaged profile
  --runs DIR       where runs are written (default ./runs/<profile>)
  -j, --jobs N     local: run N runs at once (default: the sweep file's jobs:, else 1)
  --slurm          submit the sweep to Slurm instead of running locally (one job array per stage); with --wait,
                   wait for the jobs and print the status; --partition/--time/--mem/--cpus/--gpus/--setup override
                   the sweep file's slurm: section
  --dry-run        expand and check the sweep, run nothing (with --slurm: write the sbatch scripts, submit nothing)
  --notebooks DIR  experiment notebooks to run (default dwg/experiments)
  --no-progress    no progress bar or progress lines
  --accept-model-terms  accept the terms of use of an embedded model that has them (gemma3-270m: the Gemma Terms
                   of Use; the same as DWG_ACCEPT_GEMMA_TERMS=1); the model's prepared checkpoint records it
  --log-every S    without a terminal (logs), print the running runs' progress at most every S seconds (default 60)
  `./run_all.sh run --help` prints the sweep's own help (python -m dwg.pipeline.cli run --help).
Options of `test` go to pytest (e.g. -x, -k NAME); options of `bench` to python -m dwg.dev.bench (see its --help).

Environment: DWG_HOME (model cache), DWG_VENV (venv dir, default .venv), PYTHON (interpreter for the venv, 3.10+),
             DWG_TORCH (torch spec to install when torch is missing, default torch==2.13.0), DWG_PIP=1 (install
             the project with pip instead of uv).
USAGE
}

pip_install() {
  # pip install, quiet, without byte-compiling (compile_job and compile_all do it on every core); drops pip's
  # warnings about configured package locations that do not exist on this machine
  local py=$1; shift
  "$py" -m pip install -q --no-compile --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

project_install() {
  # the project's packages with uv when it installs (it resolves in seconds what takes pip ~45 s), else with pip;
  # torch is already there from pip, so the machine's own torch build is kept. DWG_PIP=1: pip only
  local py=$1; shift
  local uv; uv="$(dirname "$py")/uv"
  if [ -z "${DWG_PIP:-}" ] && { [ -x "$uv" ] || pip_install "$py" uv; }; then
    "$uv" pip install -q --python "$py" "$@" && return
    echo "dwg: uv could not install the project; installing with pip" >&2
  fi
  pip_install "$py" "$@"
}

byte_compile() {
  # the venv's .pyc files, on every core (pip compiles one file at a time: half the set-up on 2 cores), but for the
  # installed packages' own test suites, which nothing imports; like pip it passes over files written for a newer
  # Python (torch ships a few)
  local py=$1 lib skip
  lib=$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  skip=$("$py" -c 'import re, sys; print("^" + re.escape(sys.argv[1]) + "/(.+/)?tests?/")' "$lib")
  "$py" -m compileall -qq -j 0 -x "$skip" "$lib" || true
}

PREPARE="from dwg.science.facts.embedded import prepare_embedded; print('dwg: embedded model at', prepare_embedded())"

compile_job() {
  # the .pyc files of what the main job imports (a third of the venv), written by importing it in two processes, one
  # per core, with bytecode writing on (also where PYTHONDONTWRITEBYTECODE is set); `test` compiles the rest, once.
  # The first process also prepares the embedded model. tests/test_structure.py checks that these imports cover what the
  # main job's notebooks' import statements load
  local py=$1 pid
  env -u PYTHONDONTWRITEBYTECODE HF_HUB_OFFLINE=1 "$py" -c "import dwg.pipeline.train, dwg.science.scoring.evaluate
import transformers.generation, transformers.models.llama.modeling_llama, safetensors.torch
$PREPARE" & pid=$!
  env -u PYTHONDONTWRITEBYTECODE "$py" -c "import dwg.pipeline.cli, dwg.science.pictures.recovery_charts, dwg.science.verdicts.claims
import dwg.science.facts.custom, faker, papermill, nbclient, ipykernel.kernelapp, vl_convert"
  wait "$pid"
}

compile_all() {
  # the rest of the venv's .pyc files (for the tests, which import far more than the main job), once per install
  local stamp="$VENV/.dwg-compiled"
  [ "$(cat "$stamp" 2>/dev/null)" = "$(cat "$VENV/.dwg-installed")" ] && return
  echo "dwg: compiling the rest of $VENV (once)"; byte_compile "$VENV/bin/python"
  cp "$VENV/.dwg-installed" "$stamp"
}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "dwg: creating $VENV"; "$PY" -m venv "$VENV"
  fi
  local py="$VENV/bin/python"
  local stamp="$VENV/.dwg-installed" want
  want=$(cat pyproject.toml | sha256sum | cut -c1-16)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    if ! "$py" -c "import torch" 2>/dev/null; then
      echo "dwg: installing ${DWG_TORCH:-torch==2.13.0}"
      pip_install "$py" "${DWG_TORCH:-torch==2.13.0}"
    fi
    echo "dwg: installing the project (editable, with dev tools)"
    project_install "$py" -e '.[dev]'
    if [ -x "$VENV/bin/uv" ]; then "$VENV/bin/uv" pip check -q --python "$py"; else "$py" -m pip check; fi
    compile_job "$py"
    echo "$want" > "$stamp"
  else
    HF_HUB_OFFLINE=1 "$py" -c "$PREPARE"
  fi
}

LINTED=(nbs tests scripts dwg/experiments docs/stage.py)   # the sources: dwg/ is exported from nbs/
lint() {
  # the formatter and the linter (settings in pyproject.toml: line length, rules, complexity) on the sources
  echo "dwg: ruff format --check and ruff check"
  "$VENV/bin/ruff" format --check -q "${LINTED[@]}" || {
    echo "dwg: run '$VENV/bin/ruff format ${LINTED[*]}', then ./run_all.sh export" >&2; return 1; }
  "$VENV/bin/ruff" check -q "${LINTED[@]}" dwg   # dwg/: what the notebooks export (an import only their tests use)
}

cmd=${1:-run}; [ $# -gt 0 ] && shift
case "$cmd" in
  help|-h|--help) usage ;;
  setup) setup ;;
  export) setup >/dev/null; "$VENV/bin/nbdev_export" ;;
  lint) setup >/dev/null; lint ;;
  test)
    setup; compile_all
    lint
    export HF_HUB_OFFLINE=1
    echo "dwg: nbdev_test"; "$VENV/bin/nbdev_test" --n_workers 1
    "$VENV/bin/nbdev_test" --n_workers 1 --path dwg/experiments   # the experiment notebooks, with their demo defaults
    echo "dwg: pytest"; "$VENV/bin/python" -m pytest -q tests "$@"
    ;;
  bench) setup; HF_HUB_OFFLINE=1 "$VENV/bin/python" -m dwg.dev.bench "$@" ;;
  docs)
    setup
    execute=true
    for a in "$@"; do
      case "$a" in --no-execute) execute=false ;; *) echo "run_all.sh docs: unknown option '$a'"; exit 2 ;; esac
    done
    project_install "$VENV/bin/python" -r docs/requirements.txt
    "$VENV/bin/python" docs/stage.py _build/docs
    t0=$SECONDS
    HF_HUB_OFFLINE=1 NO_MKDOCS_2_WARNING=1 DWG_DOCS_EXECUTE=$execute \
      "$VENV/bin/mkdocs" build --strict --clean -f mkdocs.yml
    echo "dwg: documentation site in site/ (index.html), built in $((SECONDS - t0)) s"
    ;;
  status|results|check)
    setup >/dev/null
    HF_HUB_OFFLINE=1 "$VENV/bin/python" -m dwg.pipeline.cli "$cmd" "$@"
    ;;
  run|-*)
    [ "$cmd" != run ] && set -- "$cmd" "$@"
    setup
    HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} "$VENV/bin/python" -m dwg.pipeline.cli run "$@"   # HF_HUB_OFFLINE=0: hub models may download
    ;;
  *) echo "run_all.sh: unknown command '$cmd'"; usage; exit 2 ;;
esac
