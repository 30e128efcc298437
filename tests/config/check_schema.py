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
    text = json.loads(path.read_text())
    # a fine-tuning config names a model to start from: resolve it against the published
    # architecture shipped in configs/published (no weights needed to resolve a config)
    base = ["--set", f"model.init_from={configs_dir / 'published/Qwen3-30B-A3B'}"] \
        if text.get("model", {}).get("init_from") else []
    shown = subprocess.run([binary, "config", "show", "--config", str(path), *base], check=True,
                           capture_output=True, text=True).stdout
    for label, doc in [("file", text), ("resolved", json.loads(shown))]:
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        for e in errors:
            print(f"{path.name} ({label}): {'/'.join(map(str, e.path))}: {e.message}")
        failures += len(errors)
    print(f"{path.name}: checked")
sys.exit(1 if failures else 0)
