#!/usr/bin/env bash
# The core install, as a user of the library gets it: a bare venv, `pip install .` (no extras, not editable), then
# README's example on tiny-llama. Checks that none of the extras' packages came along, that `import dwg` lists the
# public API, and that the experiment notebooks ship inside the package. Run from the repository (CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
t0=$SECONDS
"$PY" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "${DWG_TORCH:-torch==2.13.0}" 2> >(grep -v "is ignored: it is neither" >&2)
"${pip[@]}" . 2> >(grep -v "is ignored: it is neither" >&2)
echo "check_core_install: installed in $((SECONDS - t0)) s"
py="$work/venv/bin/python"
cd "$work"   # so that `import dwg` is the installed package, not the checkout
"$py" - <<'PY'
import importlib.util, importlib.resources, pydoc
import dwg
extras = [m for m in ("altair", "vl_convert", "papermill", "jupyter", "faker", "nbdev") if importlib.util.find_spec(m)]
assert not extras, f"the core install pulled extras' packages: {extras}"
text = pydoc.render_doc(dwg, renderer=pydoc.plaintext)
missing = [n for n in ("graft", "patch", "GraftPlan", "Rule", "evaluate_plans", "summarize", "attribute", "search", "load")
           if n not in dwg.__all__ or n not in text]
assert not missing, f"help(dwg) does not list {missing}"
notebooks = sorted(p.name for p in (importlib.resources.files("dwg") / "experiments").iterdir() if p.name.endswith(".ipynb"))
assert "graft_positions.ipynb" in notebooks and "figures.ipynb" in notebooks, notebooks
try: dwg.position_chart
except ModuleNotFoundError as e: assert "dwg[plots]" in str(e), e
else: raise AssertionError("dwg.position_chart worked without altair")
print(f"check_core_install: import dwg lists {len(dwg.__all__)} names; {len(notebooks)} experiment notebooks shipped")
PY
sed -n '/^```python$/,/^```$/p' "$OLDPWD/README.md" | sed '1d;$d' > "$work/readme_example.py"
HF_HUB_OFFLINE=1 "$py" readme_example.py
echo "check_core_install: README's example ran on the core install; $((SECONDS - t0)) s in all"
