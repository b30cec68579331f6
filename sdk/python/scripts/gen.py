"""Generates src/agentvm/models.py from ../../api/openapi.yaml with
datamodel-code-generator (pinned in pyproject.toml's "dev" extra), or with
--check fails when the committed file differs from what it would generate
(the drift check the tests run).

    python scripts/gen.py          # rewrite models.py
    python scripts/gen.py --check  # exit 1 if models.py is stale
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SPEC = HERE.parent.parent / "api" / "openapi.yaml"
OUT = HERE / "src" / "agentvm" / "models.py"

# Fixed options, so that the output depends only on the spec and the
# pinned generator: its own formatter (no black/isort versions involved),
# no timestamp, extra fields kept (a newer server's new fields do not
# break an older SDK).
OPTIONS = [
    "--input-file-type", "openapi",
    "--output-model-type", "pydantic_v2.BaseModel",
    "--target-python-version", "3.10",
    "--use-standard-collections",
    "--use-union-operator",
    "--use-double-quotes",
    "--use-schema-description",
    "--enum-field-as-literal", "all",
    "--extra-fields", "allow",
    "--disable-timestamp",
    "--formatters", "builtin",
    "--custom-file-header", "# Generated from api/openapi.yaml by scripts/gen.py (datamodel-code-generator); do not edit.",
]  # fmt: skip


# An enum of the contract is open in the models: Literal["a", "b"] | str.
# The known values type-check, and a value a newer server adds (a new VM
# state, a new image) is taken as a string instead of failing the answer.
LITERAL = re.compile(r"Literal\[[^\[\]]*\]")


def generate(dest: Path) -> None:
    cmd = [sys.executable, "-m", "datamodel_code_generator", "--input", str(SPEC), "--output", str(dest), *OPTIONS]
    subprocess.run(cmd, check=True)
    text = dest.read_text()
    # The rewrite is textual: refuse what it would get wrong, rather than
    # write broken models (a bracket in an enum value; a discriminated
    # union, which an open enum breaks).
    for m in LITERAL.finditer(text):
        values = m.group(0)[len("Literal[") : -1]
        if "[" in values or values.count('"') % 2:
            raise SystemExit(f"scripts/gen.py: an enum value with a bracket, which the open-enum rewrite does not handle: {m.group(0)}")
    if text.count("Literal[") != len(LITERAL.findall(text)):
        raise SystemExit("scripts/gen.py: an enum the open-enum rewrite cannot read (a bracket in a value?)")
    if "discriminator=" in text:
        raise SystemExit("scripts/gen.py: the models have a discriminated union, which open enums would break")
    dest.write_text(LITERAL.sub(lambda m: m.group(0) + " | str", text))


def main() -> int:
    if "--check" not in sys.argv[1:]:
        generate(OUT)
        print(f"wrote {OUT.relative_to(HERE)}")
        return 0
    with tempfile.TemporaryDirectory() as d:
        fresh = Path(d) / "models.py"
        generate(fresh)
        want, have = fresh.read_text(), OUT.read_text() if OUT.exists() else ""
    if want == have:
        print("models.py matches api/openapi.yaml")
        return 0
    diff = difflib.unified_diff(have.splitlines(), want.splitlines(), "models.py (committed)", "models.py (from openapi.yaml)", lineterm="")
    print("\n".join(list(diff)[:80]))
    print("models.py is stale: run python scripts/gen.py", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
