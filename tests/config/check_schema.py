"""Validates the shipped configs, and the resolved config moe-train prints for each, against
configs/schema.json. Exit 77 (ctest SKIP) when the jsonschema package is missing."""
import json
import pathlib
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    print("jsonschema not installed: skipping")
    sys.exit(77)

binary, configs_dir = sys.argv[1], pathlib.Path(sys.argv[2])
schema = json.loads((configs_dir / "schema.json").read_text())
jsonschema.Draft7Validator.check_schema(schema)
validator = jsonschema.Draft7Validator(schema)
failures = 0
for path in sorted(configs_dir.glob("*.json")):
    if path.name == "schema.json" or path.name.startswith("grafana"):
        continue
    for label, doc in [("file", json.loads(path.read_text()))] + [
        ("resolved", json.loads(subprocess.run([binary, "config", "show", "--config", str(path)],
                                                check=True, capture_output=True, text=True).stdout))]:
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        for e in errors:
            print(f"{path.name} ({label}): {'/'.join(map(str, e.path))}: {e.message}")
        failures += len(errors)
    print(f"{path.name}: checked")
sys.exit(1 if failures else 0)
