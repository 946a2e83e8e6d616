"""One channel for messages: no module of dwg prints a hand-written `dwg:` / `dwg.<module>:` prefix. Its messages go
through `logging.getLogger(__name__)`, whose one handler (`dwg.pipeline.log`) shows them as `dwg: message`; `print` is
for what a command returns."""

import ast
import re
from pathlib import Path

import dwg

PACKAGE = Path(dwg.__file__).parent
PREFIX = re.compile(r"dwg(\.\w+)*:")  # dwg:, dwg.pipeline.sweep:


def _literal_start(node) -> str:
    "The literal text a string expression starts with (a constant, an f-string, a sum of them); '' if none."
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _literal_start(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_start(node.left)
    return ""


def _writes(func) -> bool:
    "`print(...)`, or a `.write(...)` (tqdm.write, a progress bar's, a stream's)."
    return (isinstance(func, ast.Name) and func.id == "print") or (
        isinstance(func, ast.Attribute) and func.attr == "write"
    )


def prefixed_prints(source: str, name: str) -> list[str]:
    "`name:line` of each print whose first argument starts with a hand-written dwg prefix."
    return [
        f"{name}:{node.lineno}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and _writes(node.func) and node.args
        if PREFIX.match(_literal_start(node.args[0]))
    ]


def test_no_module_prints_a_dwg_prefix():
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in prefixed_prints(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not found, "print with a hand-written prefix (use logging.getLogger(__name__)): " + ", ".join(found)


def test_prefix_check_can_fail():
    "It sees plain strings, f-strings, sums and writes; it leaves results and other prefixes alone."
    source = (
        'print("dwg: preparing")\n'
        'print(f"dwg.pipeline.sweep: {n} runs", file=sys.stderr)\n'
        'tqdm.write("dwg.pipeline.train: " + line)\n'
        'print(f"{k}: {v}")\n'
        'print("dwgx: no")\n'
        "print(table)\n"
        'logger.info("dwg: a logger is not a print")\n'
    )
    assert prefixed_prints(source, "m.py") == ["m.py:1", "m.py:2", "m.py:3"]
